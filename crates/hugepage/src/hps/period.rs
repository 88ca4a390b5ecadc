//! What happens each period, away from the API: the tracking thread's loop (arm, sleep out
//! the period, thin out when idle, converge), classifying regions from their counts,
//! notifying the application, and the decision step that promotes or compacts.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use pagewise_kernel::mem::HUGE_PMD;
use pagewise_kernel::signal;
use pagewise_track::plan::PlanConfig;
use pagewise_track::{report, RegionMode, PAGE, PAGES_PER_REGION};

use crate::policy::{self, Action, CollapseOutcome, Decision, RegionView, TrackState};
use crate::{promote, Result};

use super::{ActivePage, HpsConfig, Notify, Outcome, Shared};

pub(super) fn plan_cfg(cfg: &HpsConfig) -> PlanConfig {
    PlanConfig { pages_per_region: PAGES_PER_REGION, sample_pages: cfg.sample_pages, budget_pages: cfg.budget_pages }
}

/// Publish the counts read in place (no copy: see [`report::publish_views`]).
pub(super) fn publish_live(s: &Shared) -> Result<()> {
    let ranges = s.tracker.ranges();
    let getters: Vec<Box<dyn Fn(usize) -> u32 + '_>> =
        ranges.iter().map(|r| Box::new(move |i: usize| r.acs(i)) as Box<dyn Fn(usize) -> u32 + '_>).collect();
    let views: Vec<report::RangeView<'_>> =
        ranges.iter().zip(&getters).map(|(r, g)| (r.start, r.pages(), g.as_ref())).collect();
    let state = if s.tracking.load(Ordering::Acquire) && !s.converged.load(Ordering::Acquire) {
        TrackState::Tracking
    } else {
        TrackState::Converged
    };
    report::publish_views(signal::getpid(), &format!("tracking {}", state.name()), &views)?;
    Ok(())
}

pub(super) fn published_ranges(s: &Shared) -> Vec<(usize, Vec<u32>)> {
    s.tracker.ranges().iter().map(|r| (r.start, r.counts())).collect()
}

fn region_view(r: &pagewise_track::TrackedRange, region: usize, thr: u32) -> (RegionView, Vec<ActivePage>) {
    let first = region * PAGES_PER_REGION;
    let last = (first + PAGES_PER_REGION).min(r.pages());
    let mut v = RegionView { total: (last - first) as u32, observed: 0, active: 0 };
    let mut pages = Vec::new();
    for i in first..last {
        if r.obs(i) > 0 {
            v.observed += 1;
        }
        let c = r.acs(i);
        if c >= thr && c > 0 {
            v.active += 1;
            pages.push(ActivePage { addr: r.start + i * PAGE, count: c });
        }
    }
    (v, pages)
}

pub(super) fn active_pages(s: &Shared) -> Vec<ActivePage> {
    let thr = s.cfg.lock().expect("cfg lock").active_threshold;
    let mut out = Vec::new();
    for r in s.tracker.ranges() {
        for region in 0..r.regions() {
            if r.mode(region) == RegionMode::Skip {
                continue;
            }
            out.extend(region_view(&r, region, thr).1);
        }
    }
    out
}

/// After a period: regions whose counts already decide them stop being armed (`Hold` until the
/// application's decision step), regions that need page-exact counts are armed whole from the
/// next period on. Returns the number of active pages awaiting a decision.
pub(super) fn classify(s: &Shared, cfg: &HpsConfig) -> u64 {
    let mut active = 0u64;
    for r in s.tracker.ranges() {
        for region in 0..r.regions() {
            let mode = r.mode(region);
            if mode == RegionMode::Skip {
                continue;
            }
            let (view, _) = region_view(&r, region, cfg.active_threshold);
            active += view.active as u64;
            if mode == RegionMode::Hold {
                continue;
            }
            match policy::decide(&view, &cfg.rule) {
                Decision::Promote | Decision::Compact => r.set_mode(region, RegionMode::Hold),
                Decision::ObserveFully => r.set_mode(region, RegionMode::Full),
                Decision::Observe => {}
            }
        }
    }
    active
}

pub(super) fn notify(s: &Shared, count: u64) -> Result<bool> {
    let tid = s.target_tid.load(Ordering::Acquire);
    if tid == 0 {
        return Ok(false);
    }
    signal::queue_to_thread(signal::getpid(), tid, s.sig, count)?;
    s.sent.fetch_add(1, Ordering::Relaxed);
    Ok(true)
}

pub(super) fn process(s: &Shared) -> Result<Outcome> {
    // From here on a new period may notify again: anything it finds is handled next time.
    s.outstanding.store(false, Ordering::Release);
    s.steps.fetch_add(1, Ordering::Relaxed);
    let cfg = s.cfg.lock().expect("cfg lock").clone();
    let thr = cfg.active_threshold;
    let mut out = Outcome::default();
    let mut cb = s.callbacks.lock().expect("callbacks lock");
    for r in s.tracker.ranges() {
        for region in 0..r.regions() {
            if r.mode(region) == RegionMode::Skip {
                continue;
            }
            let (view, pages) = region_view(&r, region, thr);
            if view.active == 0 {
                continue;
            }
            let addr = r.start + region * HUGE_PMD;
            let own = cb.decide.as_mut().and_then(|f| f(addr, &view));
            let mut decision = own.unwrap_or_else(|| policy::decide(&view, &cfg.rule));
            if decision == Decision::Promote {
                // Part of the region is no longer HPS's (unmapped or taken over by the
                // program): it cannot become one hugepage.
                let _ops = r.hold();
                if !r.region_whole(region) {
                    r.set_mode(region, RegionMode::Skip);
                    continue;
                }
                if !filled(addr, &cfg.rule) {
                    // Sampled on and promoted once filled: not a deferral, which would keep
                    // tracking from converging on a region the program may never fill.
                    r.set_mode(region, RegionMode::Sample);
                    s.unfilled.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                match try_promote(s, addr)? {
                    PromoteResult::Done => {
                        r.set_mode(region, RegionMode::Skip);
                        out.promoted += 1;
                        continue;
                    }
                    PromoteResult::Later => {
                        // Stays on hold: retried at the next decision step, not re-armed.
                        r.set_mode(region, RegionMode::Hold);
                        out.deferred += 1;
                        continue;
                    }
                    PromoteResult::GivenUp => {
                        r.set_mode(region, RegionMode::Skip);
                        continue;
                    }
                    // No hugepage for a whole region: the active pages can still be compacted,
                    // which takes far fewer hugepages.
                    PromoteResult::NoBudget => {
                        decision = if view.observed < view.total { Decision::ObserveFully } else { Decision::Compact };
                    }
                }
            }
            match decision {
                Decision::ObserveFully => {
                    if r.mode(region) != RegionMode::Full {
                        r.set_mode(region, RegionMode::Full);
                        out.observe_fully += 1;
                    }
                }
                Decision::Compact => {
                    let moved = cb.compact.as_mut().map_or(0, |f| f(&pages));
                    for p in &pages {
                        r.reset_page((p.addr - r.start) / PAGE);
                    }
                    r.set_mode(region, RegionMode::Sample);
                    out.compacted_pages += moved as u32;
                    s.compacted.fetch_add(moved as u64, Ordering::Relaxed);
                }
                Decision::Observe | Decision::Promote => {
                    if r.mode(region) == RegionMode::Hold {
                        r.set_mode(region, RegionMode::Sample);
                    }
                }
            }
        }
    }
    let decided = out.promoted + out.compacted_pages + out.observe_fully;
    if decided > 0 {
        s.idle_periods.store(0, Ordering::Relaxed);
        s.decisions.fetch_add(decided as u64, Ordering::Relaxed);
        s.wake();
    }
    s.deferrals.fetch_add(u64::from(out.deferred), Ordering::Relaxed);
    Ok(out)
}

/// Does the region at `addr` hold enough data to be collapsed ([`policy::filled_enough`])?
/// A region mincore(2) cannot look at is left alone.
fn filled(addr: usize, rule: &policy::RegionRule) -> bool {
    if rule.min_filled <= 0.0 {
        return true;
    }
    let total = (HUGE_PMD / PAGE) as u32;
    promote::resident_pages(addr).is_ok_and(|resident| policy::filled_enough(resident, total, rule))
}

enum PromoteResult {
    Done,
    Later,
    NoBudget,
    /// The kernel refused this region [`MAX_REFUSALS`] times: left on 4 KiB pages for good
    /// (khugepaged would not collapse it either).
    GivenUp,
}

/// Refusals of one region (EAGAIN, EINVAL) before HPS stops asking: a refusal is usually a
/// page caught mid-fault, but one the kernel keeps refusing costs a collapse attempt (up to
/// the whole copy, ~5 ms of CPU) at every decision step.
const MAX_REFUSALS: u32 = 3;

fn try_promote(s: &Shared, addr: usize) -> Result<PromoteResult> {
    let now = s.epoch.elapsed().as_nanos() as u64;
    if !s.backoff.lock().expect("backoff lock").allowed(now) {
        return Ok(PromoteResult::Later);
    }
    if !s.pace.lock().expect("pace lock").as_mut().is_none_or(|p| p.allowed(now)) {
        s.paced.fetch_add(1, Ordering::Relaxed);
        return Ok(PromoteResult::Later);
    }
    let budget = s.budget.lock().expect("budget lock");
    if let Some(b) = budget.as_ref() {
        if !b.try_take(1)? {
            return Ok(PromoteResult::NoBudget);
        }
    }
    // The guard judges the collapse by the CPU time of this thread, not wall time: what it
    // must catch is the kernel compacting memory to find a hugepage (CPU work done in this
    // thread), not this thread waiting for a CPU on a busy machine.
    let cpu0 = signal::thread_cpu_time();
    promote::warm_hugepage();
    if let Some(f) = &s.fill {
        f.before_collapse(addr);
    }
    let res = promote::collapse(addr);
    let cpu = (signal::thread_cpu_time() - cpu0).as_nanos() as u64;
    let end = s.epoch.elapsed().as_nanos() as u64;
    s.collapse_ns.fetch_add(end - now, Ordering::Relaxed);
    let outcome = match &res {
        Ok(_) => CollapseOutcome::Done,
        Err(e) => CollapseOutcome::of_errno(e.errno()),
    };
    s.backoff.lock().expect("backoff lock").record(end, cpu, outcome);
    if let Some(p) = s.pace.lock().expect("pace lock").as_mut() {
        p.spend(end, cpu);
    }
    if res.is_ok() {
        s.promoted.fetch_add(1, Ordering::Relaxed);
        s.refusals.lock().expect("refusals lock").remove(&addr);
        return Ok(PromoteResult::Done);
    }
    s.collapse_failures.fetch_add(1, Ordering::Relaxed);
    if let Some(b) = budget.as_ref() {
        b.give_back(1)?;
    }
    if outcome == CollapseOutcome::RegionRefused {
        let mut refusals = s.refusals.lock().expect("refusals lock");
        let n = refusals.entry(addr).or_insert(0);
        *n += 1;
        if *n >= MAX_REFUSALS {
            refusals.remove(&addr);
            return Ok(PromoteResult::GivenUp);
        }
    }
    Ok(PromoteResult::Later)
}

pub(super) fn tracking_loop(s: &Shared) {
    let _ = s.tracking_thread.set(std::thread::current());
    let mut last_publish = Instant::now();
    let mut last_decisions = (0u64, 0u64);
    // A probe armed pages while converged: classify what they saw at the next step.
    let mut collect = false;
    while !s.stop.load(Ordering::Acquire) {
        if !s.tracking.load(Ordering::Acquire) {
            // Nothing to do until tracking is switched on again or HPS stops (both wake us).
            std::thread::park();
            continue;
        }
        let cfg = s.cfg.lock().expect("cfg lock").clone();
        let idle = s.idle_periods.load(Ordering::Relaxed);
        let converged = s.converged.load(Ordering::Acquire);
        let ms = if converged {
            cfg.max_interval_ms.max(cfg.interval_ms)
        } else {
            policy::thinned_interval_ms(cfg.interval_ms, cfg.max_interval_ms, idle)
        };
        // Sleep out the period unless woken for a reason to start the next one now: stop, new
        // work (a decision, a new arena, a new configuration) or, while converged, new memory.
        // No polling: the thread shares its core with the application it serves.
        let deadline = Instant::now() + Duration::from_millis(ms);
        loop {
            let woken = s.stop.load(Ordering::Acquire)
                || s.idle_periods.load(Ordering::Relaxed) < idle
                || (converged && s.new_memory.load(Ordering::Acquire));
            let left = deadline.saturating_duration_since(Instant::now());
            if woken || left.is_zero() {
                break;
            }
            // A dense fill is followed at its own pace, not the period's.
            match s.fill.as_ref().and_then(|f| Some((f, f.next_check()?))) {
                Some((f, step)) if !converged && left > step => {
                    std::thread::park_timeout(step);
                    f.check(s);
                }
                _ => std::thread::park_timeout(left),
            }
        }
        if s.stop.load(Ordering::Acquire) || !s.tracking.load(Ordering::Acquire) {
            continue;
        }
        // Young arenas due move into tracked memory first: a period then sees them.
        super::late::move_in_due(s);
        let Some(affordable) = tracking_budget(s, cfg.budget_pages) else {
            // Not a period at all: nothing armed, nothing counted towards convergence.
            s.paced_periods.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let mut probe = false;
        if cfg.converge.is_some() {
            // A step that decided something, or put a promotion off (the pace), is not quiet:
            // held regions are work still to do.
            let decisions = (s.decisions.load(Ordering::Relaxed), s.deferrals.load(Ordering::Relaxed));
            let changed = decisions != last_decisions;
            last_decisions = decisions;
            let mut guard = s.conv.lock().expect("conv lock");
            let Some(conv) = guard.as_mut() else { continue };
            let mut act =
                if s.new_memory.swap(false, Ordering::AcqRel) { conv.on_new_memory() } else { Action::Continue };
            if act == Action::Continue {
                act = conv.step(changed, (0, 0));
            }
            let now_converged = conv.state() == TrackState::Converged;
            s.converged.store(now_converged, Ordering::Release);
            let stats = (conv.stops, conv.restarts, conv.probes);
            drop(guard);
            match act {
                Action::Stop => {
                    if cfg.log_state {
                        eprintln!(
                            "pagewise: hps: tracking stopped: placement converged ({} region(s) promoted; {} tracking period(s))",
                            s.promoted.load(Ordering::Relaxed),
                            s.tracker.stats().periods
                        );
                    }
                    if cfg.publish {
                        let _ = publish_live(s);
                    }
                }
                Action::Restart => {
                    s.idle_periods.store(0, Ordering::Relaxed);
                    if cfg.log_state {
                        eprintln!(
                            "pagewise: hps: tracking restarted (new memory or a probe found a new hot region; restart {})",
                            stats.1
                        );
                    }
                    if cfg.publish {
                        let _ = publish_live(s);
                    }
                }
                Action::Probe => {
                    // Judge the probe on what it sees now: counts of undecided regions are
                    // history from before convergence (a region long observed cold would need
                    // many probes to cross the rule's fraction).
                    forget_undecided(s);
                    probe = true;
                }
                Action::Continue => {}
            }
            if now_converged && !probe {
                if std::mem::take(&mut collect) {
                    classify_and_notify(s, &cfg);
                }
                continue;
            }
        }
        let faults_before = s.tracker.stats().faults;
        let plan = PlanConfig { budget_pages: affordable.max(1), ..plan_cfg(&cfg) };
        let plan = if probe { PlanConfig { sample_pages: cfg.probe_pages.max(1), ..plan } } else { plan };
        if s.tracker.run_period(&plan).is_err() {
            continue;
        }
        collect = probe;
        let active = classify_and_notify(s, &cfg);
        // A period is busy while accesses were observed and something remains to decide.
        let busy = active > 0 && s.tracker.stats().faults > faults_before;
        if busy {
            s.idle_periods.store(0, Ordering::Relaxed);
        } else {
            s.idle_periods.fetch_add(1, Ordering::Relaxed);
        }
        if cfg.publish && last_publish.elapsed() >= Duration::from_millis(500) {
            let _ = publish_live(s);
            last_publish = Instant::now();
        }
    }
}

/// How many pages tracking's pace lets a period arm now (`None`: no period now), after
/// charging it what tracking has cost since the last look: the time spent arming, the
/// handler's CPU time serving the faults, for each fault served while the handler did not
/// share the faulting thread's CPU that fault as a thread of the program sees it (two
/// cross-CPU wake-ups besides the handler's work), and for each served while it did, the
/// faulting thread's own CPU time in it ([`fault_cost`]). On GNU sort of 64 MiB
/// (0.8 s, a 256 MiB buffer, one thread) the first two came to 23–31 ms, and the run took
/// 33 ms longer than with tracking off; on a JVM, whose threads keep the handler off their
/// CPU, 25,601 observed faults made the run 1.3 s longer (51 µs each) while only the handler's
/// CPU time was charged. A period then arms only what its faults can pay
/// ([`crate::pace::affordable_pages`]).
fn tracking_budget(s: &Shared, most: usize) -> Option<usize> {
    let mut guard = s.track_pace.lock().expect("track pace lock");
    let Some(pace) = guard.as_mut() else { return Some(most) };
    let fault = fault_cost(s);
    let t = s.tracker.stats();
    let pinned_faults = t.faults.saturating_sub(t.unpinned_faults);
    let cost = t.handler_cpu_ns
        + t.arm_ns
        + t.unpinned_faults.saturating_mul(fault.wall_ns)
        + pinned_faults.saturating_mul(fault.thread_cpu_ns);
    let tokens = pace.affordable_ns(s.epoch.elapsed().as_nanos() as u64, cost)?;
    let handler_per_fault = t.handler_cpu_ns.checked_div(t.faults).unwrap_or(0);
    let apart = if s.tracker.colocated() { fault.thread_cpu_ns } else { fault.wall_ns };
    let per_fault = handler_per_fault + apart;
    let ratio = (t.armed_pages > 0).then(|| t.faults as f64 / t.armed_pages as f64);
    Some(crate::pace::affordable_pages(tokens, per_fault as f64, ratio).min(most))
}

/// What a tracked fault costs the program besides the handler's CPU time, in ns.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct FaultCost {
    /// With the handler on another CPU: what the faulting thread waits (two cross-CPU
    /// wake-ups besides the handler's work).
    wall_ns: u64,
    /// With the handler on its CPU (colocation): the faulting thread's own CPU time, which
    /// the program's CPU spends on top of the handler's. On GNU sort (one thread) an observed
    /// fault cost the run about 13 µs; the handler's CPU time is a part of that.
    thread_cpu_ns: u64,
}

/// What a tracked fault costs: timed by the tracker on a page of its own
/// (`MinorTracker::time_fault`), again every [`FAULT_RETIME`] (what a wake-up costs moves
/// with the host's load); nothing under SIGBUS delivery (the faulting thread serves itself:
/// the handler's CPU time is the cost).
fn fault_cost(s: &Shared) -> FaultCost {
    let mut timed = s.fault_timed.lock().expect("fault timing lock");
    if timed.is_none_or(|(at, _)| at.elapsed() >= FAULT_RETIME) {
        let cost = s.tracker.time_fault(5).ok().flatten().map_or(FaultCost::default(), |d| FaultCost {
            wall_ns: d.wall.as_nanos() as u64,
            thread_cpu_ns: d.thread_cpu.as_nanos() as u64,
        });
        *timed = Some((Instant::now(), cost));
    }
    timed.map_or(FaultCost::default(), |(_, c)| c)
}

/// How often [`fault_cost`] times a fault again.
const FAULT_RETIME: Duration = Duration::from_secs(5);

impl Shared {
    /// End the tracking thread's sleep early (it re-checks why it sleeps).
    pub(super) fn wake(&self) {
        if let Some(t) = self.tracking_thread.get() {
            t.unpark();
        }
    }
}

/// Reset the counts of regions still sampled (not promoted, not awaiting a decision); pages
/// with zero counts are not written, so the tables of never-used memory stay unpopulated.
fn forget_undecided(s: &Shared) {
    for r in s.tracker.ranges() {
        for region in 0..r.regions() {
            if r.mode(region) != RegionMode::Sample {
                continue;
            }
            let first = region * PAGES_PER_REGION;
            for i in first..(first + PAGES_PER_REGION).min(r.pages()) {
                if r.acs(i) != 0 || r.obs(i) != 0 {
                    r.reset_page(i);
                }
            }
        }
    }
}

/// Classify after a period and notify the decision step if there are active pages.
fn classify_and_notify(s: &Shared, cfg: &HpsConfig) -> u64 {
    let active = classify(s, cfg);
    if active > 0 && cfg.notify != Notify::None && !s.outstanding.swap(true, Ordering::AcqRel) {
        match notify(s, active) {
            Ok(true) => {}
            _ => s.outstanding.store(false, Ordering::Release),
        }
    }
    active
}
