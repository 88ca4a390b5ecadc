//! The report of `spark-hugepages`: tables, summary figures with their spread, plots and notes.
//!
//! Ratios between configurations are medians of per-repetition ratios (repetition k of one
//! configuration against repetition k of the other: the applications ran one after the other,
//! interleaved), with the extremes of those ratios as `KEY_min`/`KEY_max`.
//!
//! # Hugepages or the heap?
//! part's gain over off is two effects: its blocks are off the Java heap (off's 4 MiB chunks are
//! G1 humongous objects), and they are on hugepages. part-old keeps the blocks off the heap too
//! but gets hugepages late or never, so when part-old's hugepage share stayed low, part-old vs
//! off is the off-heap effect alone and part vs part-old the hugepage effect alone. The share of
//! part's gain that the off-heap effect explains is (off − part-old) / (off − part) per phase
//! ([`off_heap_share`]); above one half (with part-old below half its bytes on hugepages) the
//! table and the summary say the ratio is mostly the off-heap effect
//! (`KEY_mostly_off_heap`), so nobody reads it as a hugepage figure.

use anyhow::Context as _;
use serde_json::json;

use super::{check_results, App, Config, Done, Figures, SPARK_VERSION};
use crate::{human_bytes, ratio, Plot, Report, Summary, Table};

/// What the report needs besides the applications.
pub(super) struct Facts {
    pub sizes: Vec<u64>,
    /// Sizes left out: more than a third of this machine's memory.
    pub skipped: Vec<u64>,
    pub workloads: Vec<&'static str>,
    pub reps: usize,
    pub random_passes: u32,
    pub scan_passes: u32,
    pub kmeans_iters: u32,
    pub executor_mem_mb: u64,
}

/// Below this share of its cached bytes on hugepages, part-old counts as having had none to
/// speak of (its time is the off-heap effect alone).
const PART_OLD_FEW_HUGEPAGES: f64 = 0.5;

/// Below this gain over off (a share of off's time), part gained nothing to explain: a share
/// of a gain within the noise is noise (a quick run on a loaded machine gave part 0.999× off
/// and part-old 0.77×: a "share" of 220).
const LEAST_GAIN: f64 = 0.05;

/// The share of part's gain over off that the off-heap effect explains: (off − part-old) /
/// (off − part), from the three configurations' times of one phase. None when part gained
/// less than [`LEAST_GAIN`] of off's time (no gain to explain). Not clamped: above 1 part-old
/// was faster than part, below 0 it was slower than off.
pub(crate) fn off_heap_share(off: f64, part: f64, part_old: f64) -> Option<f64> {
    let gain = off - part;
    (gain > LEAST_GAIN * off && gain.is_finite() && part_old.is_finite()).then(|| (off - part_old) / gain)
}

/// Whether a ratio part / off is mostly the off-heap effect: part-old had few hugepages and
/// explains more than half of part's gain.
pub(crate) fn mostly_off_heap(share: Option<f64>, part_old_hugepage_share: f64) -> bool {
    part_old_hugepage_share < PART_OLD_FEW_HUGEPAGES && share.is_some_and(|s| s > 0.5)
}

/// One measure of an application's figures (its run time, the time of one phase, …).
type Measure = fn(&Figures) -> f64;

/// Per-repetition ratios a[k] / b[k] of one measure of two configurations.
fn paired(a: &[Figures], b: &[Figures], f: fn(&Figures) -> f64) -> Summary {
    Summary::of(&a.iter().zip(b).map(|(x, y)| ratio(f(x), f(y))).collect::<Vec<_>>())
}

/// `key` = the median of the paired ratios, with `key_min` and `key_max`.
fn paired_figure(report: &mut Report, key: &str, s: Summary) {
    report.figure(key, s.median);
    if s.n > 1 {
        report.figure(&format!("{key}_min"), s.min);
        report.figure(&format!("{key}_max"), s.max);
    }
}

/// A configuration's hugepage bytes over its cached bytes, per repetition.
fn hugepage_shares(figs: &[Figures]) -> Summary {
    Summary::of(&figs.iter().map(|f| f.peak_huge as f64 / f.cached.max(1) as f64).collect::<Vec<_>>())
}

pub(super) fn report(facts: &Facts, configs: &[Config], apps: &[Vec<App>]) -> anyhow::Result<Report> {
    let (reps, random_passes, scan_passes, kmeans_iters, executor_mem_mb) =
        (facts.reps, facts.random_passes, facts.scan_passes, facts.kmeans_iters, facts.executor_mem_mb);
    let max = *facts.sizes.iter().max().context("no size")?;
    let mut report = Report::default();
    let mut table = Table::new([
        "workload",
        "data",
        "config",
        "run s",
        "vs off",
        "cache s",
        "vs off",
        "access s",
        "vs off",
        "hugepage bytes / cached",
        "90% at s (1st pass ends)",
        "peak RSS",
    ]);
    let mut passes = Table::new(["data", "config", "random passes s", "vs off", "scan passes s", "vs off"]);
    let mut split = Table::new([
        "data",
        "phase",
        "part / off",
        "part-old / off",
        "part / part-old",
        "part-old hugepage bytes / cached",
        "off-heap share of part's gain",
        "reading",
    ]);
    let mut data = Vec::new();
    let (off, entire, part, old) = (0, 1, 2, 3);
    for &bytes in &facts.sizes {
        for &workload in &facts.workloads {
            let all: Vec<(Config, &Done)> = configs
                .iter()
                .zip(apps)
                .flat_map(|(&c, rs)| rs.iter().map(move |a| (c, a)))
                .map(|(c, a)| a.done(workload, bytes).map(|d| (c, d)))
                .collect::<anyhow::Result<_>>()?;
            check_results(workload, bytes, &all)?;
            let figs: Vec<Vec<Figures>> = apps
                .iter()
                .map(|rs| rs.iter().map(|a| a.figures(workload, bytes)).collect::<anyhow::Result<_>>())
                .collect::<anyhow::Result<_>>()?;
            let med = |i: usize, f: fn(&Figures) -> f64| Summary::of(&figs[i].iter().map(f).collect::<Vec<_>>());
            let show = |i: usize, f: fn(&Figures) -> f64| med(i, f).display(2);
            let vs_off = |i: usize, f: fn(&Figures) -> f64| paired(&figs[i], &figs[off], f).display(3);
            for (i, c) in configs.iter().enumerate() {
                let last = figs[i].last().expect("reps >= 1");
                table.row([
                    workload.to_string(),
                    human_bytes(bytes),
                    c.name().to_string(),
                    show(i, Figures::run_s),
                    vs_off(i, Figures::run_s),
                    show(i, |f| f.cache_s),
                    vs_off(i, |f| f.cache_s),
                    show(i, Figures::access_s),
                    vs_off(i, Figures::access_s),
                    hugepage_shares(&figs[i]).display(2),
                    format!(
                        "{} ({:.1})",
                        last.reach_s.map_or("never".into(), |t| format!("{t:.1}")),
                        last.first_pass_end_s
                    ),
                    human_bytes(last.peak_rss),
                ]);
                if workload == "micro" {
                    passes.row([
                        human_bytes(bytes),
                        c.name().to_string(),
                        show(i, |f| f.random_s),
                        vs_off(i, |f| f.random_s),
                        show(i, |f| f.scan_s),
                        vs_off(i, |f| f.scan_s),
                    ]);
                }
                data.push(json!({
                    "workload": workload, "bytes": bytes, "config": c.name(),
                    "run_s": figs[i].iter().map(Figures::run_s).collect::<Vec<_>>(),
                    "cache_s": figs[i].iter().map(|f| f.cache_s).collect::<Vec<_>>(),
                    "access_s": figs[i].iter().map(Figures::access_s).collect::<Vec<_>>(),
                    "random_s": figs[i].iter().map(|f| f.random_s).collect::<Vec<_>>(),
                    "scan_s": figs[i].iter().map(|f| f.scan_s).collect::<Vec<_>>(),
                    "kmeans_s": figs[i].iter().map(|f| f.kmeans_s).collect::<Vec<_>>(),
                    "cached_bytes": figs[i].iter().map(|f| f.cached).collect::<Vec<_>>(),
                    "peak_hugepage_bytes": figs[i].iter().map(|f| f.peak_huge).collect::<Vec<_>>(),
                    "peak_rss": figs[i].iter().map(|f| f.peak_rss).collect::<Vec<_>>(),
                    "t_reach_90pct_s": figs[i].iter().map(|f| f.reach_s).collect::<Vec<_>>(),
                    "first_pass_end_s": figs[i].iter().map(|f| f.first_pass_end_s).collect::<Vec<_>>(),
                    "non_local_blocks": figs[i].iter().map(|f| f.non_local).sum::<u64>(),
                }));
            }
            // Hugepages or the heap (module doc), per phase of micro.
            let old_huge = hugepage_shares(&figs[old]).median;
            let phases: [(&str, &str, Measure); 4] = [
                ("run (cache + access)", "part_vs_off_time", Figures::run_s),
                ("cache", "part_vs_off_cache_time", |f| f.cache_s),
                ("random passes", "part_vs_off_random_time", |f| f.random_s),
                ("scan", "part_vs_off_scan_time", |f| f.scan_s),
            ];
            if workload == "micro" {
                for (phase, key, f) in phases {
                    let (o, p, q) = (med(off, f).median, med(part, f).median, med(old, f).median);
                    let share = off_heap_share(o, p, q);
                    let reading = if old_huge >= PART_OLD_FEW_HUGEPAGES {
                        "not separable: part-old got hugepages too"
                    } else if share.is_none() {
                        "part no faster than off (within 5%): no gain to split"
                    } else if mostly_off_heap(share, old_huge) {
                        "mostly the off-heap effect, not hugepages"
                    } else {
                        "mostly hugepages"
                    };
                    split.row([
                        human_bytes(bytes),
                        phase.to_string(),
                        paired(&figs[part], &figs[off], f).display(3),
                        paired(&figs[old], &figs[off], f).display(3),
                        paired(&figs[part], &figs[old], f).display(3),
                        format!("{old_huge:.2}"),
                        share.map_or("—".into(), |s| format!("{s:.2}")),
                        reading.to_string(),
                    ]);
                    if bytes == max {
                        if let Some(s) = share {
                            report.figure(&format!("{key}_off_heap_share"), s);
                        }
                        report.figure(&format!("{key}_mostly_off_heap"), mostly_off_heap(share, old_huge));
                    }
                }
            }
            if bytes != max {
                continue;
            }
            let pf = |report: &mut Report, key: &str, a: usize, b: usize, f: fn(&Figures) -> f64| {
                paired_figure(report, key, paired(&figs[a], &figs[b], f))
            };
            if workload == "micro" {
                pf(&mut report, "part_vs_entire_time", part, entire, Figures::run_s);
                pf(&mut report, "part_vs_off_time", part, off, Figures::run_s);
                pf(&mut report, "part_vs_off_access_time", part, off, Figures::access_s);
                pf(&mut report, "part_vs_off_random_time", part, off, |f| f.random_s);
                pf(&mut report, "part_vs_off_scan_time", part, off, |f| f.scan_s);
                pf(&mut report, "part_vs_off_cache_time", part, off, |f| f.cache_s);
                // part and part-old both keep the blocks outside the Java heap; only hugepages
                // differ between them. part-old vs off: only the heap differs (its chunks get
                // hugepages late or never).
                pf(&mut report, "part_vs_part_old_random_time", part, old, |f| f.random_s);
                pf(&mut report, "part_old_vs_off_cache_time", old, off, |f| f.cache_s);
                pf(&mut report, "entire_vs_off_time", entire, off, Figures::run_s);
                pf(&mut report, "entire_vs_off_random_time", entire, off, |f| f.random_s);
                pf(&mut report, "part_old_vs_off_time", old, off, Figures::run_s);
                paired_figure(&mut report, "part_hugepage_bytes_vs_cached", hugepage_shares(&figs[part]));
                paired_figure(&mut report, "entire_hugepage_bytes_vs_cached", hugepage_shares(&figs[entire]));
                paired_figure(&mut report, "part_old_hugepage_bytes_vs_cached", hugepage_shares(&figs[old]));
                let reach = |i: usize| {
                    let v: Vec<f64> = figs[i].iter().map(|f| f.reach_s.unwrap_or(f64::NAN)).collect();
                    let s = Summary::of(&v);
                    // Null when no repetition reached 90%, and also when some did not: the
                    // median would hide the ones that never did.
                    if s.n == v.len() {
                        json!(s.median)
                    } else {
                        serde_json::Value::Null
                    }
                };
                report.figure("part_hugepage_90pct_s", reach(part));
                report.figure(
                    "part_first_pass_end_s",
                    Summary::of(&figs[part].iter().map(|f| f.first_pass_end_s).collect::<Vec<_>>()).median,
                );
                report.figure("part_old_hugepage_90pct_s", reach(old));
                report.figure("off_micro_run_s", med(off, Figures::run_s).median);
            } else {
                pf(&mut report, "kmeans_part_vs_off_time", part, off, Figures::run_s);
                pf(&mut report, "kmeans_part_vs_entire_time", part, entire, Figures::run_s);
                pf(&mut report, "kmeans_part_vs_off_iterations_time", part, off, |f| f.kmeans_s);
            }
        }
    }
    let jvm: Vec<f64> = apps.iter().flatten().map(|a| a.jvm_start_s).collect();
    report.figure("jvm_start_s", Summary::of(&jvm).median);
    report.figure("repetitions", reps as u64);
    report.table(
        format!("Median [min–max] of {reps} interleaved repetitions; 'vs off': per-repetition ratios to off"),
        table,
    );
    report.table("micro access passes (random: dependent reads in place across each cached block; scan: deserialize every record)", passes);
    if !split.rows.is_empty() {
        report.table(
            "Hugepages or the heap? part's gain over off, split with part-old (off the heap like part, but few or no \
             hugepages)",
            split,
        );
    }
    let mut huge_plot =
        Plot::new("Executors' hugepage bytes over the application (every workload and size in turn)", "s", "GiB");
    let mut rss_plot = Plot::new("Executors' RSS over the application", "s", "GiB");
    for (c, rs) in configs.iter().zip(apps) {
        let a = rs.last().expect("reps >= 1");
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let t = |ms: f64| (ms - a.start_ms) / 1e3;
        huge_plot.series(c.name(), a.series.iter().map(|p| (t(p.0), gib(p.1))).collect());
        rss_plot.series(c.name(), a.series.iter().map(|p| (t(p.0), gib(p.2))).collect());
    }
    report.plots.push(huge_plot);
    report.plots.push(rss_plot);
    report.data = json!({
        "reps": reps, "random_passes": random_passes, "scan_passes": scan_passes, "kmeans_iterations": kmeans_iters,
        "executor_memory_mb": executor_mem_mb, "runs": data,
        "apps": configs.iter().zip(apps).map(|(c, rs)| json!({
            "config": c.name(),
            "reps": rs.iter().map(|a| json!({
                "jvm_start_s": a.jvm_start_s, "start_ms": a.start_ms, "executors": a.executors,
                "phases": a.phases, "results": a.done,
                "series": a.series.iter().map(|p| ((p.0 - a.start_ms) / 1e3, p.1, p.2)).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    });
    report.note(format!(
        "Standalone cluster (Spark {SPARK_VERSION} from the pyspark package): master + 2 workers x 2 executors (1 core, {executor_mem_mb} MiB heap each, the same JVM flags in every configuration but the hugepage one); \
         one application per configuration and repetition ({reps} interleaved off/entire/part/part-old) runs every size ({}) and workload in turn, unpersisting in between; \
         MEMORY_ONLY_SER, Kryo, 4 MiB chunks. micro: cache 8 KiB records, {random_passes} random passes (a dependent chain of 8-byte reads at random offsets of each cached block, \
         read in place, one per 256 bytes cached) and {scan_passes} scan pass(es) (deserialize and sum every record); kmeans: MLlib k-means (k = 8, 64 dimensions, {kmeans_iters} iterations) over the cached points. \
         Times are measured inside the application: run = cache + access passes; JVM start (spark-submit to all 4 executors registered) is outside it (median {:.1} s). \
         Ratios are medians of per-repetition ratios, `_min`/`_max` their extremes.",
        facts.sizes.iter().map(|&b| human_bytes(b)).collect::<Vec<_>>().join(", "),
        Summary::of(&jvm).median
    ));
    report.note(
        "Hugepage bytes: AnonHugePages summed over the executors' smaps_rollup every 250 ms, peak while the workload ran at that size, against Spark's own cached bytes (median [min–max] over repetitions); \
         90% at: seconds from the start of caching until they first reached 90% of the cached bytes, with the end of the first access pass in parentheses (last repetition). \
         The arena keeps freed regions (and their hugepages) for reuse, so at a second size part starts with the first size's regions.",
    );
    report.note(
        "How to read the times: `part_vs_off_time` is the micro run time (cache + every access pass) at the largest size. \
         Two effects add up in it. Off the Java heap: off's and entire's chunks are 4 MiB heap arrays (G1 humongous objects, each \
         allocation able to start a concurrent cycle), part's and part-old's are not; `part_old_vs_off_cache_time` shows what that \
         does to caching, and it is not a hugepage effect. Hugepages: part and part-old differ in them only (part-old's come late \
         or never), and the random passes (TLB-bound) show it: `part_vs_part_old_random_time`; caching and the scan are \
         serialization work. The table 'Hugepages or the heap?' gives the off-heap share of part's gain per phase, \
         (off − part-old) / (off − part) with medians, valid while part-old stayed below half its bytes on hugepages; \
         `KEY_mostly_off_heap` is true where that share is above one half: that ratio is then mostly the off-heap effect, not a \
         hugepage figure.",
    );
    let mostly: Vec<String> = report
        .summary
        .iter()
        .filter(|(k, v)| k.ends_with("_mostly_off_heap") && v.as_bool() == Some(true))
        .map(|(k, _)| format!("`{}`", k.trim_end_matches("_mostly_off_heap")))
        .collect();
    if !mostly.is_empty() {
        report.note(format!(
            "In this run {} {} mostly the off-heap effect (part-old, off the heap with few hugepages, explains more than \
             half of part's gain): read {} as what moving Storage Memory off the heap gives, not hugepages.",
            mostly.join(", "),
            if mostly.len() == 1 { "is" } else { "are" },
            if mostly.len() == 1 { "it" } else { "them" }
        ));
    }
    let non_local: u64 = apps.iter().flatten().flat_map(|a| a.done.iter().map(|d| d.non_local_blocks)).sum();
    if non_local > 0 {
        report.note(format!(
            "{non_local} random-pass task(s) ran on an executor without their block and walked a fetched copy (same result, not the cached block's time)."
        ));
    }
    if !facts.skipped.is_empty() {
        report.note(format!(
            "skipped sizes (more than a third of this machine's memory): {}",
            facts.skipped.iter().map(|&b| human_bytes(b)).collect::<Vec<_>>().join(", ")
        ));
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_off_heap_share_splits_parts_gain() {
        // off 10 s, part 5 s, part-old 6 s: the heap explains 4 of the 5 s gained.
        assert_eq!(off_heap_share(10.0, 5.0, 6.0), Some(0.8));
        assert!(mostly_off_heap(off_heap_share(10.0, 5.0, 6.0), 0.03));
        // part-old no faster than off: all of it is hugepages.
        assert_eq!(off_heap_share(10.0, 5.0, 10.0), Some(0.0));
        assert!(!mostly_off_heap(Some(0.0), 0.03));
        // No gain, or one within 5% of off's time: nothing to split.
        assert_eq!(off_heap_share(10.0, 10.0, 8.0), None);
        assert_eq!(off_heap_share(10.0, 12.0, 8.0), None);
        assert_eq!(off_heap_share(51.62, 51.57, 39.36), None);
        // part-old with hugepages of its own: never called mostly off-heap.
        assert!(!mostly_off_heap(Some(0.9), 0.8));
    }
}
