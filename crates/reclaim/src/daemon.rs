//! reclaimd: reclaim workers pinned to the reclaim cores.
//!
//! Each worker wakes on a PSI trigger (/proc/pressure/memory, 2 s window: this VM refuses
//! other windows) or its timer, observes free memory, asks the policy how much to reclaim,
//! and reclaims in its own context, so on its own core:
//! - **cgroup scope**: headroom = limit − usage; v2 memory.reclaim, or on v1 (this VM) the
//!   limit-lowering trick ([`MemCgroup::reclaim_in_caller`]): the memcg reclaim runs in the
//!   writer, i.e. on the reclaim core, while the group's own tasks keep finding headroom.
//!   On v1 the worker also wakes when usage crosses its low watermark (a usage threshold
//!   eventfd, moved by a helper thread: registering one waits for an RCU grace period,
//!   [`crate::threshold`]), not only on its timer.
//!   - *Headroom sized to the load*: a fixed headroom cannot hold against an unknown rate, so
//!     the watermarks are raised to what the group uses up (usage grown plus what the worker
//!     reclaimed, per second) during the worker's reaction time (its wake-up plus the rest
//!     of its recent loops; a page pass that frees faster than the load charges does not
//!     count), the way watermark_scale_factor and watermark boost size kswapd's
//!     ([`rate_sized_watermarks`]), the rate measured over windows of at least 50 ms, the
//!     headroom capped at `max_headroom_percent` of the limit: every page kept free is cache
//!     the group lacks.
//!   - *Leave the kernel's LRU balance alone*: the group's memory.stat is read only before a
//!     step, at most every `stat_interval_ms` (unless the step nears the unreclaimable floor
//!     or the last one found less to reclaim than expected), and estimated from usage in
//!     between: each reading flushes the group's statistics, which the kernel's
//!     active/inactive balancing reads.
//!   - *Protected reserve*: with `reclaim_cgroup` the reclaim group gets a standing limit of
//!     the watched group's limit minus `protected_reserve_kb`. A pressure faster than the
//!     worker then meets its own limit, and reclaims on its own core, before the watched
//!     group is full, so the protected siblings never reclaim: at any rate, not only at
//!     rates the worker outruns.
//!   - *Never hurt the workload*: a step never lowers a limit below the group's memory that
//!     reclaim cannot free (anonymous, shmem, unevictable: with no swap, a limit below it is
//!     an OOM kill) nor asks for more than its page cache and reclaimable slab
//!     ([`safe_reclaim_pages`]; between readings, usage grown counts as unreclaimable,
//!     [`GroupMemory::carried_to`]). A limit that cannot be put back stops the daemon: the guard
//!     restores it and reclaimd exits non-zero naming the group.
//! - **system scope**: the lowest-free low-memory zone from /proc/zoneinfo against the core's
//!   per-zone thresholds (kernel rounding), kept above the kernel's own high watermark so the
//!   kernel's kswapd and direct reclaim never start first; reclaim by posix_fadvise(DONTNEED)
//!   on the coldest files under `cache_paths`, drop_caches as the configured last resort;
//!   kswapd pinned to the reclaim cores while running.
//! - **split reclaim** (seed 004): page reclaim uses the hysteresis above with Pstart as its
//!   low; when the group's kernel memory (slab) reaches Sstart the worker runs a bounded slab
//!   batch with vfs_cache_pressure raised for that batch only, and keeps the configured (low)
//!   vfs_cache_pressure otherwise, so reclaim that does happen on an application's path
//!   scans less slab.
//!
//! Every setting changed (limits while lowered, min_free_kbytes, vfs_cache_pressure) goes
//! through the [`SettingsGuard`], whose journal restores it even after SIGKILL.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pagewise_kernel::cgroup::{Composition, MemCgroup, PsiTrigger, PsiTriggerSpec, Reclaimed, Version};
use pagewise_kernel::procfs::{read_vm_sysctl, set_vm_sysctl};
use pagewise_kernel::{cpu, SettingsGuard};
use serde::Serialize;

use crate::config::{Config, ScopeKind};
use crate::policy::{
    rate_sized_watermarks, safe_reclaim_pages, ChargeRate, GroupMemory, Hysteresis, PerCoreTable, Watermarks,
};
use crate::threshold::MovingThreshold;
use crate::tree::Tree;

mod system;
pub use system::effective_zone_watermarks;
use system::{system_reclaim, system_step};

const PAGE_SHIFT: u32 = 12;
const PAGE: u64 = 1 << PAGE_SHIFT;

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// A kernel interface failed.
    #[error(transparent)]
    Kernel(#[from] pagewise_kernel::Error),
    /// The threshold tree could not be created.
    #[error("threshold tree {path}: {source}")]
    Tree { path: PathBuf, source: std::io::Error },
    /// The configuration cannot work on this machine.
    #[error("{0}")]
    Unusable(String),
}

/// What one worker did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct WorkerReport {
    pub cpu: usize,
    /// CPUs the worker was seen running on (should be just `cpu`).
    pub ran_on: BTreeSet<usize>,
    pub wakeups: u64,
    pub psi_wakeups: u64,
    pub reclaim_passes: u64,
    pub reclaimed_bytes: u64,
    pub reclaim_time_ms: f64,
    /// The longest single reclaim pass, as the worker timed it.
    pub max_pass_ms: f64,
    pub slab_passes: u64,
    pub slab_reclaimed_bytes: u64,
    /// Lowest headroom (cgroup) or zone free (system) seen, in pages.
    pub min_free_pages: u64,
    /// Wake-ups by the usage threshold (cgroup v1).
    pub threshold_wakeups: u64,
    /// Steps cut or refused because the group had too little reclaimable memory.
    pub unsafe_steps_refused: u64,
    /// Readings of the group's memory.stat (cgroup scope; each flushes its statistics).
    pub memory_stat_reads: u64,
    /// The highest charge rate seen (MiB/s) and the largest low watermark it led to (MiB).
    pub max_charge_mib_per_s: f64,
    pub max_low_mib: f64,
    /// The longest reaction time (wake-up to end of pass) the watermarks were sized for, ms.
    pub max_reaction_ms: f64,
    /// The worker thread's CPU time and run-queue wait over its life (schedstat).
    pub sched: pagewise_kernel::cpu::SchedStat,
    pub errors: Vec<String>,
}

/// What the daemon did, at stop.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DaemonReport {
    pub workers: Vec<WorkerReport>,
    pub log: Vec<String>,
    /// Why the daemon stopped on its own (a limit it could not restore), if it did.
    pub fatal: Option<String>,
}

enum Scope {
    /// Keep this group's headroom; reclaim from the second group when one is configured.
    Cgroup(MemCgroup, Option<MemCgroup>),
    System {
        cache_paths: Vec<PathBuf>,
        drop_caches: bool,
    },
}

struct Shared {
    table: RwLock<PerCoreTable>,
    guard: Arc<SettingsGuard>,
    /// Held while a reclaim changes the group's limit, and to read limit and usage consistently.
    mech: Mutex<()>,
    stop: AtomicBool,
    log: Mutex<Vec<String>>,
    fatal: Mutex<Option<String>>,
    verbose: bool,
}

impl Shared {
    /// Stop every worker for a reason the operator must see.
    fn die(&self, why: String) {
        self.say(format!("fatal: {why}"));
        self.fatal.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(why);
        self.stop.store(true, Ordering::Release);
    }

    fn say(&self, line: String) {
        if self.verbose {
            eprintln!("reclaimd: {line}");
        }
        self.log.lock().unwrap_or_else(|e| e.into_inner()).push(line);
    }
}

/// A running reclaimd.
pub struct Daemon {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<WorkerReport>>,
    control: Option<JoinHandle<()>>,
}

/// Where and how to run.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The threshold tree's directory (None: no tree).
    pub tree_dir: Option<PathBuf>,
    /// Print the log to stderr as it happens.
    pub verbose: bool,
}

impl Daemon {
    /// Apply the settings and start the workers.
    pub fn start(cfg: &Config, guard: Arc<SettingsGuard>, opts: Options) -> Result<Daemon, DaemonError> {
        let scope = match cfg.scope {
            ScopeKind::Cgroup => {
                let path = cfg.cgroup.clone().expect("validated");
                let cg = MemCgroup::open(&path)?;
                if cg.limit()?.is_none() {
                    return Err(DaemonError::Unusable(format!(
                        "{} has no memory limit: there is no headroom to keep",
                        path.display()
                    )));
                }
                let from = cfg.raw.reclaim_cgroup.as_ref().map(MemCgroup::open).transpose()?;
                if let Some(from) = &from {
                    set_protected_reserve(cfg, &cg, from, &guard)?;
                }
                Scope::Cgroup(cg, from)
            }
            ScopeKind::System => {
                Scope::System { cache_paths: cfg.raw.cache_paths.clone(), drop_caches: cfg.raw.drop_caches_last_resort }
            }
        };
        let shared = Arc::new(Shared {
            table: RwLock::new(cfg.table.clone()),
            guard: guard.clone(),
            mech: Mutex::new(()),
            stop: AtomicBool::new(false),
            log: Mutex::new(Vec::new()),
            fatal: Mutex::new(None),
            verbose: opts.verbose,
        });
        if cfg.raw.apply_global {
            let kb = cfg.table.global_min_free_kbytes();
            check_global(kb).map_err(DaemonError::Unusable)?;
            set_vm_sysctl(&guard, "min_free_kbytes", &kb.to_string())?;
            shared.say(format!("min_free_kbytes = {kb} (sum of the cores' mins)"));
        }
        if let Some(p) = cfg.split.as_ref().and_then(|s| s.vfs_cache_pressure) {
            set_vm_sysctl(&guard, "vfs_cache_pressure", &p.to_string())?;
            shared.say(format!("vfs_cache_pressure = {p} while running"));
        }
        if cfg.raw.pin_kswapd && cfg.scope == ScopeKind::System {
            // The guard gives kswapd its affinity back, also after SIGKILL (its journal).
            for pid in cpu::kswapd_pids()? {
                match cpu::pin_task(&guard, pid, &cfg.reclaim) {
                    Ok(()) => {
                        shared.say(format!("kswapd pid {pid} pinned to {}", cpu::format_cpulist(&cfg.reclaim)));
                    }
                    Err(e) => shared.say(format!("kswapd pid {pid} cannot be pinned: {e}")),
                }
            }
        }
        let tree = match &opts.tree_dir {
            Some(dir) => {
                Some(Tree::create(dir, &cfg.table).map_err(|source| DaemonError::Tree { path: dir.clone(), source })?)
            }
            None => None,
        };
        let scope = Arc::new(scope);
        let mut workers = Vec::new();
        for &c in &cfg.reclaim {
            let (shared, scope, cfg) = (shared.clone(), scope.clone(), cfg.clone());
            workers.push(
                std::thread::Builder::new()
                    .name(format!("reclaimd-cpu{c}"))
                    .spawn(move || worker(c, &cfg, &scope, &shared))
                    .expect("spawn worker"),
            );
        }
        let control = {
            let shared = shared.clone();
            let apply_global = cfg.raw.apply_global;
            std::thread::Builder::new()
                .name("reclaimd-tree".into())
                .spawn(move || control_loop(tree, apply_global, &shared))
                .expect("spawn control")
        };
        Ok(Daemon { shared, workers, control: Some(control) })
    }

    /// The current thresholds.
    pub fn table(&self) -> PerCoreTable {
        self.shared.table.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether a stop was requested (by [`Daemon::request_stop`] or a worker's fatal error).
    pub fn stopping(&self) -> bool {
        self.shared.stop.load(Ordering::Acquire)
    }

    pub fn request_stop(&self) {
        self.shared.stop.store(true, Ordering::Release);
    }

    /// Stop the workers; the guard (dropped by the caller) restores the settings and kswapd's
    /// affinity.
    pub fn stop(mut self) -> DaemonReport {
        self.request_stop();
        let workers = std::mem::take(&mut self.workers).into_iter().filter_map(|w| w.join().ok()).collect();
        if let Some(c) = self.control.take() {
            let _ = c.join();
        }
        let log = std::mem::take(&mut *self.shared.log.lock().unwrap_or_else(|e| e.into_inner()));
        let fatal = self.shared.fatal.lock().unwrap_or_else(|e| e.into_inner()).take();
        DaemonReport { workers, log, fatal }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.request_stop();
        for w in std::mem::take(&mut self.workers) {
            let _ = w.join();
        }
        if let Some(c) = self.control.take() {
            let _ = c.join();
        }
    }
}

/// Give the reclaim group a standing limit of the watched group's limit minus the protected
/// reserve (through the guard: its own limit comes back when the daemon ends).
fn set_protected_reserve(
    cfg: &Config,
    watch: &MemCgroup,
    from: &MemCgroup,
    guard: &SettingsGuard,
) -> Result<(), DaemonError> {
    let limit = watch.limit()?.expect("checked by the caller");
    let first = cfg.reclaim.first().and_then(|&c| cfg.table.get(c)).expect("validated: a reclaim core");
    let reserve = cfg.raw.protected_reserve_kb.map_or(first.watermarks(PAGE_SHIFT).low * PAGE, |kb| kb * 1024);
    if reserve >= limit {
        return Err(DaemonError::Unusable(format!(
            "the protected reserve ({} KiB) is not below the limit of {} ({} KiB)",
            reserve / 1024,
            watch.path().display(),
            limit / 1024
        )));
    }
    let standing = limit - reserve;
    if from.limit()?.is_none_or(|own| own > standing) {
        from.set_limit_guarded(guard, Some(standing))?;
    }
    Ok(())
}

/// A global min_free_kbytes above a quarter of memory would make the kernel reclaim most of
/// the machine at once: refuse it rather than apply it.
fn check_global(kb: u64) -> Result<(), String> {
    let total_kb = pagewise_kernel::procfs::read_meminfo().map(|m| m.mem_total / 1024).unwrap_or(u64::MAX);
    if kb > total_kb / 4 {
        return Err(format!(
            "min_free_kbytes = {kb} (the sum of the cores' mins) is above a quarter of memory ({} KiB)",
            total_kb / 4
        ));
    }
    Ok(())
}

fn control_loop(mut tree: Option<Tree>, mut apply_global: bool, shared: &Shared) {
    while !shared.stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(100));
        let Some(t) = tree.as_mut() else { continue };
        let mut table = shared.table.read().unwrap_or_else(|e| e.into_inner()).clone();
        let (msgs, mut changed) = t.poll(&mut table);
        for m in msgs {
            shared.say(m);
        }
        // `pagewise reclaim set --apply-global` asks a running daemon to apply the sum.
        let flag = t.dir().join("apply_global");
        if !apply_global && std::fs::read_to_string(&flag).is_ok_and(|s| s.trim() == "1") {
            apply_global = true;
            changed = true;
            shared.say("apply_global requested through the tree".into());
        }
        if changed {
            let kb = table.global_min_free_kbytes();
            *shared.table.write().unwrap_or_else(|e| e.into_inner()) = table;
            if apply_global {
                if let Err(e) = check_global(kb) {
                    shared.say(format!("not applied: {e}"));
                } else if let Err(e) = set_vm_sysctl(&shared.guard, "min_free_kbytes", &kb.to_string()) {
                    shared.say(format!("cannot apply min_free_kbytes = {kb}: {e}"));
                }
            }
        }
    }
    if let Some(t) = tree {
        t.remove();
    }
}

fn worker(cpu_id: usize, cfg: &Config, scope: &Scope, shared: &Shared) -> WorkerReport {
    let rep = WorkerReport { cpu: cpu_id, min_free_pages: u64::MAX, ..Default::default() };
    let sched0 = cpu::SchedStat::this_thread().unwrap_or_default();
    let rep = worker_loop(cpu_id, cfg, scope, shared, rep);
    WorkerReport { sched: cpu::SchedStat::this_thread().unwrap_or_default().since(&sched0), ..rep }
}

fn worker_loop(cpu_id: usize, cfg: &Config, scope: &Scope, shared: &Shared, mut rep: WorkerReport) -> WorkerReport {
    if let Err(e) = cpu::pin_to(cpu_id) {
        rep.errors.push(format!("pin to cpu {cpu_id}: {e}"));
        shared.stop.store(true, Ordering::Release);
        return rep;
    }
    if cfg.raw.worker_rt_priority > 0 {
        if let Err(e) = cpu::set_fifo_priority(i32::from(cfg.raw.worker_rt_priority)) {
            shared.say(format!("cpu{cpu_id}: SCHED_FIFO refused ({e}); normal scheduling"));
        }
    }
    let psi = PsiTrigger::system_memory(PsiTriggerSpec {
        full: false,
        stall: Duration::from_millis(cfg.raw.psi_stall_ms.clamp(1, 2000)),
        window: Duration::from_secs(2),
    });
    let psi = match psi {
        Ok(p) => Some(p),
        Err(e) => {
            shared.say(format!("cpu{cpu_id}: no PSI trigger ({e}); timer only"));
            None
        }
    };
    let batch_pages = (cfg.batch_kb * 1024 / PAGE).max(1);
    let pass = Duration::from_millis(cfg.raw.pass_ms);
    let mut hyst: BTreeMap<usize, Hysteresis> = BTreeMap::new();
    let mut raised_warned = false;
    let mut load = LoadSizing::new(
        cfg.interval,
        cfg.raw.max_headroom_percent,
        cpu_id,
        Duration::from_millis(cfg.raw.stat_interval_ms),
    );
    // A pass that freed memory but left free below high is followed at once, not after the
    // timer: the hysteresis is still running and the load is still charging.
    let mut again = false;
    while !shared.stop.load(Ordering::Acquire) {
        let timeout = if again { Duration::ZERO } else { cfg.interval };
        match (load.threshold.as_ref().filter(|t| t.armed_at().is_some()), &psi) {
            (Some(t), _) => rep.threshold_wakeups += u64::from(t.wait(timeout).unwrap_or(false)),
            (None, Some(p)) => rep.psi_wakeups += u64::from(p.wait(timeout).unwrap_or(false)),
            (None, None) => std::thread::sleep(timeout),
        }
        again = false;
        let woke = Instant::now();
        // How long a page pass ran that freed memory faster than the load charged it.
        let mut outpaced = Duration::ZERO;
        rep.wakeups += 1;
        rep.ran_on.insert(cpu::current_cpu());
        let Some(mut core) = shared.table.read().unwrap_or_else(|e| e.into_inner()).get(cpu_id) else { continue };
        if let Some(p) = cfg.split.as_ref().and_then(|s| s.pstart_kb) {
            // Split reclaim: Pstart is the worker's low (in % of its min, as the tree holds it).
            let min = core.min_free_kbytes.max(1);
            core.pages_low_ratio = (p * 100 / min).clamp(100, u64::from(crate::policy::MAX_RATIO)) as u32;
            core.pages_high_ratio = core.pages_high_ratio.max(core.pages_low_ratio);
        }
        let step = match scope {
            Scope::Cgroup(cg, from) => {
                cgroup_step(cg, from.as_ref(), core.watermarks(PAGE_SHIFT), batch_pages, &mut hyst, &mut load, shared)
            }
            Scope::System { .. } => system_step(&core, batch_pages, &mut hyst, &mut raised_warned, shared),
        };
        let (free, need, limit) = match step {
            Ok(s) => s,
            Err(e) => {
                rep.errors.push(e.to_string());
                continue;
            }
        };
        rep.min_free_pages = rep.min_free_pages.min(free);
        rep.unsafe_steps_refused = load.refused;
        rep.memory_stat_reads = load.stat_reads;
        rep.max_charge_mib_per_s = rep.max_charge_mib_per_s.max(load.rate.pages_per_s() * PAGE as f64 / 1048576.0);
        rep.max_low_mib = rep.max_low_mib.max((load.low_pages * PAGE) as f64 / 1048576.0);
        if need > 0 {
            let t = Instant::now();
            let got = match scope {
                Scope::Cgroup(cg, from) => {
                    let _l = shared.mech.lock().unwrap_or_else(|e| e.into_inner());
                    match from {
                        Some(from) => from
                            .limit()
                            .and_then(|own| from.reclaim_in_caller_within(&shared.guard, need * PAGE, own, Some(pass))),
                        None => cg.reclaim_in_caller_within(&shared.guard, need * PAGE, limit, Some(pass)),
                    }
                }
                Scope::System { cache_paths, drop_caches } => system_reclaim(need * PAGE, cache_paths, *drop_caches),
            };
            let took = t.elapsed();
            let ms = took.as_secs_f64() * 1e3;
            rep.reclaim_time_ms += ms;
            rep.max_pass_ms = rep.max_pass_ms.max(ms);
            rep.reclaim_passes += 1;
            match got {
                Ok(Reclaimed { bytes: b, exhausted }) => {
                    if b > 0 {
                        outpaced = took;
                    }
                    rep.reclaimed_bytes += b;
                    load.reclaimed_pages += b / PAGE;
                    again = b > 0 && hyst.values().any(|h| h.active);
                    if exhausted {
                        // Less reclaimable than the estimate said: read the composition
                        // before the next step.
                        load.read = None;
                    }
                }
                Err(e @ pagewise_kernel::Error::LimitNotRestored { .. }) => {
                    rep.errors.push(e.to_string());
                    shared.die(e.to_string());
                    break;
                }
                Err(e) => rep.errors.push(e.to_string()),
            }
        }
        if let (Some(split), Scope::Cgroup(cg, _)) = (&cfg.split, scope) {
            match slab_step(cg, split, limit, pass, shared) {
                Ok(Some(b)) => {
                    rep.slab_passes += 1;
                    rep.slab_reclaimed_bytes += b;
                }
                Ok(None) => {}
                Err(e @ pagewise_kernel::Error::LimitNotRestored { .. }) => {
                    rep.errors.push(e.to_string());
                    shared.die(e.to_string());
                    break;
                }
                Err(e) => rep.errors.push(e.to_string()),
            }
        }
        // A page pass that lowered usage freed pages faster than the load charged them (about
        // 3 GB/s against 0.6 on the file-server load): free memory was lowest when it began,
        // so only the rest of the loop counts. One that did not counts whole.
        load.reacted(woke.elapsed().saturating_sub(outpaced));
        rep.max_reaction_ms = rep.max_reaction_ms.max(load.reaction_s() * 1e3);
        if rep.errors.len() > 100 {
            shared.say(format!("cpu{cpu_id}: too many errors, stopping: {}", rep.errors.last().expect("nonempty")));
            shared.stop.store(true, Ordering::Release);
        }
    }
    rep
}

/// What a cgroup-scope worker learns about its load: the group's charge rate, its own
/// reaction time, and the usage threshold that wakes it at its (rate-sized) low watermark.
struct LoadSizing {
    rate: ChargeRate,
    /// The last reaction times (a loop's time besides a page pass that freed memory), newest
    /// last.
    reactions: std::collections::VecDeque<Duration>,
    /// How late a wake-up can be: the timer's interval without a threshold, else ~1 ms.
    interval: Duration,
    /// The usage threshold, moved by a helper thread (registering one blocks for an RCU
    /// grace period); None before the first arm, on v2, or after arming failed.
    threshold: Option<MovingThreshold>,
    /// Arming failed once (said in the log): the timer alone wakes the worker.
    threshold_failed: bool,
    last: Option<Instant>,
    /// Pages the worker reclaimed so far (for the charge counter where the kernel has none).
    reclaimed_pages: u64,
    low_pages: u64,
    refused: u64,
    /// The cap of the rate-sized headroom, in % of the limit.
    max_headroom_percent: u32,
    /// The worker's core (names the threshold's helper thread).
    cpu: usize,
    /// The group's composition as last read, and when (None: read it before the next step).
    read: Option<(GroupMemory, Instant)>,
    /// How old that reading may get before a step reads it again.
    stat_interval: Duration,
    /// memory.stat readings so far.
    stat_reads: u64,
}

impl LoadSizing {
    /// Reaction times remembered: the watermarks are sized for the worst of these.
    const WINDOW: usize = 32;

    fn new(interval: Duration, max_headroom_percent: u32, cpu: usize, stat_interval: Duration) -> Self {
        LoadSizing {
            cpu,
            read: None,
            stat_interval,
            stat_reads: 0,
            max_headroom_percent,
            rate: ChargeRate::default(),
            reactions: Default::default(),
            interval,
            threshold: None,
            threshold_failed: false,
            last: None,
            reclaimed_pages: 0,
            low_pages: 0,
            refused: 0,
        }
    }

    fn reacted(&mut self, took: Duration) {
        if self.reactions.len() == Self::WINDOW {
            self.reactions.pop_front();
        }
        self.reactions.push_back(took);
    }

    /// Seconds from free memory crossing low until the worker's next page pass starts freeing
    /// more than the load charges: its wake-up, plus the longest of its recent loops besides
    /// the page passes that did (reading the group, a slab batch, a pass that fell behind).
    fn reaction_s(&self) -> f64 {
        let armed = self.threshold.as_ref().is_some_and(|t| t.armed_at().is_some());
        let wake = if armed { Duration::from_millis(1) } else { self.interval };
        (wake + self.reactions.iter().max().copied().unwrap_or_default()).as_secs_f64()
    }

    /// The group's memory for a step of `want` pages: memory.stat read afresh when there is
    /// no reading (none yet, or the last step freed less than it asked), when it is older
    /// than the stat interval, or when the step comes near the unreclaimable floor; else the
    /// last reading carried forward to `usage` ([`GroupMemory::carried_to`]). Reading
    /// memory.stat flushes the group's statistics, and the kernel balances its active and
    /// inactive lists by them: a worker that read them every 2 ms kept them fresh where the
    /// kernel alone lets them age for up to 2 s, and the file-server load then kept different
    /// pages and read 15–20% more from disk (issue 23).
    fn memory(
        &mut self,
        target: &MemCgroup,
        usage: u64,
        want: u64,
        now: Instant,
        shared: &Shared,
    ) -> pagewise_kernel::Result<GroupMemory> {
        if let Some((m, at)) = self.read {
            let carried = m.carried_to(usage);
            if now.duration_since(at) < self.stat_interval && !carried.near_floor(want) {
                return Ok(carried);
            }
        }
        let m = {
            let _l = shared.mech.lock().unwrap_or_else(|e| e.into_inner());
            group_memory(&target.composition()?)
        };
        self.stat_reads += 1;
        self.read = Some((m, now));
        Ok(m)
    }

    /// Ask for the usage threshold at `limit - low` when the one armed (or being armed) is off
    /// by more than an eighth of low, and put in place one the helper has finished.
    fn arm(&mut self, target: &MemCgroup, limit: u64, low_bytes: u64) -> pagewise_kernel::Result<()> {
        if target.version() != Version::V1 || self.threshold_failed {
            return Ok(());
        }
        let t = match &mut self.threshold {
            Some(t) => t,
            None => match MovingThreshold::new(target.clone(), format!("reclaimd-arm{}", self.cpu)) {
                Ok(t) => self.threshold.insert(t),
                Err(e) => {
                    self.threshold_failed = true;
                    return Err(pagewise_kernel::Error::Invalid(format!("no helper thread to arm it: {e}")));
                }
            },
        };
        t.want(limit.saturating_sub(low_bytes), low_bytes / 8);
        if let Err(e) = t.settle() {
            self.threshold_failed = true;
            self.threshold = None;
            return Err(e);
        }
        Ok(())
    }
}

/// (free pages, pages to reclaim, the group's limit)
type Step = pagewise_kernel::Result<(u64, u64, Option<u64>)>;

/// Pages the limit may never be lowered into beyond the unreclaimable memory: 4 MiB, so the
/// kernel's own allocations for the group (page tables, the next charges) still fit.
const SAFETY_MARGIN_PAGES: u64 = 1024;
/// The smallest step worth lowering a limit for: 1 MiB.
const MIN_STEP_PAGES: u64 = 256;

fn cgroup_step(
    cg: &MemCgroup,
    from: Option<&MemCgroup>,
    base: Watermarks,
    batch: u64,
    hyst: &mut BTreeMap<usize, Hysteresis>,
    load: &mut LoadSizing,
    shared: &Shared,
) -> Step {
    let target = from.unwrap_or(cg);
    // Limits and usage only: memory.stat is read when a step needs it (see LoadSizing::memory).
    let (limit, usage, own_limit, own_usage) = {
        let _l = shared.mech.lock().unwrap_or_else(|e| e.into_inner());
        let usage = cg.usage()?;
        let own_usage = if from.is_some() { target.usage()? } else { usage };
        (cg.limit()?, usage, target.limit()?, own_usage)
    };
    let Some(lim) = limit else { return Ok((u64::MAX, 0, None)) };
    // The headroom that counts is the smaller of the watched group's and, with a reclaim
    // group, that group's own (under its standing limit).
    let mut free = lim.saturating_sub(usage) / PAGE;
    let own_lim = own_limit.unwrap_or(lim).min(lim);
    if from.is_some() {
        free = free.min(own_lim.saturating_sub(own_usage) / PAGE);
    }
    let now = Instant::now();
    let dt = load.last.map_or(0.0, |l| now.duration_since(l).as_secs_f64());
    load.last = Some(now);
    // The rate the headroom is used up at: usage grown plus what the worker reclaimed (the
    // group's net charges; pages it freed itself, by truncation, use none of the headroom).
    let rate = load.rate.observe(own_usage / PAGE + load.reclaimed_pages, dt);
    let cap = own_lim / PAGE * u64::from(load.max_headroom_percent) / 100;
    let wm = rate_sized_watermarks(base, rate, load.reaction_s(), cap);
    load.low_pages = wm.low;
    if let Err(e) = load.arm(target, own_lim, wm.low * PAGE) {
        shared.say(format!("usage threshold on {} not armed ({e}); timer only", target.path().display()));
    }
    // A pass may take up to one reaction time's worth of charges, so the batch grows with it.
    let batch = batch.max(wm.high - wm.low);
    let want = hyst.entry(0).or_default().step(free, wm, batch);
    if want == 0 {
        return Ok((free, 0, limit));
    }
    let memory = load.memory(target, own_usage / PAGE, want, now, shared)?;
    let need = safe_reclaim_pages(want, memory, SAFETY_MARGIN_PAGES, MIN_STEP_PAGES);
    if need < want {
        load.refused += 1;
    }
    Ok((free, need, limit))
}

/// The group's memory in pages, as [`safe_reclaim_pages`] weighs it. Mapped file pages (the
/// workload's code, its mmap'd data) do not count as reclaimable: taking them would only
/// make the workload fault them back in.
fn group_memory(c: &Composition) -> GroupMemory {
    GroupMemory {
        usage: c.usage / PAGE,
        reclaimable: (c.file.saturating_sub(c.file_mapped) + c.slab_reclaimable) / PAGE,
        unreclaimable: c.unreclaimable / PAGE,
    }
}

/// Split reclaim's slab batch: when the group's kernel memory is at or above Sstart, reclaim
/// one batch with vfs_cache_pressure raised for that batch.
fn slab_step(
    cg: &MemCgroup,
    split: &crate::config::SplitConfig,
    limit: Option<u64>,
    pass: Duration,
    shared: &Shared,
) -> pagewise_kernel::Result<Option<u64>> {
    let Some(lim) = limit else { return Ok(None) };
    let slab = cg.slab_bytes()?;
    let sstart = split.sstart_kb.map_or(lim / 100 * u64::from(split.sstart_percent), |k| k * 1024);
    let d = crate::policy::split_decide(
        crate::policy::SplitThresholds { pstart: 0, pstop: 0, sstart: sstart / PAGE, sstop: sstart / PAGE * 9 / 10 },
        u64::MAX,
        slab / PAGE,
        0,
        (split.slab_batch_kb * 1024 / PAGE).max(1),
    );
    if d.slab == 0 {
        return Ok(None);
    }
    let _l = shared.mech.lock().unwrap_or_else(|e| e.into_inner());
    let want = safe_reclaim_pages(d.slab, group_memory(&cg.composition()?), SAFETY_MARGIN_PAGES, MIN_STEP_PAGES);
    if want == 0 {
        return Ok(None);
    }
    let normal = split.vfs_cache_pressure.map(|p| p.to_string()).unwrap_or(read_vm_sysctl("vfs_cache_pressure")?);
    set_vm_sysctl(&shared.guard, "vfs_cache_pressure", &split.slab_pass_pressure.to_string())?;
    let got = cg.reclaim_in_caller_within(&shared.guard, want * PAGE, limit, Some(pass));
    set_vm_sysctl(&shared.guard, "vfs_cache_pressure", &normal)?;
    let before = slab;
    let after = cg.slab_bytes()?;
    got?;
    Ok(Some(before.saturating_sub(after)))
}
