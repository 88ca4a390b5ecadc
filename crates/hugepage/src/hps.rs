//! The HPS runtime of one process: tracked arenas, the tracking thread, notification, and the
//! decision step (`sigpagesz_handler` in the seed) that promotes or compacts. This file is the
//! API and the shared state; `hps/period.rs` is what each tracking period does, `hps/service.rs`
//! how the application hears of active pages by signal, `hps/late.rs` late routing.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use pagewise_kernel::mem::{MapOptions, Mapping, HUGE_PMD};
use pagewise_kernel::signal;
use pagewise_track::{report, Delivery, MinorTracker, RegionMode, TrackedArena, TrackerStats, PAGE};

use crate::compact::HugeArena;
use crate::fairness::{self, Budget};
use crate::fill::FirstTouch;
use crate::pace::{ChargedPace, Pace};
use crate::policy::{Backoff, ConvergeRule, Convergence, Decision, RegionRule, RegionView, TrackState};
use crate::{Error, Result};

mod fill_watch;
mod late;
mod period;
mod service;

use fill_watch::FillWatch;
use period::{active_pages, classify, notify, plan_cfg, process, publish_live, published_ranges, tracking_loop};

/// How the process hears about active pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Notify {
    /// No signal; the application calls [`Hps::process`] when it likes.
    None,
    /// A signal handler wakes an HPS service thread that runs the decision step.
    Handler,
    /// The application blocks a thread in [`Hps::wait_signal`].
    Wait,
}

/// Configuration of HPS in one process.
#[derive(Clone, Debug)]
pub struct HpsConfig {
    /// Tracking period while there is work (ms).
    pub interval_ms: u64,
    /// Longest period once nothing new is found (ms): tracking thins out.
    pub max_interval_ms: u64,
    /// A page is active once its acscount reaches this.
    pub active_threshold: u32,
    /// The region rule.
    pub rule: RegionRule,
    /// Pages of a region armed per period while sampling (a chunk; 64 = 1/8 region).
    pub sample_pages: usize,
    /// Pages armed per period over all arenas.
    pub budget_pages: usize,
    pub notify: Notify,
    /// The notification signal is SIGRTMIN + this.
    pub signal_offset: i32,
    /// Publish counts under /run/pagewise/hps/PID.acs for `pagewise hps report`.
    pub publish: bool,
    /// Take part in the host-wide hugepage budget of this many hugepages (None: no limit).
    pub host_hugepages: Option<u64>,
    /// How minor faults reach the tracker (None: SIGBUS, or the handler thread when SIGBUS
    /// delivery is unavailable). The handler thread also serves faults the kernel takes on the
    /// program's behalf (read(2) into tracked memory), which SIGBUS delivery fails with EFAULT.
    pub delivery: Option<Delivery>,
    /// Stop tracking once placement converged and resume on drift or new memory, run by the
    /// tracking thread itself (one step per period; see [`ConvergeRule`]). None: the tracker
    /// only thins out, and the application stops it with [`Hps::set_tracking`] if it likes.
    pub converge: Option<ConvergeRule>,
    /// Pages of a region armed by a probe while converged (a cheap sample).
    pub probe_pages: usize,
    /// Print tracking state changes on stderr (`pagewise hps run`).
    pub log_state: bool,
    /// Under the handler thread: while the program has one thread, keep the handler on its CPU
    /// (`pagewise_kernel::colocate`; `pagewise hps run`). Off by default: it sets the
    /// affinity of the application's thread, which an application embedding HPS may manage
    /// itself.
    pub colocate: bool,
    /// Give regions ahead of a dense fill a hugepage at their first touch ([`crate::fill`];
    /// `pagewise hps run`), always or while hugepages are cheap. Needs a tmpfs of its own
    /// (CAP_SYS_ADMIN); without it, off.
    pub first_touch: FirstTouch,
    /// Pace promotion to a share of wall time in collapse CPU time ([`crate::pace`];
    /// `pagewise hps run`, whose program may end before a promotion pays), the pace at the
    /// start of the run. None: promote as soon as the rule says (an application that embeds
    /// HPS runs on).
    pub pace: Option<Pace>,
    /// Pace tracking the same way: what observing costs (the fault handler's CPU time and the
    /// time spent arming pages) to a share of wall time; a period the pace does not allow is
    /// skipped (`pagewise hps run`). None: a period every interval.
    pub track_pace: Option<Pace>,
    /// Late routing ([`crate::late`]): arenas from [`Hps::alloc`] start as the program's own
    /// private memory and move into tracked memory once this old, region by region as the
    /// promotion pace allows (`pagewise hps run`, whose program may end before tracked memory
    /// pays). None: tracked memory from the start.
    pub late_routing: Option<Duration>,
}

impl Default for HpsConfig {
    fn default() -> Self {
        HpsConfig {
            interval_ms: 20,
            max_interval_ms: 320,
            active_threshold: 1,
            rule: RegionRule::default(),
            sample_pages: 64,
            budget_pages: 1 << 18,
            notify: Notify::None,
            signal_offset: 2,
            publish: true,
            host_hugepages: None,
            delivery: None,
            converge: None,
            probe_pages: 8,
            log_state: false,
            colocate: false,
            first_touch: FirstTouch::Off,
            pace: None,
            track_pace: None,
            late_routing: None,
        }
    }
}

/// An active page and its count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct ActivePage {
    pub addr: usize,
    pub count: u32,
}

/// What one decision step did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub promoted: u32,
    pub compacted_pages: u32,
    pub observe_fully: u32,
    pub deferred: u32,
}

/// Counters of the runtime.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HpsStats {
    pub tracker: TrackerStats,
    pub promoted_regions: u64,
    pub compacted_pages: u64,
    pub collapse_failures: u64,
    /// Promotions the pace put off to a later decision step ([`HpsConfig::pace`]).
    pub paced_promotions: u64,
    /// Promotions put off because the region held too little data ([`RegionRule::min_filled`]).
    pub unfilled_promotions: u64,
    /// Tracking periods the tracking pace skipped ([`HpsConfig::track_pace`]).
    pub paced_periods: u64,
    /// Late routing ([`HpsConfig::late_routing`]): arenas made young, regions moved into
    /// tracked memory, the pages copied, the CPU time it took, and moves that failed.
    pub moved_in_regions: u64,
    pub moved_in_pages: u64,
    pub move_in_ns: u64,
    pub move_in_failures: u64,
    pub young_arenas: u64,
    /// Regions advised ahead of a dense fill (a hugepage at their first touch).
    pub first_touch_regions: u64,
    /// Regions of windows ahead of a dense fill declined because hugepages were dear.
    pub first_touch_declined: u64,
    pub notifications_sent: u64,
    pub notifications_received: u64,
    pub decision_steps: u64,
    pub collapse_ns: u64,
    /// Tracking stopped because placement converged (with [`HpsConfig::converge`]).
    pub converged: bool,
    /// Times tracking converged, restarted, and probes run while converged.
    pub converge_stops: u64,
    pub converge_restarts: u64,
    pub probes: u64,
    /// When the program began serving ([`Hps::program_serves`]), ns after the start.
    pub serving_since_ns: Option<u64>,
}

/// The application's override of the region rule: `Some(decision)` or `None` for the default.
pub type DecideFn = Box<dyn FnMut(usize, &RegionView) -> Option<Decision> + Send>;
/// The application's compaction: move the objects on these pages; returns how many pages it
/// moved (their counts are forgotten either way).
pub type CompactFn = Box<dyn FnMut(&[ActivePage]) -> usize + Send>;

#[derive(Default)]
struct Callbacks {
    decide: Option<DecideFn>,
    compact: Option<CompactFn>,
}

struct Shared {
    cfg: Mutex<HpsConfig>,
    tracker: MinorTracker,
    arenas: Mutex<Vec<TrackedArena>>,
    /// Each tracked arena's range in the tracker, by arena id ([`TrackedArena::id`]); taken
    /// under the arenas lock. Not looked up by address: arenas' spans overlap (one placed in
    /// another's hole), and a page an arena no longer tracks lies in the span of another's
    /// range too, so the untracked range could be the wrong one — the right one then went on
    /// being armed after its arena was freed and unmapped.
    ranges: Mutex<HashMap<usize, Arc<pagewise_track::TrackedRange>>>,
    huge: Mutex<HugeArena>,
    callbacks: Mutex<Callbacks>,
    backoff: Mutex<Backoff>,
    /// Promotion's pace (with [`HpsConfig::pace`]).
    pace: Mutex<Option<Pace>>,
    /// Tracking's pace (with [`HpsConfig::track_pace`]).
    track_pace: Mutex<Option<ChargedPace>>,
    /// When a tracked fault was last timed, and what it cost (`period::fault_cost`).
    fault_timed: Mutex<Option<(Instant, period::FaultCost)>>,
    budget: Mutex<Option<Budget>>,
    tracking: AtomicBool,
    stop: AtomicBool,
    outstanding: AtomicBool,
    target_tid: AtomicI32,
    sig: i32,
    epoch: Instant,
    idle_periods: AtomicU32,
    conv: Mutex<Option<Convergence>>,
    converged: AtomicBool,
    new_memory: AtomicBool,
    /// The tracking thread, to wake it when its sleep should end early (see [`Shared::wake`]).
    tracking_thread: OnceLock<Thread>,
    /// Decisions made by decision steps (promotions, compacted pages, regions observed fully).
    decisions: AtomicU64,
    /// Promotions put off to a later step (the pace, the backoff): work still to do, so
    /// tracking has not converged while there are any.
    deferrals: AtomicU64,
    promoted: AtomicU64,
    compacted: AtomicU64,
    collapse_failures: AtomicU64,
    /// Promotions put off by the pace.
    paced: AtomicU64,
    /// Promotions put off because the region was not filled enough ([`RegionRule::min_filled`]).
    unfilled: AtomicU64,
    /// Tracking periods skipped by tracking's pace.
    paced_periods: AtomicU64,
    /// [`HpsStats::serving_since_ns`]; `u64::MAX`: not serving.
    serving_since_ns: AtomicU64,
    /// First-touch hugepages ahead of dense fills, when configured and possible.
    fill: Option<FillWatch>,
    /// Young arenas (late routing): their ids ([`TrackedArena::id`]: a view's address may be
    /// another arena's too, one placed where the program unmapped a young one's start) and
    /// when they were made (ns after the start), oldest first.
    young: Mutex<Vec<(usize, u64)>>,
    /// What holds writers back while a region moves in (None: late routing off or impossible).
    move_in_uffd: Option<pagewise_kernel::uffd::Uffd>,
    moved_regions: AtomicU64,
    moved_pages: AtomicU64,
    move_in_ns: AtomicU64,
    move_in_failures: AtomicU64,
    young_made: AtomicU64,
    /// Regions the kernel refused to collapse, and how often (see `period::MAX_REFUSALS`).
    refusals: Mutex<HashMap<usize, u32>>,
    collapse_ns: AtomicU64,
    sent: AtomicU64,
    received: AtomicU64,
    steps: AtomicU64,
}

impl Shared {
    /// Arena `id`'s range in the tracker, if it is tracked (under the arenas lock).
    fn range_of_arena(&self, id: usize) -> Option<Arc<pagewise_track::TrackedRange>> {
        self.ranges.lock().expect("ranges lock").get(&id).cloned()
    }

    /// The tracked range of arena `id`, which holds `addr`: None while the arena is young
    /// (never tracked). Under the arenas lock, which decides between the two (`hps/late.rs`).
    fn range_unless_young(&self, id: usize, addr: usize) -> Result<Option<Arc<pagewise_track::TrackedRange>>> {
        if self.is_young(id) {
            return Ok(None);
        }
        Ok(Some(self.range_of_arena(id).ok_or(pagewise_track::Error::NotTracked(addr))?))
    }

    /// Record arena `id`'s range (None: forget it); returns what was recorded before.
    fn set_range(
        &self,
        id: usize,
        range: Option<Arc<pagewise_track::TrackedRange>>,
    ) -> Option<Arc<pagewise_track::TrackedRange>> {
        let mut ranges = self.ranges.lock().expect("ranges lock");
        match range {
            Some(r) => ranges.insert(id, r),
            None => ranges.remove(&id),
        }
    }
}

/// HPS in this process.
pub struct Hps {
    shared: Arc<Shared>,
    tracker_thread: Option<JoinHandle<()>>,
    /// The service thread and the write end of its pipe (handler mode only).
    service: Mutex<Option<(JoinHandle<()>, OwnedFd)>>,
}

impl Hps {
    /// Start HPS: open the tracker and start the tracking thread (tracking on).
    pub fn start(cfg: HpsConfig) -> Result<Self> {
        let fraction = |f: f64| (0.0..=1.0).contains(&f);
        if !fraction(cfg.rule.promote_fraction)
            || !fraction(cfg.rule.min_filled)
            || cfg.sample_pages == 0
            || cfg.budget_pages == 0
        {
            return Err(Error::Invalid(
                "promote_fraction and min_filled must be in [0,1], sample and budget pages > 0".into(),
            ));
        }
        let sig = signal::rt_signal(cfg.signal_offset)?;
        let budget = match cfg.host_hugepages {
            Some(total) => Some(Budget::join(fairness::default_path(), total, signal::getpid())?),
            None => None,
        };
        let notify = cfg.notify;
        let first_touch = cfg.first_touch;
        let conv = cfg.converge.map(Convergence::new);
        let pace = cfg.pace;
        let track_pace = cfg.track_pace.map(ChargedPace::new);
        let move_in_uffd = cfg.late_routing.and_then(|_| late::open_uffd());
        // The runtime's threads besides the program's: the tracking thread, the service
        // thread (with Notify::Handler) and the tracker's handler thread.
        let own_threads = 2 + u32::from(notify == Notify::Handler);
        let tracker = match cfg.delivery {
            Some(d) => MinorTracker::with_options(d, cfg.colocate.then_some(own_threads))?,
            None => MinorTracker::new()?,
        };
        let shared = Arc::new(Shared {
            cfg: Mutex::new(cfg),
            tracker,
            arenas: Mutex::new(Vec::new()),
            ranges: Mutex::new(HashMap::new()),
            huge: Mutex::new(HugeArena::new()),
            callbacks: Mutex::new(Callbacks::default()),
            backoff: Mutex::new(Backoff::default()),
            pace: Mutex::new(pace),
            track_pace: Mutex::new(track_pace),
            fault_timed: Mutex::new(None),
            budget: Mutex::new(budget),
            tracking: AtomicBool::new(true),
            stop: AtomicBool::new(false),
            outstanding: AtomicBool::new(false),
            target_tid: AtomicI32::new(0),
            sig,
            epoch: Instant::now(),
            idle_periods: AtomicU32::new(0),
            conv: Mutex::new(conv),
            converged: AtomicBool::new(false),
            new_memory: AtomicBool::new(false),
            tracking_thread: OnceLock::new(),
            decisions: AtomicU64::new(0),
            deferrals: AtomicU64::new(0),
            promoted: AtomicU64::new(0),
            compacted: AtomicU64::new(0),
            collapse_failures: AtomicU64::new(0),
            paced: AtomicU64::new(0),
            unfilled: AtomicU64::new(0),
            paced_periods: AtomicU64::new(0),
            serving_since_ns: AtomicU64::new(u64::MAX),
            fill: match first_touch {
                FirstTouch::Off => None,
                FirstTouch::Priced => FillWatch::new(true),
                FirstTouch::Always => FillWatch::new(false),
            },
            young: Mutex::new(Vec::new()),
            move_in_uffd,
            moved_regions: AtomicU64::new(0),
            moved_pages: AtomicU64::new(0),
            move_in_ns: AtomicU64::new(0),
            move_in_failures: AtomicU64::new(0),
            young_made: AtomicU64::new(0),
            refusals: Mutex::new(HashMap::new()),
            collapse_ns: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            received: AtomicU64::new(0),
            steps: AtomicU64::new(0),
        });
        let s = shared.clone();
        let tracker_thread =
            signal::spawn_blocking_signals(std::thread::Builder::new().name("pw-hps-track".into()), move || {
                tracking_loop(&s)
            })
            .map_err(|e| Error::Io { path: "thread spawn".into(), source: e })?;
        let hps = Hps { shared, tracker_thread: Some(tracker_thread), service: Mutex::new(None) };
        if notify == Notify::Handler {
            hps.start_service()?;
        }
        Ok(hps)
    }

    /// Memory HPS tracks: a 2 MiB aligned arena of at least `len` bytes.
    pub fn alloc(&self, len: usize) -> Result<*mut u8> {
        if self.shared.new_arena_young() {
            let arena = TrackedArena::young("pagewise-hps", len)?;
            let (p, id) = (arena.as_ptr(), arena.id());
            let born = self.shared.epoch.elapsed().as_nanos() as u64;
            self.shared.arenas.lock().expect("arenas lock").push(arena);
            self.shared.young.lock().expect("young lock").push((id, born));
            self.shared.young_made.fetch_add(1, Ordering::Relaxed);
            return Ok(p);
        }
        let arena = match &self.shared.fill {
            Some(f) => f.new_arena("pagewise-hps", len)?,
            None => TrackedArena::new("pagewise-hps", len)?,
        };
        let range = self.shared.tracker.track(arena.addr(), arena.len())?;
        let p = arena.as_ptr();
        let mut arenas = self.shared.arenas.lock().expect("arenas lock");
        self.shared.set_range(arena.id(), Some(range));
        arenas.push(arena);
        drop(arenas);
        self.shared.idle_periods.store(0, Ordering::Relaxed);
        self.shared.new_memory.store(true, Ordering::Release);
        self.shared.wake();
        Ok(p)
    }

    /// Memory HPS tracks at exactly `[addr, addr+len)` (page aligned), mapped over what the
    /// program placed there (MAP_FIXED, a reservation it commits): the 2 MiB regions wholly
    /// inside can be promoted, the partial ones at either end are tracked and never collapsed.
    ///
    /// # Safety
    /// The caller owns `[addr, addr+len)`; what is mapped there now is replaced.
    pub unsafe fn alloc_at(&self, addr: usize, len: usize) -> Result<*mut u8> {
        // SAFETY: the caller's contract.
        let arena = unsafe { TrackedArena::at("pagewise-hps", addr, len) }?;
        let range = match self.shared.tracker.track_parts(arena.addr(), arena.len(), &arena.live_parts(addr, len)) {
            Ok(r) => r,
            Err(e) => {
                // Leave the range as what the program asked for without HPS: fresh zero-filled
                // read-write private memory (a commit, a MAP_FIXED or a hint mapping all end so).
                arena.give_up(addr, len)?;
                // SAFETY: the caller owns the range; the arena let go of it above.
                let _ = unsafe { Mapping::anonymous_at(addr, len, &MapOptions::default()) }?.into_raw();
                return Err(e.into());
            }
        };
        let mut arenas = self.shared.arenas.lock().expect("arenas lock");
        self.shared.set_range(arena.id(), Some(range));
        arenas.push(arena);
        drop(arenas);
        self.shared.idle_periods.store(0, Ordering::Relaxed);
        self.shared.new_memory.store(true, Ordering::Release);
        self.shared.wake();
        Ok(addr as *mut u8)
    }

    /// Free an arena from [`Hps::alloc`] or [`Hps::alloc_at`] (`ptr`: what it returned).
    pub fn free(&self, ptr: *mut u8) -> Result<()> {
        let addr = ptr as usize;
        let mut arenas = self.shared.arenas.lock().expect("arenas lock");
        let pos = arenas.iter().position(|a| a.view_addr() == addr).ok_or(pagewise_track::Error::NotTracked(addr))?;
        let a = &arenas[pos];
        let addr = a.addr();
        if self.shared.is_young(a.id()) {
            // Never tracked.
            self.shared.forget_young(a.id());
        } else {
            // Its own range: every arena out of its young days has one (`set_range`).
            if let Some(r) = self.shared.set_range(a.id(), None) {
                self.shared.tracker.untrack_range(&r)?;
            }
        }
        if let Some(f) = &self.shared.fill {
            f.forget_arena(addr);
        }
        drop(arenas.remove(pos));
        Ok(())
    }

    /// Release (punch out) the memory of `[addr, addr+len)` inside an arena, e.g. a page whose
    /// object moved to the hugepage arena.
    pub fn release(&self, addr: usize, len: usize) -> Result<()> {
        let arenas = self.shared.arenas.lock().expect("arenas lock");
        let a = arenas.iter().find(|a| a.owns(addr, len)).ok_or(pagewise_track::Error::NotTracked(addr))?;
        a.release(addr, len)?;
        let range = self.shared.range_of_arena(a.id());
        drop(arenas);
        if let Some(r) = range {
            let first = r.page_of(addr);
            for i in first..(first + len.div_ceil(PAGE)).min(r.pages()) {
                r.reset_page(i);
            }
        }
        Ok(())
    }

    /// `[addr, addr+len)` of an arena (page aligned) is unmapped by the program (munmap), or
    /// about to be replaced by a mapping of its own (`leave_mapped`: MAP_FIXED): tracking
    /// forgets it, its memory is released, and an arena of which nothing is left is freed.
    pub fn unmap(&self, addr: usize, len: usize, leave_mapped: bool) -> Result<()> {
        self.give_up(addr, len, |addr, len| {
            if leave_mapped {
                return Ok(());
            }
            // SAFETY: the range is the program's to unmap; the arena gave it up above.
            unsafe { pagewise_kernel::mem::munmap(addr, len) }.map_err(Error::from)
        })
    }

    /// `[addr, addr+len)` of an arena (page aligned) leaves HPS with its data: plain private
    /// anonymous memory at the same address from now on, made in a fresh mapping and moved
    /// over the range in one step (a thread touching it meanwhile sees the old mapping or the
    /// new one). For what the program asks of its memory that a tracked shared mapping cannot
    /// give: its own MADV_HUGEPAGE, a protection other than read-write.
    pub fn detach(&self, addr: usize, len: usize) -> Result<()> {
        use pagewise_kernel::mem::{move_mapping, munmap};
        let mut arenas = self.shared.arenas.lock().expect("arenas lock");
        let a = arenas.iter().find(|a| a.owns(addr, len)).ok_or(pagewise_track::Error::NotTracked(addr))?;
        // The tracker lets go first: no arming or collapsing of the range from here on. Its
        // range is taken now: once forgotten, the pages no longer say which range they were
        // (another's may span them too, `TrackedRange::holds`). A young arena has none.
        let range = self.shared.range_unless_young(a.id(), addr)?;
        if let Some(r) = &range {
            r.forget(r.page_of(addr), len.div_ceil(PAGE));
        }
        // Memory still the view's own private pages (a young region's) is the program's as it
        // is; what is in the memfd is copied out.
        if a.in_memfd_anywhere(addr, len) {
            let copy = Mapping::anonymous(len, &MapOptions::default())?;
            // SAFETY: `copy` is a fresh mapping of `len` bytes; the program does not write the
            // range it is taking over while it asks for it.
            unsafe { a.copy_held(addr, len, copy.addr()) }?;
            let (from, _) = copy.into_raw();
            // SAFETY: `from` is the fresh mapping given up above; the range is the caller's.
            if let Err(e) = unsafe { move_mapping(from as usize, addr, len) } {
                // SAFETY: the move did not happen: still ours.
                let _ = unsafe { munmap(from as usize, len) };
                return Err(e.into());
            }
        }
        // Still under the lock: a young region let go now could otherwise move into the memfd
        // (`hps/late.rs`) before it is marked given up, and the arena be tracked with it.
        self.give_up_locked(&mut arenas, range.as_ref(), addr, len, |_, _| Ok(()))
    }

    /// Forget `[addr, addr+len)` in the tracker (waiting for its work there), release its
    /// memory and mark it the arena's no more; `then` does what the caller does to the range;
    /// the arena goes once nothing of it is left.
    ///
    /// Whether the arena is young, and so which tracked range holds the part, is decided under
    /// the same hold of the arenas lock as the rest: the tracking thread moves young regions
    /// in and starts tracking a young arena under it (`hps/late.rs`). Decided before taking
    /// the lock again, an arena tracked in between had the part tracked and never forgotten,
    /// and the tracker went on arming it after the program unmapped it — whatever was mapped
    /// there next, glibc's heap included.
    fn give_up(&self, addr: usize, len: usize, then: impl FnOnce(usize, usize) -> Result<()>) -> Result<()> {
        let mut arenas = self.shared.arenas.lock().expect("arenas lock");
        let a = arenas.iter().find(|a| a.owns(addr, len)).ok_or(pagewise_track::Error::NotTracked(addr))?;
        let range = self.shared.range_unless_young(a.id(), addr)?;
        self.give_up_locked(&mut arenas, range.as_ref(), addr, len, then)
    }

    /// [`Hps::give_up`] of a range of `range`'s, the tracked range that held it (None: a young
    /// arena's, never tracked), the arenas lock held since `range` was chosen.
    fn give_up_locked(
        &self,
        arenas: &mut Vec<TrackedArena>,
        range: Option<&Arc<pagewise_track::TrackedRange>>,
        addr: usize,
        len: usize,
        then: impl FnOnce(usize, usize) -> Result<()>,
    ) -> Result<()> {
        let pos = arenas.iter().position(|a| a.owns(addr, len)).ok_or(pagewise_track::Error::NotTracked(addr))?;
        if let Some(range) = range {
            range.forget(range.page_of(addr), len.div_ceil(PAGE));
        }
        arenas[pos].give_up(addr, len)?;
        then(addr, len)?;
        if arenas[pos].all_given_up() {
            let gone = arenas.remove(pos);
            self.shared.forget_young(gone.id());
            self.shared.set_range(gone.id(), None);
            drop(gone);
            if let Some(range) = range {
                self.shared.tracker.untrack_range(range)?;
            }
        }
        Ok(())
    }

    /// Hugepage-backed memory for hot objects (the compaction target).
    pub fn huge_alloc(&self, len: usize) -> Result<*mut u8> {
        let mut huge = self.shared.huge.lock().expect("huge lock");
        let need = huge.hugepages_needed(len);
        if need > 0 {
            if let Some(b) = self.shared.budget.lock().expect("budget lock").as_ref() {
                if !b.try_take(need)? {
                    return Err(Error::Io {
                        path: fairness::default_path().display().to_string(),
                        source: std::io::Error::from_raw_os_error(libc::ENOSPC),
                    });
                }
            }
        }
        huge.alloc(len)
    }

    /// Give back a block from [`Hps::huge_alloc`]; hugepages the arena unmapped as a result go
    /// back to the host budget.
    pub fn huge_free(&self, ptr: *mut u8, len: usize) -> Result<()> {
        let released = self.shared.huge.lock().expect("huge lock").free(ptr, len)?;
        if released > 0 {
            if let Some(b) = self.shared.budget.lock().expect("budget lock").as_ref() {
                b.give_back(released)?;
            }
        }
        Ok(())
    }

    /// Hugepages mapped by the hugepage arena.
    pub fn huge_hugepages(&self) -> u64 {
        self.shared.huge.lock().expect("huge lock").hugepages()
    }

    /// Whether the 2 MiB region at `addr` of a tracked arena was promoted (collapsed and no
    /// longer tracked).
    pub fn region_promoted(&self, addr: usize) -> bool {
        self.shared.tracker.range_of(addr).is_some_and(|r| r.mode((addr - r.start) / HUGE_PMD) == RegionMode::Skip)
    }

    /// Bytes held by the tracked arenas and the hugepage arena.
    pub fn resident_bytes(&self) -> (u64, u64) {
        let tracked = self.shared.arenas.lock().expect("arenas lock").iter().map(|a| a.resident_bytes()).sum();
        (tracked, self.shared.huge.lock().expect("huge lock").resident_bytes())
    }

    /// Start (`true`) or stop tracking; arenas and counts stay.
    pub fn set_tracking(&self, on: bool) {
        self.shared.tracking.store(on, Ordering::Release);
        if on {
            self.shared.idle_periods.store(0, Ordering::Relaxed);
            if let Some(c) = self.shared.conv.lock().expect("conv lock").as_mut() {
                c.force_restart();
            }
            self.shared.converged.store(false, Ordering::Release);
            self.shared.wake();
        }
    }

    /// The program serves (it began listening for connections): promotion and tracking get
    /// their whole pace share from now on ([`Pace::end_ramp`]). A server runs until it is
    /// stopped, so the ramp — a guess from its age that it may end soon — would only put its
    /// hugepages off (memcached's reads of 1.7 s after its fill paid 0.96–1.10× plain with the
    /// ramp and ran 0.87–0.91× without it).
    pub fn program_serves(&self) {
        let now = self.shared.epoch.elapsed().as_nanos() as u64;
        let _ = self.shared.serving_since_ns.compare_exchange(u64::MAX, now, Ordering::Relaxed, Ordering::Relaxed);
        if let Some(p) = self.shared.pace.lock().expect("pace lock").as_mut() {
            p.end_ramp(now);
        }
        if let Some(p) = self.shared.track_pace.lock().expect("track pace lock").as_mut() {
            p.end_ramp(now);
        }
    }

    pub fn tracking(&self) -> bool {
        self.shared.tracking.load(Ordering::Acquire)
    }

    /// Whether tracking runs now: on, and not stopped by convergence.
    pub fn track_state(&self) -> TrackState {
        if self.shared.tracking.load(Ordering::Acquire) && !self.shared.converged.load(Ordering::Acquire) {
            TrackState::Tracking
        } else {
            TrackState::Converged
        }
    }

    /// Install (or clear) the application's decide and compact functions. They run in the
    /// thread doing the decision step and must not call `process`, `wait_signal` or
    /// `set_functions` themselves (they may call `huge_alloc` and `release`).
    pub fn set_functions(&self, decide: Option<DecideFn>, compact: Option<CompactFn>) {
        let mut cb = self.shared.callbacks.lock().expect("callbacks lock");
        cb.decide = decide;
        cb.compact = compact;
    }

    /// Active pages (count ≥ threshold) not yet promoted or compacted.
    pub fn get_active(&self) -> Vec<ActivePage> {
        active_pages(&self.shared)
    }

    /// Run one tracking period now, as the tracking thread does (arm, then classify what the
    /// previous periods saw); returns the pages armed.
    pub fn run_period(&self) -> Result<usize> {
        let cfg = self.shared.cfg.lock().expect("cfg lock").clone();
        let armed = self.shared.tracker.run_period(&plan_cfg(&cfg))?;
        classify(&self.shared, &cfg);
        Ok(armed)
    }

    /// The decision step: fetch the active pages, decide per region, promote or compact.
    pub fn process(&self) -> Result<Outcome> {
        process(&self.shared)
    }

    /// Queue a notification carrying `count` to the notified thread (what the tracking thread
    /// does after a period that found active pages).
    pub fn notify(&self, count: u64) -> Result<bool> {
        notify(&self.shared, count)
    }

    /// The notification signal number.
    pub fn signal(&self) -> i32 {
        self.shared.sig
    }

    pub fn stats(&self) -> HpsStats {
        let s = &self.shared;
        let conv = s.conv.lock().expect("conv lock").clone();
        HpsStats {
            tracker: s.tracker.stats(),
            promoted_regions: s.promoted.load(Ordering::Relaxed),
            compacted_pages: s.compacted.load(Ordering::Relaxed),
            collapse_failures: s.collapse_failures.load(Ordering::Relaxed),
            paced_promotions: s.paced.load(Ordering::Relaxed),
            unfilled_promotions: s.unfilled.load(Ordering::Relaxed),
            paced_periods: s.paced_periods.load(Ordering::Relaxed),
            moved_in_regions: s.moved_regions.load(Ordering::Relaxed),
            moved_in_pages: s.moved_pages.load(Ordering::Relaxed),
            move_in_ns: s.move_in_ns.load(Ordering::Relaxed),
            move_in_failures: s.move_in_failures.load(Ordering::Relaxed),
            young_arenas: s.young_made.load(Ordering::Relaxed),
            serving_since_ns: Some(s.serving_since_ns.load(Ordering::Relaxed)).filter(|&t| t != u64::MAX),
            first_touch_regions: s.fill.as_ref().map_or(0, |f| f.advised.load(Ordering::Relaxed)),
            first_touch_declined: s.fill.as_ref().map_or(0, |f| f.declined.load(Ordering::Relaxed)),
            notifications_sent: s.sent.load(Ordering::Relaxed),
            notifications_received: s.received.load(Ordering::Relaxed),
            decision_steps: s.steps.load(Ordering::Relaxed),
            collapse_ns: s.collapse_ns.load(Ordering::Relaxed),
            converged: s.converged.load(Ordering::Acquire),
            converge_stops: conv.as_ref().map_or(0, |c| c.stops),
            converge_restarts: conv.as_ref().map_or(0, |c| c.restarts),
            probes: conv.as_ref().map_or(0, |c| c.probes),
        }
    }

    /// The page_acs text of every tracked arena (seed layout), with maps-style headers.
    pub fn page_acs(&self) -> String {
        let maps = pagewise_kernel::error::read_file("/proc/self/maps").unwrap_or_default();
        let ranges = published_ranges(&self.shared);
        let decoded = report::decode(&report::encode(&ranges)).unwrap_or_default();
        report::render(&maps, &decoded)
    }

    /// Publish the counts now (see [`pagewise_track::report`]).
    pub fn publish(&self) -> Result<()> {
        publish_live(&self.shared)
    }

    /// Update the configuration (the signal and notify mode are fixed at start).
    pub fn configure(&self, f: impl FnOnce(&mut HpsConfig)) {
        let mut cfg = self.shared.cfg.lock().expect("cfg lock");
        f(&mut cfg);
        self.shared.idle_periods.store(0, Ordering::Relaxed);
        self.shared.wake();
    }

    /// Whether the notify mode is `Handler` with its service thread running.
    pub fn has_service(&self) -> bool {
        self.service.lock().expect("service lock").is_some()
    }
}

impl Drop for Hps {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake();
        if let Some(t) = self.tracker_thread.take() {
            let _ = t.join();
        }
        self.stop_service();
        if let Some(b) = self.shared.budget.lock().expect("budget lock").as_ref() {
            let _ = b.leave();
        }
        report::unpublish(signal::getpid());
    }
}
