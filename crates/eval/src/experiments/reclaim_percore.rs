//! `reclaim-percore` (seed 002): a latency-critical task on core 1 keeps allocating while a
//! file-I/O job with a memory fill on core 0 drives their shared memory cgroup into reclaim.
//!
//! The protected task (pinned to core 1, mlockall'ed, SCHED_FIFO) maps and touches 512 pages every 10 ms.
//! It shares the group's limit with the pressure (each runs in its own child of the limited
//! group), so without help every charge that finds the group full reclaims in the protected
//! task's own context, on core 1. With reclaimd, a worker pinned to core 0 keeps the group's
//! headroom between its low and high thresholds by reclaiming in its own context (cgroup v1
//! limit lowering here), so the reclaim happens on core 0. It lowers only the pressure
//! child's limit: a lowered limit makes every task charging to that group reclaim itself, and
//! the protected task's child never sees one. Configurations: no pressure (baseline for latency), kernel default, reclaimd.
//! Per-core figures come from the vmscan trace events (kswapd wake-ups by allocating CPU,
//! pages scanned and reclaimed, direct and memcg reclaim events).

use std::collections::BTreeSet;
use std::sync::Arc;

use pagewise_kernel::cgroup::MemCgroup;
use pagewise_kernel::SettingsGuard;
use pagewise_reclaim::config::Config;
use pagewise_reclaim::daemon::{Daemon, Options};
use pagewise_reclaim::stats::{Collector, CoreStats};
use serde_json::json;

use super::reclaim_load::{finish, load_binary, spawn, Scratch};
use crate::{interleave, ratio, Context, Experiment, Plot, Report, Summary, Table};

pub struct ReclaimPercore;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Setup {
    NoPressure,
    Default,
    /// reclaimd with the pressure paced to `rate_mib` MiB/s (0: as fast as it reads).
    Reclaimd {
        rate_mib: u32,
    },
}

impl Setup {
    fn label(self) -> String {
        match self {
            Setup::NoPressure => "no pressure".into(),
            Setup::Default => "kernel default".into(),
            Setup::Reclaimd { rate_mib: 0 } => "reclaimd".into(),
            Setup::Reclaimd { rate_mib } => format!("reclaimd, pressure paced to {rate_mib} MiB/s"),
        }
    }

    fn rate_mib(self) -> u32 {
        match self {
            Setup::Reclaimd { rate_mib } => rate_mib,
            _ => 0,
        }
    }
}

/// The paced pressures of the rate sweep (MiB/s), below the unpaced one.
const PACED_RATES: [u32; 2] = [256, 1024];

const PROTECTED: usize = 1;
const RECLAIM: usize = 0;

struct Run {
    cores: [CoreStats; 2],
    p50_us: f64,
    p99_us: f64,
    max_us: f64,
    samples_ns: Vec<u64>,
    mib_per_s: f64,
    failcnt: u64,
    worker_reclaimed_mib: f64,
    worker_ran_on: BTreeSet<usize>,
    /// memcg reclaim events in the pressure task itself (it met its own group's limit: the
    /// worker fell behind and the protected reserve held).
    pressure_self_reclaims: u64,
    worker_max_low_mib: f64,
    worker_max_reaction_ms: f64,
}

struct Sizes {
    limit_mb: u64,
    file_mb: usize,
    fill_mb: usize,
    seconds: f64,
}

fn daemon_config(cg: &std::path::Path, reclaim_from: &std::path::Path) -> anyhow::Result<Config> {
    // Core 0 reclaims early (low 32 MiB of headroom, high 48 MiB); core 1's thresholds are the
    // paper's "never reclaim here" values, kept for the record (no worker runs on core 1).
    let text = format!(
        "scope = \"cgroup\"\ncgroup = \"{}\"\nreclaim_cgroup = \"{}\"\ninterval_ms = 5\nbatch_kb = 16384\nworker_rt_priority = 10\ntree = false\n\
         [roles]\nprotect = \"{PROTECTED}\"\nreclaim = \"{RECLAIM}\"\n\
         [cores.\"{RECLAIM}\"]\nmin_free_kbytes = 16384\npages_low_ratio = 200\npages_high_ratio = 300\n\
         [cores.\"{PROTECTED}\"]\nmin_free_kbytes = 256\npages_low_ratio = 3300\npages_high_ratio = 4000\n",
        cg.display(),
        reclaim_from.display()
    );
    Ok(Config::parse(&text, &pagewise_kernel::cpu::online_cpus()?, 67584)?)
}

fn run_once(setup: Setup, sz: &Sizes, file: &std::path::Path, rep: usize) -> anyhow::Result<Run> {
    let bin = load_binary()?;
    let guard = Arc::new(SettingsGuard::new());
    let cg = MemCgroup::create(&guard, &format!("eval-percore-{}-{rep}", std::process::id()))?;
    cg.set_limit(Some(sz.limit_mb << 20))?;
    let (pressure_cg, protected_cg) = (cg.create_child(&guard, "pressure")?, cg.create_child(&guard, "protected")?);
    let collector = Collector::start(&guard)?;
    let daemon = match setup {
        Setup::Reclaimd { .. } => {
            Some(Daemon::start(&daemon_config(cg.path(), pressure_cg.path())?, guard.clone(), Options::default())?)
        }
        _ => None,
    };
    let path = pressure_cg.path().display().to_string();
    let pressure = match setup {
        Setup::NoPressure => None,
        _ => Some(spawn(
            &bin,
            "pressure",
            &[
                ("cpu", RECLAIM.to_string()),
                ("file", file.display().to_string()),
                ("fill-mb", sz.fill_mb.to_string()),
                ("seconds", sz.seconds.to_string()),
                ("rate-mib", setup.rate_mib().to_string()),
                ("cgroup", path),
            ],
        )?),
    };
    let protect = spawn(
        &bin,
        "protect",
        &[
            ("cpu", PROTECTED.to_string()),
            ("pages", "512".into()),
            ("period-ms", "10".into()),
            ("fifo", "20".into()),
            ("seconds", sz.seconds.to_string()),
            ("cgroup", protected_cg.path().display().to_string()),
        ],
    )?;
    let pressure_pid = pressure.as_ref().map(|c| c.id() as i32);
    let q = finish(protect)?;
    let p = pressure.map(finish).transpose()?;
    let report = daemon.map(Daemon::stop);
    let agg = collector.finish()?;
    let failcnt = cg.failcnt()?;
    drop(guard);
    let core = |c: usize| agg.cores.get(&c).cloned().unwrap_or_default();
    let lat = &q["latency"];
    let w = report.as_ref().and_then(|r| r.workers.first());
    Ok(Run {
        cores: [core(0), core(1)],
        p50_us: lat["p50_us"].as_f64().unwrap_or(0.0),
        p99_us: lat["p99_us"].as_f64().unwrap_or(0.0),
        max_us: lat["max_us"].as_f64().unwrap_or(0.0),
        samples_ns: q["samples_ns"]
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_u64()).collect())
            .unwrap_or_default(),
        mib_per_s: p.as_ref().and_then(|p| p["mib_per_s"].as_f64()).unwrap_or(0.0),
        failcnt,
        worker_reclaimed_mib: w.map_or(0.0, |w| w.reclaimed_bytes as f64 / (1 << 20) as f64),
        worker_ran_on: w.map(|w| w.ran_on.clone()).unwrap_or_default(),
        pressure_self_reclaims: pressure_pid.and_then(|pid| agg.tasks.get(&pid)).map_or(0, |t| t.reclaim.count),
        worker_max_low_mib: w.map_or(0.0, |w| w.max_low_mib),
        worker_max_reaction_ms: w.map_or(0.0, |w| w.max_reaction_ms),
    })
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let n = sorted.len();
    sorted[((n as f64 * p / 100.0).ceil() as usize).clamp(1, n) - 1] as f64 / 1e3
}

impl Experiment for ReclaimPercore {
    fn name(&self) -> &'static str {
        "reclaim-percore"
    }

    fn description(&self) -> &'static str {
        "per-core reclaim (seed 002): protected task on core 1 vs file I/O + fill on core 0 in one memory cgroup; kernel default vs reclaimd"
    }

    fn run(&self, ctx: &mut Context) -> anyhow::Result<Report> {
        if pagewise_kernel::cpu::online_cpus()?.len() < 2 {
            anyhow::bail!("needs 2 CPUs (core 0 reclaim, core 1 protected)");
        }
        let sz = ctx.mode.pick(
            Sizes { limit_mb: 192, file_mb: 384, fill_mb: 64, seconds: 6.0 },
            Sizes { limit_mb: 1024, file_mb: 2048, fill_mb: 256, seconds: 30.0 },
        );
        let reps = ctx.mode.pick(3, 5);
        let mut configs = vec![Setup::NoPressure, Setup::Default, Setup::Reclaimd { rate_mib: 0 }];
        configs.extend(PACED_RATES.map(|rate_mib| Setup::Reclaimd { rate_mib }));
        ctx.message("writing the pressure file");
        let scratch = Scratch::new("reclaim-percore")?;
        let file = scratch.file("pressure.bin", sz.file_mb)?;
        ctx.start_progress((configs.len() * reps) as u64, "protected task vs pressure");
        let results = interleave(ctx, &configs, reps, |&s, rep| run_once(s, &sz, &file, rep))?;
        drop(scratch);

        let mut report = Report::default();
        let mut per_core = Table::new([
            "configuration",
            "core",
            "kswapd wake-ups",
            "pages scanned",
            "pages reclaimed",
            "direct reclaim",
            "memcg reclaim",
            "memcg reclaim max µs",
        ]);
        let mut lat_table = Table::new([
            "configuration",
            "protected p50 µs",
            "protected p99 µs",
            "protected max µs",
            "pressure MiB/s",
            "group failcnt",
            "worker reclaimed MiB",
        ]);
        let mut plot = Plot::new("Protected task: 512-page allocation latency", "percentile", "µs");
        let mut data = Vec::new();
        let med = |v: Vec<f64>| Summary::of(&v);
        for (i, setup) in configs.iter().enumerate() {
            let runs = &results[i];
            for c in 0..2 {
                let sum = |f: &dyn Fn(&CoreStats) -> u64| -> u64 { runs.iter().map(|r| f(&r.cores[c])).sum() };
                let max_memcg = runs.iter().map(|r| r.cores[c].memcg.max_us).fold(0.0, f64::max);
                per_core.row([
                    setup.label(),
                    format!("{c}{}", if c == PROTECTED { " (protected)" } else { " (pressure/reclaim)" }),
                    sum(&|s| s.kswapd_wakeups).to_string(),
                    sum(&|s| s.pages_scanned).to_string(),
                    sum(&|s| s.pages_reclaimed).to_string(),
                    sum(&|s| s.direct.count).to_string(),
                    sum(&|s| s.memcg.count).to_string(),
                    format!("{max_memcg:.0}"),
                ]);
            }
            let p50 = med(runs.iter().map(|r| r.p50_us).collect());
            let p99 = med(runs.iter().map(|r| r.p99_us).collect());
            let max = med(runs.iter().map(|r| r.max_us).collect());
            let tput = med(runs.iter().map(|r| r.mib_per_s).collect());
            lat_table.row([
                setup.label(),
                p50.display(0),
                p99.display(0),
                max.display(0),
                if *setup == Setup::NoPressure { "–".into() } else { tput.display(0) },
                runs.iter().map(|r| r.failcnt).sum::<u64>().to_string(),
                format!("{:.0}", runs.iter().map(|r| r.worker_reclaimed_mib).sum::<f64>()),
            ]);
            let mut all: Vec<u64> = runs.iter().flat_map(|r| r.samples_ns.iter().copied()).collect();
            all.sort_unstable();
            plot.series(
                setup.label(),
                [50.0, 90.0, 99.0, 99.9, 100.0].iter().map(|&p| (p, percentile(&all, p))).collect(),
            );
            data.push(json!({
                "configuration": setup.label(),
                "runs": runs.iter().map(|r| json!({
                    "cores": r.cores, "p50_us": r.p50_us, "p99_us": r.p99_us, "max_us": r.max_us,
                    "pressure_mib_per_s": r.mib_per_s, "failcnt": r.failcnt,
                    "worker_reclaimed_mib": r.worker_reclaimed_mib, "worker_ran_on": r.worker_ran_on,
                    "pressure_self_reclaims": r.pressure_self_reclaims, "worker_max_low_mib": r.worker_max_low_mib,
                    "worker_max_reaction_ms": r.worker_max_reaction_ms,
                })).collect::<Vec<_>>(),
            }));
        }
        let idx = |s: Setup| configs.iter().position(|c| *c == s).expect("configured");
        let (idle, def, rd) = (
            &results[idx(Setup::NoPressure)],
            &results[idx(Setup::Default)],
            &results[idx(Setup::Reclaimd { rate_mib: 0 })],
        );
        let events = |runs: &[Run]| runs.iter().map(|r| r.cores[PROTECTED].reclaim_events()).sum::<u64>() as f64;
        let scanned = |runs: &[Run]| runs.iter().map(|r| r.cores[PROTECTED].pages_scanned).sum::<u64>() as f64;
        let p99 = |runs: &[Run]| Summary::of(&runs.iter().map(|r| r.p99_us).collect::<Vec<_>>()).median;
        let tput = |runs: &[Run]| Summary::of(&runs.iter().map(|r| r.mib_per_s).collect::<Vec<_>>()).median;
        report.figure("protected_core_reclaim_events", events(rd));
        report.figure("protected_core_pages_scanned", scanned(rd));
        report.figure("protected_p99_vs_idle", ratio(p99(rd), p99(idle)));
        report.figure("pressure_throughput_ratio", ratio(tput(rd), tput(def)));
        report.figure("default_protected_core_reclaim_events", events(def));
        report.figure("default_p99_vs_idle", ratio(p99(def), p99(idle)));
        // The rate sweep: at each pressure rate, did the protected core stay free of reclaim,
        // and did the worker keep up (no reclaim in the pressure task itself)?
        let mut sweep = Table::new([
            "configuration",
            "pressure MiB/s (measured)",
            "protected-core reclaim events",
            "pressure self-reclaims",
            "worker low up to MiB",
            "worker reaction up to ms",
        ]);
        let mut held = Vec::new();
        let mut kept_up = Vec::new();
        for (i, setup) in configs.iter().enumerate().filter(|(_, s)| matches!(s, Setup::Reclaimd { .. })) {
            let runs = &results[i];
            let rate = tput(runs);
            let self_reclaims: u64 = runs.iter().map(|r| r.pressure_self_reclaims).sum();
            if events(runs) == 0.0 {
                held.push(rate);
            }
            if self_reclaims == 0 {
                kept_up.push(rate);
            }
            sweep.row([
                setup.label(),
                Summary::of(&runs.iter().map(|r| r.mib_per_s).collect::<Vec<_>>()).display(0),
                format!("{}", events(runs)),
                self_reclaims.to_string(),
                format!("{:.1}", runs.iter().map(|r| r.worker_max_low_mib).fold(0.0, f64::max)),
                format!("{:.1}", runs.iter().map(|r| r.worker_max_reaction_ms).fold(0.0, f64::max)),
            ]);
        }
        let highest = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
        report.figure("pressure_read_mib_per_s", tput(def));
        report.figure("max_rate_zero_protected_reclaim_mib_per_s", highest(&held));
        report.figure("max_rate_worker_kept_up_mib_per_s", highest(&kept_up));
        report.table("Per-core reclaim (summed over repetitions; seed 002 Table 2)", per_core);
        report.table(
            "Rate sweep under reclaimd: protected core vs pressure rate (events summed, rates median [min–max])",
            sweep,
        );
        report.table("Protected task latency and pressure throughput (median [min–max] over repetitions)", lat_table);
        report.plots.push(plot);
        report.data = json!({
            "limit_mib": sz.limit_mb, "file_mib": sz.file_mb, "fill_mib": sz.fill_mb, "seconds": sz.seconds,
            "reps": reps, "configurations": data,
        });
        report.note(format!(
            "Memory cgroup (v1) of {} MiB; pressure: {} MiB of anonymous fill then sequential reads of a {} MiB file, pinned to core 0; \
             protected: 512 pages mapped+touched+unmapped every 10 ms, mlockall, SCHED_FIFO 20, pinned to core 1 (the paper's application habits); {} s per run, {reps} repetitions interleaved. \
             reclaimd: one SCHED_FIFO worker on core 0 woken by a usage threshold at its low watermark and a 5 ms timer; low 32 MiB / high 48 MiB of headroom at least, raised to twice the charges of one reaction time; batches of 16 MiB or more by cgroup-v1 limit lowering of the pressure's child, whose standing limit is the group's minus a 32 MiB protected reserve. \
             The rate sweep paces the pressure to {:?} MiB/s as well: `max_rate_zero_protected_reclaim_mib_per_s` is the highest measured rate with no reclaim on the protected core, `max_rate_worker_kept_up_mib_per_s` the highest at which the pressure never reclaimed itself either. \
             The machine's 2 cores are shared with other work, so latencies carry that noise.",
            sz.limit_mb, sz.fill_mb, sz.file_mb, sz.seconds, PACED_RATES
        ));
        Ok(report)
    }
}
