//! The report of `dlm-vs-swap`: tables, summary figures, plot and notes from its runs.

use std::time::Duration;

use serde_json::json;

use super::{local_bytes, Config, Fate, Footprint, Run, ARRAYS};
use crate::paging::TICK;
use crate::{human_bytes, ratio, Censored, Plot, Report, Summary, Table};

/// What the report needs to know about the run besides the runs themselves.
pub(super) struct Facts {
    pub n: usize,
    pub iterations: usize,
    pub reps: usize,
    pub total: usize,
    pub budget: Duration,
    pub ratios: Vec<usize>,
    pub footprint: Footprint,
    /// The zram device as set up (device, algorithm, size).
    pub zram: String,
    /// Where the disk swap file was.
    pub disk_swap_dir: String,
}

/// One ratio between two configurations' loop times: of their medians, its censoring, and
/// the extremes of the per-repetition ratios (repetition k of one against repetition k of the
/// other, run seconds apart).
struct Compared {
    median_ratio: f64,
    censored: Option<Censored>,
    paired: Summary,
}

fn compare(a: &[Run], b: &[Run], budget: Duration) -> Compared {
    let secs = |rs: &[Run]| rs.iter().map(|r| r.secs(budget)).collect::<Vec<_>>();
    let cut = |rs: &[Run]| rs.iter().any(|r| r.fate == Fate::OverBudget);
    let paired: Vec<f64> = a.iter().zip(b).map(|(x, y)| ratio(x.secs(budget), y.secs(budget))).collect();
    Compared {
        median_ratio: ratio(median(&secs(a)), median(&secs(b))),
        censored: Censored::of_ratio(cut(a), cut(b)),
        paired: Summary::of(&paired),
    }
}

/// The median loop time; NaN when no run finished (all OOM-killed: no time, so no ratio, never
/// 0 s).
fn median(secs: &[f64]) -> f64 {
    let s = Summary::of(secs);
    if s.n == 0 {
        f64::NAN
    } else {
        s.median
    }
}

/// `key` with its censoring and the extremes of the paired ratios (`key_min`, `key_max`).
fn figure_with_spread(report: &mut Report, key: &str, c: &Compared) {
    report.figure_censored(key, c.median_ratio, c.censored);
    if c.paired.n > 1 {
        report.figure(&format!("{key}_min"), c.paired.min);
        report.figure(&format!("{key}_max"), c.paired.max);
    }
}

/// A ratio cell: the ratio of medians, '≥'/'≤' when it is a bound, and the paired extremes.
fn ratio_cell(c: &Compared) -> String {
    let bound = Censored::mark(c.censored);
    if c.paired.n > 1 {
        format!("{bound}{:.3} [{:.3}–{:.3}]", c.median_ratio, c.paired.min, c.paired.max)
    } else {
        format!("{bound}{:.3}", c.median_ratio)
    }
}

/// A time cell: median [min–max], '>' when runs hit the budget, "(k OOM-killed)" when the
/// group's OOM killer killed k runs (left out of the median).
fn time_cell(rs: &[Run], budget: Duration) -> String {
    let s = Summary::of(&rs.iter().map(|r| r.secs(budget)).collect::<Vec<_>>());
    let ooms = rs.iter().filter(|r| r.fate == Fate::OomKilled).count();
    let over = rs.iter().any(|r| r.fate == Fate::OverBudget);
    let base = if s.n == 0 { "—".to_string() } else { s.display(3) };
    format!(
        "{base}{}{}",
        if over { " >" } else { "" },
        if ooms > 0 { format!(" ({ooms} OOM-killed)") } else { String::new() }
    )
}

pub(super) fn report(f: &Facts, configs: &[Config], runs: &[Vec<Run>]) -> Report {
    let budget = f.budget;
    let idx = |c: Config| configs.iter().position(|&x| x == c).expect("configured");
    let local = &runs[idx(Config::Local)];
    let local_median = median(&local.iter().map(|r| r.secs(budget)).collect::<Vec<_>>());
    let mut report = Report::default();
    let mut table = Table::new([
        "local memory",
        "all local s",
        "zram swap s",
        "disk swap s",
        "DLM s",
        "DLM / zram",
        "DLM / disk swap",
        "DLM / local",
        "zram / local",
        "disk swap / local",
        "major faults zram / disk",
        "zram pool peak",
        "DLM final unit",
    ]);
    let mut plot = Plot::new("BT-like solver, unmodified", "local memory (% of arrays)", "loop time (s)");
    let (mut zram_pts, mut disk_pts, mut dlm_pts, mut local_pts) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut per_ratio = Report::default();
    for &r in &f.ratios {
        let (zr, dk, dl) = (&runs[idx(Config::Zram(r))], &runs[idx(Config::DiskSwap(r))], &runs[idx(Config::Dlm(r))]);
        let vs_zram = compare(dl, zr, budget);
        let vs_disk = compare(dl, dk, budget);
        let vs_local = compare(dl, local, budget);
        let zram_vs_local = compare(zr, local, budget);
        let disk_vs_local = compare(dk, local, budget);
        let faults =
            |rs: &[Run]| Summary::of(&rs.iter().filter_map(|x| x.majfaults.map(|f| f as f64)).collect::<Vec<_>>());
        let zram_peak = Summary::of(&zr.iter().filter_map(|x| x.zram_peak.map(|b| b as f64)).collect::<Vec<_>>());
        let units: Vec<String> =
            dl.iter().map(|x| x.final_unit().map_or("—".into(), |u| human_bytes(u as u64))).collect();
        table.row([
            format!("{r}% ({})", human_bytes(local_bytes(f.total, r) as u64)),
            time_cell(local, budget),
            time_cell(zr, budget),
            time_cell(dk, budget),
            time_cell(dl, budget),
            ratio_cell(&vs_zram),
            ratio_cell(&vs_disk),
            format!("{:.2}", vs_local.median_ratio),
            format!("{:.2}", zram_vs_local.median_ratio),
            format!("{:.2}", disk_vs_local.median_ratio),
            format!("{:.0} / {:.0}", faults(zr).median, faults(dk).median),
            if zram_peak.n == 0 { "—".into() } else { human_bytes(zram_peak.median as u64) },
            units.join(", "),
        ]);
        figure_with_spread(&mut per_ratio, &format!("dlm_vs_zram_time_{r}pct"), &vs_zram);
        figure_with_spread(&mut per_ratio, &format!("dlm_vs_swap_time_{r}pct"), &vs_disk);
        per_ratio.figure_censored(&format!("dlm_vs_local_time_{r}pct"), vs_local.median_ratio, vs_local.censored);
        per_ratio.figure_censored(
            &format!("zram_vs_local_time_{r}pct"),
            zram_vs_local.median_ratio,
            zram_vs_local.censored,
        );
        per_ratio.figure_censored(
            &format!("swap_vs_local_time_{r}pct"),
            disk_vs_local.median_ratio,
            disk_vs_local.censored,
        );
        if zram_peak.n > 0 {
            per_ratio.figure(&format!("zram_pool_peak_bytes_{r}pct"), zram_peak.median as u64);
        }
        let med = |rs: &[Run]| median(&rs.iter().map(|x| x.secs(budget)).collect::<Vec<_>>());
        zram_pts.push((r as f64, med(zr)));
        disk_pts.push((r as f64, med(dk)));
        dlm_pts.push((r as f64, med(dl)));
        local_pts.push((r as f64, local_median));
    }
    // The headline figures first: at the smallest share of local memory.
    let smallest = *f.ratios.iter().min().expect("ratios");
    let (zr, dk, dl) =
        (&runs[idx(Config::Zram(smallest))], &runs[idx(Config::DiskSwap(smallest))], &runs[idx(Config::Dlm(smallest))]);
    figure_with_spread(&mut report, "dlm_vs_zram_time", &compare(dl, zr, budget));
    figure_with_spread(&mut report, "dlm_vs_swap_time", &compare(dl, dk, budget));
    let vs_local = compare(dl, local, budget);
    report.figure_censored("dlm_vs_local_time", vs_local.median_ratio, vs_local.censored);
    report.summary.append(&mut per_ratio.summary);
    let oom_total = runs.iter().flatten().filter(|r| r.fate == Fate::OomKilled).count();
    let fp = &f.footprint;
    report.figure("local_s", local_median);
    report.figure("arrays_bytes", f.total as u64);
    report.figure("program_overhead_bytes", fp.beyond_arrays());
    report.figure("program_anon_beyond_arrays_bytes", fp.anon_beyond_arrays);
    report.figure("program_kernel_bytes", fp.kernel);
    report.figure("program_peak_usage_beyond_arrays_bytes", fp.peak_usage_beyond_arrays);
    report.figure("swap_stats_refresh_ms", TICK.as_millis() as u64);
    report.figure("swap_runs_oom_killed", oom_total as u64);
    report.figure("zram", f.zram.as_str());
    report.figure("grid_n", f.n as u64);
    report.figure("iterations", f.iterations as u64);
    let (n, reps, iterations) = (f.n, f.reps, f.iterations);
    report.table(
        format!(
            "Loop time, median [min–max] of {reps} interleaved runs; ratios of medians [min–max of the per-repetition \
             ratios] ({n}³ grid, {ARRAYS} malloc'd arrays = {}, {iterations} iterations; DLM: 2 local servers, auto \
             from 128 KiB; {})",
            human_bytes(f.total as u64),
            f.zram
        ),
        table,
    );
    // Per iteration at the smallest ratio: where each configuration spends its time.
    let mut per_it = Table::new(["iteration", "all local s", "zram swap s", "disk swap s", "DLM s"]);
    let median_it = |rs: &[Run], k: usize| {
        let v: Vec<f64> = rs.iter().filter_map(|r| r.out.as_ref()?.iterations.get(k).copied()).collect();
        if v.is_empty() {
            "—".to_string()
        } else {
            format!("{:.3}", Summary::of(&v).median)
        }
    };
    for k in 0..iterations {
        per_it.row([k.to_string(), median_it(local, k), median_it(zr, k), median_it(dk, k), median_it(dl, k)]);
    }
    report.table(format!("Per-iteration time at {smallest}% local memory (median of {reps})"), per_it);
    if let Some(first) = dl.iter().find(|r| !r.decisions.is_empty()) {
        report.table(
            format!("DLM tuner windows at {smallest}% local memory (first run that finished)"),
            super::decisions_table(&first.decisions),
        );
    }
    plot.series("Linux swap on zram (cgroup limit)", zram_pts);
    plot.series("Linux swap on disk (cgroup limit)", disk_pts);
    plot.series("DLM (pagewise run, auto)", dlm_pts);
    plot.series("all local", local_pts);
    report.plots.push(plot);
    let mut data = Vec::new();
    for (i, c) in configs.iter().enumerate() {
        for (rep, run) in runs[i].iter().enumerate() {
            let (kind, r) = match c {
                Config::Local => ("local", 100),
                Config::Zram(r) => ("zram", *r),
                Config::DiskSwap(r) => ("swap", *r),
                Config::Dlm(r) => ("dlm", *r),
            };
            data.push(json!({"config": kind, "ratio": r, "local_bytes": local_bytes(f.total, r), "rep": rep,
                "loop_s": run.out.as_ref().map(|o| o.loop_secs), "iterations_s": run.out.as_ref().map(|o| o.iterations.clone()),
                "wall_s": run.wall, "fate": format!("{:?}", run.fate), "major_faults": run.majfaults,
                "zram_pool_peak_bytes": run.zram_peak, "final_unit": run.final_unit()}));
        }
    }
    report.data = json!(data);
    report.note(format!(
        "`dlm_vs_zram_time` = DLM / Linux swap on zram at {smallest}% local memory, the like-for-like baseline (both keep \
         the pages in RAM: DLM on its servers, zram compressed; below 1: DLM faster); `dlm_vs_swap_time` = DLM / Linux \
         swap on a disk swap file ({}). `_min`/`_max`: the extremes of the per-repetition ratios. The swap limit is \
         memory.limit_in_bytes = DLM's --local-mem plus what the group is charged for beyond the arrays, measured in an \
         all-local run first: {} = {} of other anonymous memory (stack, libc) + {} of kernel memory (page tables); the \
         group's peak usage was {} beyond the arrays, the rest being the kernel's per-CPU charge batches, not added. So \
         the arrays get the same memory in all three. zram's compressed pool is not charged to the group (neither are \
         DLM's servers to DLM's local memory): its peak is in the table. The swap group's memory.stat is read every {} ms \
         during a swap run, so that reclaim sees fresh statistics (crates/eval/src/paging.rs says why). Swappiness and \
         page-cluster are the kernel's defaults. '>' marks runs stopped at the {} s budget (counted as the budget, so a \
         ratio they enter is a bound: ≥ or ≤, and `*_censored` in the summary); 'OOM-killed' runs were killed by the swap \
         group's OOM killer all the same and are left out of the median (no finished run: no ratio). Every finished run \
         printed the same checksum.",
        f.disk_swap_dir,
        human_bytes(fp.beyond_arrays()),
        human_bytes(fp.anon_beyond_arrays),
        human_bytes(fp.kernel),
        human_bytes(fp.peak_usage_beyond_arrays),
        TICK.as_millis(),
        budget.as_secs()
    ));
    report
}
