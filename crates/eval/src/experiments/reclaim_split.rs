//! `reclaim-split` (seed 004): a file-server-like load in a memory cgroup; how much reclaim
//! happens on the worker threads' own path, and how long it takes.
//!
//! The load (`pagewise-reclaim-load fileserver`) runs worker threads that read whole files,
//! rewrite some, and look up names, existing and missing (negative dentries), over a file set
//! larger than the group. Patterns: *standard* (20% lookups: mostly page cache) and
//! *slab-heavy* (90% lookups: mostly dentries). Configurations:
//! - kernel default: the workers reclaim when their charges hit the limit, each doing page
//!   cache and slab reclaim (memcg reclaim includes shrink_slab);
//! - split reclaim: reclaimd's worker on core 0 keeps headroom by page reclaim (Pstart = its
//!   low), and runs bounded slab batches when the group's kernel memory reaches Sstart (50%);
//! - split reclaim + vfs_cache_pressure 10: the same, with the lever that makes any reclaim
//!   that still hits a worker scan less slab (restored by the guard).
//!
//! Reclaim on the workers' path comes from the vmscan trace events of the threads named
//! `pw-fs-worker` (memcg/direct reclaim begin/end pairs and their slab shrinker calls).

use std::sync::Arc;

use pagewise_kernel::cgroup::MemCgroup;
use pagewise_kernel::SettingsGuard;
use pagewise_reclaim::config::Config;
use pagewise_reclaim::daemon::{Daemon, Options};
use pagewise_reclaim::stats::{Collector, LatencyStats};
use serde_json::json;

use super::reclaim_load::{finish, load_binary, spawn, Scratch};
use crate::stats::Paired;
use crate::{interleave, ratio, Context, Experiment, Report, Summary, Table};

pub struct ReclaimSplit;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Setup {
    Default,
    Split,
    SplitLowVfs,
}

impl Setup {
    fn label(self) -> &'static str {
        match self {
            Setup::Default => "kernel default",
            Setup::Split => "split reclaim",
            Setup::SplitLowVfs => "split + vfs_cache_pressure 10",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pattern {
    Standard,
    SlabHeavy,
}

impl Pattern {
    fn label(self) -> &'static str {
        match self {
            Pattern::Standard => "standard",
            Pattern::SlabHeavy => "slab-heavy",
        }
    }
    fn lookup_pct(self) -> u32 {
        match self {
            Pattern::Standard => 20,
            Pattern::SlabHeavy => 90,
        }
    }
}

struct Sizes {
    limit_mb: u64,
    files: usize,
    file_kb: usize,
    threads: usize,
    ops_standard: usize,
    ops_slab: usize,
}

struct Run {
    path: LatencyStats,
    path_slab: LatencyStats,
    worker_reclaim: LatencyStats,
    p50_us: f64,
    p99_us: f64,
    max_us: f64,
    seconds: f64,
    daemon_reclaimed_mib: f64,
    slab_passes: u64,
    max_pass_ms: f64,
    workers_cpu_s: f64,
    workers_wait_s: f64,
    daemon_cpu_s: f64,
    daemon_wait_s: f64,
    daemon_passes: u64,
    /// The worker's wake-ups in all, and those its usage threshold caused.
    daemon_wakeups: u64,
    daemon_threshold_wakeups: u64,
    /// The worker's readings of the group's memory.stat (each flushes its statistics).
    daemon_stat_reads: u64,
    collector_cpu_s: f64,
    charged_mib: f64,
    max_low_mib: f64,
    /// The group's free memory under its limit, sampled every 5 ms once the load filled it
    /// (None: it never did).
    mean_free_mib: Option<f64>,
    /// What the workers read from storage: their page-cache misses.
    storage_read_mib: f64,
}

/// Samples a group's headroom (limit − usage) on its own thread until stopped, from the
/// moment the load has filled the group (free below a tenth of the limit): the minutes of
/// filling say nothing about the headroom reclaim keeps.
struct HeadroomSampler {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<(f64, u64)>,
}

impl HeadroomSampler {
    const EVERY: std::time::Duration = std::time::Duration::from_millis(5);

    fn start(cg: &MemCgroup, limit: u64) -> anyhow::Result<Self> {
        let cg = MemCgroup::open(cg.path())?;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut sum, mut n, mut full) = (0.0, 0u64, false);
            while !flag.load(std::sync::atomic::Ordering::Acquire) {
                if let Ok(u) = cg.usage() {
                    let free = limit.saturating_sub(u);
                    full |= free < limit / 10;
                    if full {
                        sum += free as f64;
                        n += 1;
                    }
                }
                std::thread::sleep(Self::EVERY);
            }
            (sum, n)
        });
        Ok(HeadroomSampler { stop, thread })
    }

    /// The mean headroom in MiB (None: the group never filled).
    fn finish(self) -> Option<f64> {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        let (sum, n) = self.thread.join().unwrap_or((0.0, 0));
        (n > 0).then(|| sum / n as f64 / (1 << 20) as f64)
    }
}

/// The split worker's configured headroom (low–high), as the note says it. The load is
/// sensitive to every MiB the group does not hold: a kernel-default group limited to 93
/// instead of 96 MiB ran its job 1.07× as long (median of four pairs, issue 23).
const HEADROOM_TEXT: &str = "1–2 MiB";

fn split_config(cg: &std::path::Path, vfs: Option<u32>) -> anyhow::Result<Config> {
    let vfs = vfs.map(|v| format!("vfs_cache_pressure = {v}\n")).unwrap_or_default();
    let text = format!(
        "scope = \"cgroup\"\ncgroup = \"{}\"\ninterval_ms = 1\nbatch_kb = 4096\nworker_rt_priority = 10\ntree = false\n\
         [roles]\nreclaim = \"0\"\n\
         [cores.\"0\"]\nmin_free_kbytes = 512\npages_low_ratio = 200\npages_high_ratio = 400\n\
         [split]\nsstart_percent = 50\nslab_batch_kb = 4096\n{vfs}",
        cg.display()
    );
    Ok(Config::parse(&text, &pagewise_kernel::cpu::online_cpus()?, 67584)?)
}

fn run_once(setup: Setup, pattern: Pattern, sz: &Sizes, dir: &std::path::Path, rep: usize) -> anyhow::Result<Run> {
    let bin = load_binary()?;
    let guard = Arc::new(SettingsGuard::new());
    let cg = MemCgroup::create(&guard, &format!("eval-split-{}-{rep}", std::process::id()))?;
    cg.set_limit(Some(sz.limit_mb << 20))?;
    let collector = Collector::start(&guard)?;
    let daemon = match setup {
        Setup::Default => None,
        Setup::Split => Some(Daemon::start(&split_config(cg.path(), None)?, guard.clone(), Options::default())?),
        Setup::SplitLowVfs => {
            Some(Daemon::start(&split_config(cg.path(), Some(10))?, guard.clone(), Options::default())?)
        }
    };
    let ops = match pattern {
        Pattern::Standard => sz.ops_standard,
        Pattern::SlabHeavy => sz.ops_slab,
    };
    let child = spawn(
        &bin,
        "fileserver",
        &[
            ("dir", dir.display().to_string()),
            ("threads", sz.threads.to_string()),
            ("files", sz.files.to_string()),
            ("file-kb", sz.file_kb.to_string()),
            ("ops", ops.to_string()),
            ("lookup-pct", pattern.lookup_pct().to_string()),
            ("setup", "0".into()),
            ("drop", "1".into()),
            ("salt", format!("{}-{:?}-{:?}-{rep}", std::process::id(), setup, pattern)),
            ("cgroup", cg.path().display().to_string()),
        ],
    )?;
    let sampler = HeadroomSampler::start(&cg, sz.limit_mb << 20)?;
    let out = finish(child);
    let mean_free_mib = sampler.finish();
    let out = out?;
    let charged_mib = cg.composition()?.charged_pages.unwrap_or(0) as f64 / 256.0;
    let report = daemon.map(Daemon::stop);
    let agg = collector.finish()?;
    drop(guard);
    let (path, path_slab) = agg.on_paths(|_, task| task == "pw-fs-worker");
    let (worker_reclaim, _) = agg.on_paths(|_, task| task.starts_with("reclaimd-cpu"));
    let lat = &out["latency"];
    let w = report.as_ref().and_then(|r| r.workers.first());
    Ok(Run {
        path,
        path_slab,
        worker_reclaim,
        p50_us: lat["p50_us"].as_f64().unwrap_or(0.0),
        p99_us: lat["p99_us"].as_f64().unwrap_or(0.0),
        max_us: lat["max_us"].as_f64().unwrap_or(0.0),
        seconds: out["seconds"].as_f64().unwrap_or(0.0),
        daemon_reclaimed_mib: w.map_or(0.0, |w| (w.reclaimed_bytes + w.slab_reclaimed_bytes) as f64 / (1 << 20) as f64),
        slab_passes: w.map_or(0, |w| w.slab_passes),
        max_pass_ms: w.map_or(0.0, |w| w.max_pass_ms),
        workers_cpu_s: out["workers_on_cpu_s"].as_f64().unwrap_or(0.0),
        workers_wait_s: out["workers_run_queue_wait_s"].as_f64().unwrap_or(0.0),
        daemon_cpu_s: w.map_or(0.0, |w| w.sched.on_cpu_ns as f64 / 1e9),
        daemon_wait_s: w.map_or(0.0, |w| w.sched.run_queue_wait_ns as f64 / 1e9),
        daemon_passes: w.map_or(0, |w| w.reclaim_passes),
        daemon_wakeups: w.map_or(0, |w| w.wakeups),
        daemon_threshold_wakeups: w.map_or(0, |w| w.threshold_wakeups),
        daemon_stat_reads: w.map_or(0, |w| w.memory_stat_reads),
        collector_cpu_s: agg.drain_sched.on_cpu_ns as f64 / 1e9,
        charged_mib,
        max_low_mib: w.map_or(0.0, |w| w.max_low_mib),
        mean_free_mib,
        storage_read_mib: out["storage_read_mib"].as_f64().unwrap_or(0.0),
    })
}

impl Experiment for ReclaimSplit {
    fn name(&self) -> &'static str {
        "reclaim-split"
    }

    fn description(&self) -> &'static str {
        "split reclaim (seed 004): file-server load in a memory cgroup, standard and slab-heavy patterns; reclaim on the workers' path, kernel default vs split reclaim"
    }

    fn run(&self, ctx: &mut Context) -> anyhow::Result<Report> {
        let sz = ctx.mode.pick(
            Sizes { limit_mb: 96, files: 3000, file_kb: 64, threads: 8, ops_standard: 6000, ops_slab: 40_000 },
            Sizes { limit_mb: 512, files: 16_000, file_kb: 64, threads: 16, ops_standard: 40_000, ops_slab: 400_000 },
        );
        // Six pairs per pattern: the fewest whose paired ratios give a 95% interval of their
        // median (the worst case of one run ranged 1.8–28 ms over two; issue 23). Quick mode
        // leaves out the vfs_cache_pressure lever (off by default) to stay within minutes.
        let reps = 6;
        let configs: Vec<Setup> =
            ctx.mode.pick(vec![Setup::Default, Setup::Split], vec![Setup::Default, Setup::Split, Setup::SplitLowVfs]);
        let patterns = [Pattern::Standard, Pattern::SlabHeavy];
        ctx.message("writing the file set");
        let scratch = Scratch::new("reclaim-split")?;
        let setup = finish(spawn(
            &load_binary()?,
            "fileserver",
            &[
                ("dir", scratch.0.display().to_string()),
                ("threads", "1".into()),
                ("files", sz.files.to_string()),
                ("file-kb", sz.file_kb.to_string()),
                ("ops", "1".into()),
                ("setup", "1".into()),
            ],
        )?)?;
        ctx.log(format!(
            "file set: {} files of {} KiB ({:.1} s)",
            sz.files,
            sz.file_kb,
            setup["seconds"].as_f64().unwrap_or(0.0)
        ));
        ctx.start_progress((configs.len() * patterns.len() * reps) as u64, "file server");

        let mut report = Report::default();
        let mut table = Table::new([
            "pattern",
            "configuration",
            "reclaims on workers' path",
            "mean µs",
            "worst µs",
            "slab shrinks on path (worst µs)",
            "request p50 / p99 / max µs",
            "job time s",
            "workers' CPU s / run-queue wait s",
            "read from storage MiB / mean free MiB",
            "reclaimd: reclaimed MiB, CPU s, slab batches, longest pass ms",
        ]);
        let mut ratios = Table::new(["pattern", "configuration", "job time", "worst reclaim on path", "pooled worst"]);
        let mut data = Vec::new();
        for pattern in patterns {
            ctx.message(format!("{} pattern", pattern.label()));
            let results = interleave(ctx, &configs, reps, |&s, rep| run_once(s, pattern, &sz, &scratch.0, rep))?;
            let med = |v: Vec<f64>| Summary::of(&v);
            for (i, setup) in configs.iter().enumerate() {
                let runs = &results[i];
                let frees: Vec<f64> = runs.iter().filter_map(|r| r.mean_free_mib).collect();
                let free = if frees.is_empty() { "–".to_string() } else { format!("{:.1}", med(frees).median) };
                table.row([
                    pattern.label().to_string(),
                    setup.label().to_string(),
                    med(runs.iter().map(|r| r.path.count as f64).collect()).display(0),
                    med(runs.iter().map(|r| r.path.mean_us).collect()).display(1),
                    med(runs.iter().map(|r| r.path.max_us).collect()).display(0),
                    format!(
                        "{} ({})",
                        med(runs.iter().map(|r| r.path_slab.count as f64).collect()).display(0),
                        med(runs.iter().map(|r| r.path_slab.max_us).collect()).display(0)
                    ),
                    format!(
                        "{:.0} / {:.0} / {:.0}",
                        med(runs.iter().map(|r| r.p50_us).collect()).median,
                        med(runs.iter().map(|r| r.p99_us).collect()).median,
                        med(runs.iter().map(|r| r.max_us).collect()).median
                    ),
                    med(runs.iter().map(|r| r.seconds).collect()).display(2),
                    format!(
                        "{:.2} / {:.2}",
                        med(runs.iter().map(|r| r.workers_cpu_s).collect()).median,
                        med(runs.iter().map(|r| r.workers_wait_s).collect()).median
                    ),
                    format!("{:.0} / {free}", med(runs.iter().map(|r| r.storage_read_mib).collect()).median),
                    if *setup == Setup::Default {
                        "–".into()
                    } else {
                        format!(
                            "{:.0}, {:.2}, {}, {:.0}",
                            med(runs.iter().map(|r| r.daemon_reclaimed_mib).collect()).median,
                            med(runs.iter().map(|r| r.daemon_cpu_s).collect()).median,
                            runs.iter().map(|r| r.slab_passes).sum::<u64>(),
                            med(runs.iter().map(|r| r.max_pass_ms).collect()).median
                        )
                    },
                ]);
                data.push(json!({
                    "pattern": pattern.label(), "configuration": setup.label(),
                    "runs": runs.iter().map(|r| json!({
                        "path_reclaim": r.path, "path_slab": r.path_slab, "reclaimd_reclaim": r.worker_reclaim,
                        "p50_us": r.p50_us, "p99_us": r.p99_us, "max_us": r.max_us, "seconds": r.seconds,
                        "daemon_reclaimed_mib": r.daemon_reclaimed_mib, "slab_passes": r.slab_passes, "max_pass_ms": r.max_pass_ms,
                        "workers_cpu_s": r.workers_cpu_s, "workers_run_queue_wait_s": r.workers_wait_s,
                        "reclaimd_cpu_s": r.daemon_cpu_s, "reclaimd_run_queue_wait_s": r.daemon_wait_s,
                        "reclaimd_passes": r.daemon_passes, "reclaimd_wakeups": r.daemon_wakeups,
                        "reclaimd_threshold_wakeups": r.daemon_threshold_wakeups, "reclaimd_stat_reads": r.daemon_stat_reads,
                        "collector_cpu_s": r.collector_cpu_s,
                        "charged_mib": r.charged_mib, "reclaimd_max_low_mib": r.max_low_mib,
                        "mean_free_mib": r.mean_free_mib, "storage_read_mib": r.storage_read_mib,
                    })).collect::<Vec<_>>(),
                }));
            }
            for (i, setup) in configs.iter().enumerate().skip(1) {
                let time = Paired::of(&results[i], &results[0], |r| r.seconds);
                let worst = Paired::of(&results[i], &results[0], |r| r.path.max_us);
                let pooled = ratio(pooled_worst(&results[i]), pooled_worst(&results[0]));
                ratios.row([
                    pattern.label().to_string(),
                    setup.label().to_string(),
                    time.display(3),
                    worst.display(3),
                    format!("{pooled:.3}"),
                ]);
                let suffix = if *setup == Setup::SplitLowVfs { "_low_vfs" } else { "" };
                let (time_key, worst_key) = match pattern {
                    Pattern::Standard => ("standard_time_ratio", "worst_reclaim_ratio_standard"),
                    Pattern::SlabHeavy => ("slab_heavy_time_ratio", "worst_reclaim_ratio_slab_heavy"),
                };
                time.report(&mut report, &format!("{time_key}{suffix}"));
                worst.report(&mut report, &format!("{worst_key}{suffix}"));
                report.figure(&format!("{worst_key}{suffix}_pooled"), pooled);
            }
        }
        drop(scratch);
        report.table(
            "Reclaim on the workers' path, request latency, job time (median [min–max] over repetitions)",
            table,
        );
        report.table(
            "Split vs kernel default: median of the paired ratios (each pair ran back to back) [95% interval of the median]; pooled: the worst of all runs vs the worst of all runs",
            ratios,
        );
        report.data = json!({
            "limit_mib": sz.limit_mb, "files": sz.files, "file_kib": sz.file_kb, "threads": sz.threads,
            "ops_per_thread": {"standard": sz.ops_standard, "slab_heavy": sz.ops_slab}, "reps": reps, "results": data,
        });
        report.note(format!(
            "Memory cgroup (v1, kmem accounted) of {} MiB; {} worker threads over {} files of {} KiB ({:.0} MiB); standard: 20% lookups (one existing, one missing name), 70% reads, 10% rewrites; \
             slab-heavy: 90% lookups. split reclaim: reclaimd worker (SCHED_FIFO, core 0) keeps {} of headroom (more when the rate it is used up at asks, at most 10% of the limit; usage threshold, timer 1 ms; memory.stat read at most every 2 s) by cgroup-v1 limit lowering in batches of at most 10 ms; \
             slab batches of 4 MiB with vfs_cache_pressure 1000 for the batch when the group's kernel memory reaches 50% of the limit. \
             Read from storage: what the workers had the kernel read (/proc/PID/io read_bytes), their cache misses, so headroom kept free shows as more of it; \
             mean free: the group's headroom sampled every 5 ms once the load had filled it (–: never within 10% of its limit). \
             Worker threads are not pinned; the 2 cores are shared with other work.",
            sz.limit_mb, sz.threads, sz.files, sz.file_kb, (sz.files * sz.file_kb) as f64 / 1024.0, HEADROOM_TEXT
        ));
        Ok(report)
    }
}

/// The worst reclaim on the workers' path over every repetition of a configuration, µs.
fn pooled_worst(runs: &[Run]) -> f64 {
    runs.iter().map(|r| r.path.max_us).fold(0.0, f64::max)
}
