//! Per-core reclaim statistics from the vmscan trace events (seed 002's per-core vmstat and
//! Table 2), each event attributed to the CPU it fired on.
//!
//! - `mm_vmscan_wakeup_kswapd` fires in the allocating task, so on the allocating CPU: the
//!   paper's "kswapd wake-ups" per core.
//! - `mm_vmscan_{direct,memcg}_reclaim_{begin,end}` fire in the reclaiming task; begin and end
//!   are paired per pid and the latency is charged to the begin's CPU.
//! - `mm_vmscan_lru_shrink_inactive` carries nr_scanned / nr_reclaimed of every LRU pass,
//!   whoever runs it (kswapd, direct, memcg, proactive): "pages scanned / reclaimed".
//! - `mm_shrink_slab_{start,end}`: slab shrinker calls, paired per pid, with objects freed.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use pagewise_kernel::tracefs::{Instance, TraceEvent};
use pagewise_kernel::SettingsGuard;
use serde::Serialize;

/// The events `reclaim stat` enables.
pub const EVENTS: &[&str] = &[
    "mm_vmscan_wakeup_kswapd",
    "mm_vmscan_kswapd_wake",
    "mm_vmscan_direct_reclaim_begin",
    "mm_vmscan_direct_reclaim_end",
    "mm_vmscan_memcg_reclaim_begin",
    "mm_vmscan_memcg_reclaim_end",
    "mm_vmscan_lru_shrink_inactive",
    "mm_shrink_slab_start",
    "mm_shrink_slab_end",
];

/// Durations of paired begin/end events.
///
/// Count, mean and max follow each event in O(1); the p99 needs the samples sorted, so it is
/// computed by [`LatencyStats::settle`] (the collector settles once, when it stops). Sorting on
/// every event made draining quadratic: 3–6 s of CPU for a 2 s file-server run, taken from
/// the cores the run measured (issue 23).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LatencyStats {
    pub count: u64,
    pub mean_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    /// Pages (reclaim) or objects (slab) freed by these calls.
    pub freed: u64,
    #[serde(skip)]
    samples_ns: Vec<u64>,
    #[serde(skip)]
    sum_ns: u128,
}

impl LatencyStats {
    fn add(&mut self, ns: u64, freed: u64) {
        self.samples_ns.push(ns);
        self.freed += freed;
        self.sum_ns += u128::from(ns);
        self.count = self.samples_ns.len() as u64;
        self.mean_us = self.sum_ns as f64 / self.count as f64 / 1e3;
        self.max_us = self.max_us.max(ns as f64 / 1e3);
    }

    fn merge(&mut self, other: &LatencyStats) {
        self.samples_ns.extend_from_slice(&other.samples_ns);
        self.freed += other.freed;
        self.sum_ns += other.sum_ns;
        self.settle();
    }

    /// Bring every figure, the p99 too, up to date with the samples.
    pub fn settle(&mut self) {
        let n = self.samples_ns.len();
        self.count = n as u64;
        if n == 0 {
            return;
        }
        self.samples_ns.sort_unstable();
        let s = &self.samples_ns;
        self.mean_us = self.sum_ns as f64 / n as f64 / 1e3;
        // Nearest-rank p99.
        let rank = ((n as f64 * 0.99).ceil() as usize).clamp(1, n);
        self.p99_us = s[rank - 1] as f64 / 1e3;
        self.max_us = s[n - 1] as f64 / 1e3;
    }

    /// Every duration, in ns.
    pub fn samples_ns(&self) -> &[u64] {
        &self.samples_ns
    }
}

/// One core's counters.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CoreStats {
    /// mm_vmscan_wakeup_kswapd on this CPU (allocations that woke kswapd).
    pub kswapd_wakeups: u64,
    /// mm_vmscan_kswapd_wake on this CPU (kswapd starting to run here).
    pub kswapd_runs: u64,
    pub pages_scanned: u64,
    pub pages_reclaimed: u64,
    pub direct: LatencyStats,
    pub memcg: LatencyStats,
    pub slab: LatencyStats,
}

impl CoreStats {
    /// Direct plus memcg reclaim events.
    pub fn reclaim_events(&self) -> u64 {
        self.direct.count + self.memcg.count
    }
}

/// Events folded per core; begin events waiting for their end are kept across batches.
#[derive(Debug, Default)]
pub struct Aggregator {
    pub cores: BTreeMap<usize, CoreStats>,
    /// Per pid: the tasks seen reclaiming (name and pid), for reporting whose path it was.
    pub tasks: BTreeMap<i32, TaskStats>,
    open: HashMap<(i32, &'static str), (f64, usize)>,
    /// The draining thread's own CPU time and run-queue wait ([`Collector`] only): what the
    /// statistics cost the machine they measure.
    pub drain_sched: pagewise_kernel::cpu::SchedStat,
}

/// Reclaim on one task's path.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TaskStats {
    pub task: String,
    /// CPUs its reclaim and slab shrinking began on.
    pub cpus: std::collections::BTreeSet<usize>,
    pub reclaim: LatencyStats,
    pub slab: LatencyStats,
}

impl Aggregator {
    pub fn new() -> Self {
        Self::default()
    }

    /// Fold a batch of events (in trace order).
    pub fn add(&mut self, events: &[TraceEvent]) {
        for e in events {
            let core = self.cores.entry(e.cpu).or_default();
            match e.name.as_str() {
                "mm_vmscan_wakeup_kswapd" => core.kswapd_wakeups += 1,
                "mm_vmscan_kswapd_wake" => core.kswapd_runs += 1,
                "mm_vmscan_lru_shrink_inactive" => {
                    core.pages_scanned += e.field_u64("nr_scanned").unwrap_or(0);
                    core.pages_reclaimed += e.field_u64("nr_reclaimed").unwrap_or(0);
                }
                "mm_vmscan_direct_reclaim_begin" => {
                    self.open.insert((e.pid, "direct"), (e.timestamp, e.cpu));
                }
                "mm_vmscan_memcg_reclaim_begin" => {
                    self.open.insert((e.pid, "memcg"), (e.timestamp, e.cpu));
                }
                "mm_shrink_slab_start" => {
                    self.open.insert((e.pid, "slab"), (e.timestamp, e.cpu));
                }
                "mm_vmscan_direct_reclaim_end" | "mm_vmscan_memcg_reclaim_end" => {
                    let kind = if e.name.contains("direct") { "direct" } else { "memcg" };
                    if let Some((t0, cpu)) = self.open.remove(&(e.pid, kind)) {
                        let ns = ((e.timestamp - t0).max(0.0) * 1e9).round() as u64;
                        let freed = e.field_u64("nr_reclaimed").unwrap_or(0);
                        let c = self.cores.entry(cpu).or_default();
                        if kind == "direct" {
                            c.direct.add(ns, freed);
                        } else {
                            c.memcg.add(ns, freed);
                        }
                        let t = self.tasks.entry(e.pid).or_default();
                        t.task = e.task.clone();
                        t.cpus.insert(cpu);
                        t.reclaim.add(ns, freed);
                    }
                }
                "mm_shrink_slab_end" => {
                    if let Some((t0, cpu)) = self.open.remove(&(e.pid, "slab")) {
                        let ns = ((e.timestamp - t0).max(0.0) * 1e9).round() as u64;
                        let freed = slab_freed(&e.body);
                        self.cores.entry(cpu).or_default().slab.add(ns, freed);
                        let t = self.tasks.entry(e.pid).or_default();
                        t.task = e.task.clone();
                        t.cpus.insert(cpu);
                        t.slab.add(ns, freed);
                    }
                }
                _ => {}
            }
        }
    }

    /// Compute the p99s (see [`LatencyStats`]); [`Collector::finish`] does it for its caller.
    pub fn settle(&mut self) {
        for c in self.cores.values_mut() {
            for l in [&mut c.direct, &mut c.memcg, &mut c.slab] {
                l.settle();
            }
        }
        for t in self.tasks.values_mut() {
            t.reclaim.settle();
            t.slab.settle();
        }
    }

    /// All cores summed.
    pub fn total(&self) -> CoreStats {
        let mut t = CoreStats::default();
        for c in self.cores.values() {
            t.kswapd_wakeups += c.kswapd_wakeups;
            t.kswapd_runs += c.kswapd_runs;
            t.pages_scanned += c.pages_scanned;
            t.pages_reclaimed += c.pages_reclaimed;
            t.direct.merge(&c.direct);
            t.memcg.merge(&c.memcg);
            t.slab.merge(&c.slab);
        }
        t
    }

    /// Reclaim on the paths of tasks matching `pred` (pid, task name), merged.
    pub fn on_paths(&self, pred: impl Fn(i32, &str) -> bool) -> (LatencyStats, LatencyStats) {
        let (mut r, mut s) = (LatencyStats::default(), LatencyStats::default());
        for (pid, t) in &self.tasks {
            if pred(*pid, &t.task) {
                r.merge(&t.reclaim);
                s.merge(&t.slab);
            }
        }
        (r, s)
    }

    /// The paper's Table 2 layout (rows: counters; columns: cores) plus the latency rows.
    pub fn table2(&self, cpus: &[usize]) -> String {
        let mut out = String::new();
        let head: Vec<String> = cpus.iter().map(|c| format!("core {c}")).collect();
        out.push_str(&format!("| | {} |\n|---|{}\n", head.join(" | "), "---:|".repeat(cpus.len())));
        let get = |c: usize| self.cores.get(&c).cloned().unwrap_or_default();
        let mut row = |name: &str, f: &dyn Fn(&CoreStats) -> String| {
            let cells: Vec<String> = cpus.iter().map(|&c| f(&get(c))).collect();
            out.push_str(&format!("| {name} | {} |\n", cells.join(" | ")));
        };
        row("kswapd wake-ups", &|s| s.kswapd_wakeups.to_string());
        row("pages scanned", &|s| s.pages_scanned.to_string());
        row("pages reclaimed", &|s| s.pages_reclaimed.to_string());
        row("kswapd runs here", &|s| s.kswapd_runs.to_string());
        row("direct reclaim: count", &|s| s.direct.count.to_string());
        row("direct reclaim: mean / p99 / max µs", &|s| lat(&s.direct));
        row("memcg reclaim: count", &|s| s.memcg.count.to_string());
        row("memcg reclaim: mean / p99 / max µs", &|s| lat(&s.memcg));
        row("direct+memcg pages reclaimed", &|s| (s.direct.freed + s.memcg.freed).to_string());
        row("slab shrinks: count", &|s| s.slab.count.to_string());
        row("slab shrinks: mean / p99 / max µs", &|s| lat(&s.slab));
        row("slab objects freed", &|s| s.slab.freed.to_string());
        out
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "cores": self.cores,
            "total": self.total(),
            "tasks": self.tasks,
        })
    }
}

fn lat(l: &LatencyStats) -> String {
    if l.count == 0 {
        "–".into()
    } else {
        format!("{:.1} / {:.1} / {:.1}", l.mean_us, l.p99_us, l.max_us)
    }
}

/// mm_shrink_slab_end: "... total_scan N last shrinker return val R" — R objects freed
/// (negative: nothing freed).
fn slab_freed(body: &str) -> u64 {
    body.rsplit_once("return val ").and_then(|(_, v)| v.trim().parse::<i64>().ok()).map_or(0, |v| v.max(0) as u64)
}

/// A running collection: a private trace instance with the vmscan events enabled, drained by a
/// background thread so the per-CPU buffers never overflow. Dropping the guard that created it
/// removes the instance.
pub struct Collector {
    inst: std::sync::Arc<Instance>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<pagewise_kernel::Result<Aggregator>>>,
}

impl Collector {
    /// Enable the events and start draining.
    pub fn start(guard: &SettingsGuard) -> pagewise_kernel::Result<Self> {
        let inst = Instance::create(guard)?;
        inst.set_buffer_kb(4096)?;
        for ev in EVENTS {
            inst.enable("vmscan", ev)?;
        }
        let inst = std::sync::Arc::new(inst);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (i2, s2) = (inst.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("pagewise-stat".into())
            .spawn(move || {
                let mut agg = Aggregator::new();
                let sched0 = pagewise_kernel::cpu::SchedStat::this_thread().unwrap_or_default();
                loop {
                    let done = s2.load(std::sync::atomic::Ordering::Acquire);
                    agg.add(&i2.drain()?);
                    if done {
                        agg.settle();
                        agg.drain_sched =
                            pagewise_kernel::cpu::SchedStat::this_thread().unwrap_or_default().since(&sched0);
                        return Ok(agg);
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
            .expect("spawn stat thread");
        Ok(Collector { inst, stop, thread: Some(thread) })
    }

    /// Stop, disable the events, and return the statistics.
    pub fn finish(mut self) -> pagewise_kernel::Result<Aggregator> {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        let agg = self.thread.take().expect("running").join().expect("stat thread panicked")?;
        for ev in EVENTS {
            self.inst.disable("vmscan", ev)?;
        }
        Ok(agg)
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        for ev in EVENTS {
            let _ = self.inst.disable("vmscan", ev);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagewise_kernel::tracefs::parse_trace;

    const TRACE: &str = "\
          stress-10  [001] .....  10.000000: mm_vmscan_wakeup_kswapd: nid=0 order=0 gfp_flags=GFP_HIGHUSER_MOVABLE
          stress-10  [001] .....  10.000100: mm_vmscan_memcg_reclaim_begin: order=0 gfp_flags=GFP_HIGHUSER_MOVABLE
          stress-10  [001] .....  10.000150: mm_shrink_slab_start: super_cache_scan+0x0/0x1b0 0000000012345678: nid: 0 objects to shrink 0 gfp_flags GFP_KERNEL cache items 100 delta 10 total_scan 10 priority 12
          stress-10  [001] .....  10.000160: mm_shrink_slab_end: super_cache_scan+0x0/0x1b0 0000000012345678: nid: 0 unused scan count 0 new scan count 0 total_scan 0 last shrinker return val 7
          stress-10  [001] .....  10.000200: mm_vmscan_lru_shrink_inactive: nid=0 nr_scanned=32 nr_reclaimed=30 nr_dirty=0 nr_writeback=0 nr_congested=0 nr_immediate=0 nr_activate_anon=0 nr_activate_file=0 nr_ref_keep=0 nr_unmap_fail=0 priority=12 flags=RECLAIM_WB_FILE|RECLAIM_WB_ASYNC
         reclaimd-20  [000] .....  10.000250: mm_vmscan_memcg_reclaim_begin: order=0 gfp_flags=GFP_KERNEL
          stress-10  [001] .....  10.000300: mm_vmscan_memcg_reclaim_end: nr_reclaimed=30
         reclaimd-20  [000] .....  10.001250: mm_vmscan_lru_shrink_inactive: nid=0 nr_scanned=64 nr_reclaimed=64 nr_dirty=0 nr_writeback=0 nr_congested=0 nr_immediate=0 nr_activate_anon=0 nr_activate_file=0 nr_ref_keep=0 nr_unmap_fail=0 priority=12 flags=RECLAIM_WB_FILE|RECLAIM_WB_ASYNC
         reclaimd-20  [000] .....  10.002250: mm_vmscan_memcg_reclaim_end: nr_reclaimed=64
";

    #[test]
    fn attributes_events_to_their_core_and_pairs_per_pid() {
        let mut a = Aggregator::new();
        let ev = parse_trace(TRACE);
        assert_eq!(ev.len(), 9);
        // Split across two drains: pairing survives the batch boundary.
        a.add(&ev[..6]);
        a.add(&ev[6..]);
        a.settle();
        let c1 = &a.cores[&1];
        assert_eq!((c1.kswapd_wakeups, c1.pages_scanned, c1.pages_reclaimed), (1, 32, 30));
        assert_eq!(c1.memcg.count, 1);
        assert!((c1.memcg.max_us - 200.0).abs() < 0.01, "{}", c1.memcg.max_us);
        assert_eq!(c1.memcg.freed, 30);
        assert_eq!((c1.slab.count, c1.slab.freed), (1, 7));
        let c0 = &a.cores[&0];
        assert_eq!((c0.kswapd_wakeups, c0.pages_scanned, c0.memcg.count, c0.memcg.freed), (0, 64, 1, 64));
        assert!((c0.memcg.mean_us - 2000.0).abs() < 0.01);
        assert_eq!(a.total().reclaim_events(), 2);
        let (r, s) = a.on_paths(|_, t| t == "stress");
        assert_eq!((r.count, s.count), (1, 1));
        let t = a.table2(&[0, 1]);
        assert!(t.contains("| kswapd wake-ups | 0 | 1 |"), "{t}");
        assert!(t.contains("| pages scanned | 64 | 32 |"), "{t}");
    }

    #[test]
    fn p99_is_nearest_rank() {
        let mut l = LatencyStats::default();
        for i in (1..=200u64).rev() {
            l.add(i * 1000, 0);
        }
        assert_eq!((l.count, l.max_us), (200, 200.0), "count and max follow each event");
        l.settle();
        assert_eq!(l.count, 200);
        assert_eq!(l.p99_us, 198.0);
        assert_eq!(l.max_us, 200.0);
        assert!((l.mean_us - 100.5).abs() < 1e-9);
    }
}
