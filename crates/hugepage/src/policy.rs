//! Pure HPS decisions: what to do with a 2 MiB region, when to stop promoting for a while, and
//! when to track less.
//!
//! The region rule is the seed's: promote a region to a hugepage when at least a quarter of its
//! pages are active, otherwise move the active pages' objects onto hugepage-backed memory
//! (compaction), which only the application can do. The paper counted every page; here the
//! tracker may have observed only part of a region, so the rule works on the *observed* pages:
//! the active fraction among observed pages estimates the region's. An estimate below the
//! threshold is not enough to compact (compaction must know every hot page), so such a region
//! is first observed whole (`ObserveFully`), and compacted once every page has been seen.
//!
//! A collapse also gives the region every page the program never touched, zeroed: that is
//! THP's memory bloat. The paper's programs filled their memory; a program nobody tuned may
//! not (the last regions of a growing heap, a buffer written front to back), so a promotion
//! may wait until the region holds data in at least `min_filled` of its pages
//! ([`filled_enough`]); `pagewise hps run` waits for all of them, and adds no memory.

/// What the tracker knows about one 2 MiB region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionView {
    /// Pages in the region (512).
    pub total: u32,
    /// Pages observed at least once.
    pub observed: u32,
    /// Observed pages whose count reached the activity threshold.
    pub active: u32,
}

/// The decision for a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nothing to do (no active page, or too little observed yet).
    Observe,
    /// Count every page of the region from now on.
    ObserveFully,
    /// Collapse the region into one hugepage.
    Promote,
    /// Hand the active pages to the application's compaction.
    Compact,
}

/// The knobs of the region rule.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RegionRule {
    /// Promote when active/observed ≥ this (seed: 1/4).
    pub promote_fraction: f64,
    /// Do not judge a region on fewer observed pages than this.
    pub min_observed: u32,
    /// Collapse a region only once this fraction of its pages holds data (0: whatever it
    /// holds, the seed's rule; 1: only a full region, so a promotion adds no memory).
    pub min_filled: f64,
}

impl Default for RegionRule {
    fn default() -> Self {
        RegionRule { promote_fraction: 0.25, min_observed: 32, min_filled: 0.0 }
    }
}

/// May a region with data in `resident` of its `total` pages be collapsed? Whatever it lacks
/// the collapse allocates and zeroes: memory the program never asked for.
pub fn filled_enough(resident: u32, total: u32, rule: &RegionRule) -> bool {
    resident.min(total) as f64 >= rule.min_filled * total as f64
}

/// The seed's rule, on what was observed.
pub fn decide(v: &RegionView, rule: &RegionRule) -> Decision {
    if v.active == 0 || v.observed < rule.min_observed.min(v.total) {
        return Decision::Observe;
    }
    if v.active as f64 >= rule.promote_fraction * v.observed as f64 {
        return Decision::Promote;
    }
    if v.observed < v.total {
        return Decision::ObserveFully;
    }
    Decision::Compact
}

/// How a collapse ended, as far as the next one is concerned (MADV_COLLAPSE's errno says which:
/// mm/khugepaged.c, `madvise_collapse_errno`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CollapseOutcome {
    Done,
    /// No hugepage to be had (ENOMEM: none free; EBUSY: the cgroup's charge failed): the next
    /// region would fare no better now.
    NoHugepage,
    /// This region, now (EAGAIN: a page busy or locked; EINVAL: it changed under the collapse,
    /// e.g. a page the program was faulting in): says nothing about the next region.
    RegionRefused,
}

impl CollapseOutcome {
    /// The outcome of a collapse that failed with `errno`.
    pub fn of_errno(errno: i32) -> CollapseOutcome {
        match errno {
            libc::ENOMEM | libc::EBUSY => CollapseOutcome::NoHugepage,
            _ => CollapseOutcome::RegionRefused,
        }
    }
}

/// Latency guard of synchronous promotion (TCMalloc's hugepage-aware allocator backs off when
/// a collapse is slow: a collapse over `slow_ns` means the kernel had to compact memory to find
/// a hugepage, and more attempts now would stall the application). After a slow collapse, or
/// one that found no hugepage, promotion pauses for `base_pause_ns`, doubling with each
/// consecutive one up to `max_pause_ns`; a fast collapse resets the streak. A region the
/// kernel refused for reasons of its own leaves the guard as it was: under GNU sort one
/// collapse a run failed with EINVAL on a region being written, and pausing every promotion
/// for it left the rest of the hot buffer on 4 KiB pages for 100+ ms of a 0.7 s run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub slow_ns: u64,
    pub base_pause_ns: u64,
    pub max_pause_ns: u64,
    streak: u32,
    resume_at_ns: u64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new(50_000_000, 100_000_000, 5_000_000_000)
    }
}

impl Backoff {
    pub fn new(slow_ns: u64, base_pause_ns: u64, max_pause_ns: u64) -> Self {
        Backoff { slow_ns, base_pause_ns, max_pause_ns, streak: 0, resume_at_ns: 0 }
    }

    /// May a promotion start at `now_ns`?
    pub fn allowed(&self, now_ns: u64) -> bool {
        now_ns >= self.resume_at_ns
    }

    /// Record a collapse that ended at `now_ns` after `took_ns` with `outcome`.
    pub fn record(&mut self, now_ns: u64, took_ns: u64, outcome: CollapseOutcome) {
        match outcome {
            CollapseOutcome::RegionRefused => return,
            CollapseOutcome::Done if took_ns <= self.slow_ns => {
                self.streak = 0;
                return;
            }
            CollapseOutcome::Done | CollapseOutcome::NoHugepage => {}
        }
        let pause = self.base_pause_ns.saturating_mul(1u64 << self.streak.min(32)).min(self.max_pause_ns);
        self.streak = self.streak.saturating_add(1);
        self.resume_at_ns = now_ns.saturating_add(pause);
    }

    /// Consecutive slow collapses.
    pub fn streak(&self) -> u32 {
        self.streak
    }
}

/// The tracking interval after `idle_periods` periods without a decision: doubling from `base`
/// up to `max`. Tracking costs the application a fault per observed access, so once the hot
/// set is handled the tracker thins out instead of running at full rate (the paper's
/// applications stop tracking themselves for the same reason).
pub fn thinned_interval_ms(base_ms: u64, max_ms: u64, idle_periods: u32) -> u64 {
    base_ms.saturating_mul(1u64 << idle_periods.min(20)).min(max_ms.max(base_ms))
}

/// When tracking runs. Every observed access costs the application a fault, so tracking stops
/// once placement has *converged* (the paper's applications stop their own tracking once they
/// have promoted/compacted enough) and resumes when the hot set drifts (beyond the paper).
///
/// Converged: `quiet_steps` decision steps in a row changed nothing after the session decided
/// something (a page needs several periods before its count decides its region, so quiet alone
/// at the start of a session means nothing), or the session has lasted `max_session_steps`
/// steps whatever it decided (a placement that keeps changing — a hot set moving all the time —
/// is not worth tracking without end; the next drift or new memory restarts it).
/// While converged, three signals restart tracking:
/// - new memory to track (the caller's [`Convergence::on_new_memory`]);
/// - a probe — one cheap sampling period every `probe_every` steps, which the caller runs when
///   [`Action::Probe`] is returned — led to a new decision (`changed` of a later step);
/// - the share of accesses served from hugepages, if the caller measures it (`hits`: accesses
///   on hugepage memory and all accesses since the last step), judged over windows of
///   `window_steps` steps with at least `min_samples` accesses, fell below `drift_drop` × its
///   value at convergence. A share below `min_share` at convergence is no placement to keep:
///   then any window under load restarts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ConvergeRule {
    pub quiet_steps: u32,
    pub max_session_steps: u32,
    /// 0: no probes.
    pub probe_every: u32,
    pub window_steps: u32,
    pub drift_drop: f64,
    pub min_share: f64,
    pub min_samples: u64,
}

impl Default for ConvergeRule {
    fn default() -> Self {
        ConvergeRule {
            quiet_steps: 30,
            max_session_steps: 200,
            probe_every: 0,
            window_steps: 10,
            drift_drop: 0.5,
            min_share: 0.05,
            min_samples: 1000,
        }
    }
}

/// Whether tracking runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrackState {
    Tracking,
    Converged,
}

impl TrackState {
    pub fn name(self) -> &'static str {
        match self {
            TrackState::Tracking => "tracking",
            TrackState::Converged => "converged",
        }
    }
}

/// What the caller does after a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Go on as before.
    Continue,
    /// Placement converged: stop tracking.
    Stop,
    /// Converged: run one cheap sampling period now.
    Probe,
    /// The hot set drifted (or new memory came): track again.
    Restart,
}

/// The tracking state machine of [`ConvergeRule`] (pure: the caller feeds it steps).
#[derive(Clone, Debug)]
pub struct Convergence {
    rule: ConvergeRule,
    state: TrackState,
    quiet: u32,
    session: u32,
    decided: bool,
    /// Share of accesses on hugepage memory at the last convergence (None: none worth keeping).
    baseline: Option<f64>,
    /// Accesses (on hugepages, all) of the current session or window.
    acc: (u64, u64),
    window: u32,
    since_probe: u32,
    pub stops: u64,
    pub restarts: u64,
    pub probes: u64,
}

impl Convergence {
    pub fn new(rule: ConvergeRule) -> Self {
        Convergence {
            rule,
            state: TrackState::Tracking,
            quiet: 0,
            session: 0,
            decided: false,
            baseline: None,
            acc: (0, 0),
            window: 0,
            since_probe: 0,
            stops: 0,
            restarts: 0,
            probes: 0,
        }
    }

    pub fn state(&self) -> TrackState {
        self.state
    }

    pub fn rule(&self) -> &ConvergeRule {
        &self.rule
    }

    /// The share of accesses on hugepages remembered at the last convergence.
    pub fn baseline(&self) -> Option<f64> {
        self.baseline
    }

    /// One step: `changed` is whether the decision step since the last call promoted,
    /// compacted or otherwise decided something; `hits` the accesses (on hugepages, all) since
    /// the last call, (0, 0) if not measured.
    pub fn step(&mut self, changed: bool, hits: (u64, u64)) -> Action {
        let hits = (hits.0.min(hits.1), hits.1);
        self.acc = (self.acc.0 + hits.0, self.acc.1 + hits.1);
        match self.state {
            TrackState::Tracking => {
                self.session += 1;
                self.quiet = if changed { 0 } else { self.quiet + 1 };
                self.decided |= changed;
                let converged = (self.decided && self.quiet >= self.rule.quiet_steps)
                    || self.session >= self.rule.max_session_steps;
                if !converged {
                    return Action::Continue;
                }
                let (huge, all) = self.acc;
                let share = huge as f64 / all.max(1) as f64;
                self.baseline = (all >= self.rule.min_samples && share >= self.rule.min_share).then_some(share);
                self.state = TrackState::Converged;
                self.stops += 1;
                self.reset_counts();
                Action::Stop
            }
            TrackState::Converged => {
                if changed {
                    return self.restart();
                }
                self.window += 1;
                if self.window >= self.rule.window_steps.max(1) {
                    let (huge, all) = self.acc;
                    self.window = 0;
                    self.acc = (0, 0);
                    if all >= self.rule.min_samples {
                        let share = huge as f64 / all as f64;
                        match self.baseline {
                            Some(b) if share >= b * self.rule.drift_drop => {}
                            _ => return self.restart(),
                        }
                    }
                }
                if self.rule.probe_every > 0 {
                    self.since_probe += 1;
                    if self.since_probe >= self.rule.probe_every {
                        self.since_probe = 0;
                        self.probes += 1;
                        return Action::Probe;
                    }
                }
                Action::Continue
            }
        }
    }

    /// Memory was added to the tracked set: restart if converged.
    pub fn on_new_memory(&mut self) -> Action {
        match self.state {
            TrackState::Converged => self.restart(),
            TrackState::Tracking => {
                // A fresh session: what is new has to be decided before converging.
                self.quiet = 0;
                Action::Continue
            }
        }
    }

    /// Track again now (the application asked for it).
    pub fn force_restart(&mut self) -> Action {
        match self.state {
            TrackState::Converged => self.restart(),
            TrackState::Tracking => Action::Continue,
        }
    }

    fn restart(&mut self) -> Action {
        self.state = TrackState::Tracking;
        self.restarts += 1;
        self.reset_counts();
        Action::Restart
    }

    fn reset_counts(&mut self) {
        self.quiet = 0;
        self.session = 0;
        self.decided = false;
        self.acc = (0, 0);
        self.window = 0;
        self.since_probe = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn v(observed: u32, active: u32) -> RegionView {
        RegionView { total: 512, observed, active }
    }

    #[test]
    fn the_seed_rule_on_whole_regions() {
        let r = RegionRule::default();
        assert_eq!(decide(&v(512, 128), &r), Decision::Promote);
        assert_eq!(decide(&v(512, 127), &r), Decision::Compact);
        assert_eq!(decide(&v(512, 1), &r), Decision::Compact);
        assert_eq!(decide(&v(512, 0), &r), Decision::Observe);
        assert_eq!(decide(&v(64, 8), &r), Decision::ObserveFully);
        assert_eq!(decide(&v(64, 64), &r), Decision::Promote);
        assert_eq!(decide(&v(8, 8), &r), Decision::Observe);
    }

    fn rule() -> ConvergeRule {
        ConvergeRule {
            quiet_steps: 3,
            max_session_steps: 10,
            probe_every: 4,
            window_steps: 2,
            drift_drop: 0.5,
            min_share: 0.05,
            min_samples: 100,
        }
    }

    #[test]
    fn convergence_stops_after_quiet_steps_and_probes_while_stopped() {
        let mut c = Convergence::new(rule());
        assert_eq!(c.step(false, (0, 0)), Action::Continue);
        assert_eq!(c.step(true, (90, 100)), Action::Continue);
        assert_eq!(c.step(false, (90, 100)), Action::Continue);
        assert_eq!(c.step(false, (90, 100)), Action::Continue);
        assert_eq!(c.step(false, (90, 100)), Action::Stop);
        assert_eq!(c.state(), TrackState::Converged);
        assert_eq!(c.baseline(), Some(0.9));
        // Steady share, no decisions: a probe every 4 steps, nothing else.
        let acts: Vec<Action> = (0..8).map(|_| c.step(false, (80, 100))).collect();
        assert_eq!(acts.iter().filter(|&&a| a == Action::Probe).count(), 2);
        assert!(acts.iter().all(|&a| a != Action::Restart));
        // A probe that led to a decision restarts.
        assert_eq!(c.step(true, (0, 0)), Action::Restart);
        assert_eq!((c.stops, c.restarts, c.probes), (1, 1, 2));
    }

    #[test]
    fn convergence_restarts_when_the_share_halves_or_memory_comes() {
        let mut c = Convergence::new(ConvergeRule { probe_every: 0, ..rule() });
        c.step(true, (50, 100));
        for _ in 0..3 {
            c.step(false, (50, 100));
        }
        assert_eq!(c.state(), TrackState::Converged);
        assert_eq!(c.step(false, (30, 100)), Action::Continue);
        assert_eq!(c.step(false, (30, 100)), Action::Continue); // window 0.30 >= 0.25
        assert_eq!(c.step(false, (20, 100)), Action::Continue);
        // Window 0.20 < 0.25.
        assert_eq!(c.step(false, (20, 100)), Action::Restart);
        // A session that never decides anything converges after max_session_steps, with no
        // baseline: then load alone restarts, no load does not.
        let mut c = Convergence::new(rule());
        for i in 1..=10 {
            let a = c.step(false, (0, 10));
            assert_eq!(a, if i == 10 { Action::Stop } else { Action::Continue });
        }
        assert_eq!(c.baseline(), None);
        assert_eq!(c.step(false, (0, 10)), Action::Continue);
        assert_eq!(c.step(false, (0, 10)), Action::Continue);
        assert_eq!(c.on_new_memory(), Action::Restart);
        assert_eq!(c.state(), TrackState::Tracking);
    }

    #[test]
    fn backoff_pauses_after_slow_and_resets_after_fast() {
        let mut b = Backoff::new(50, 100, 1000);
        assert!(b.allowed(0));
        b.record(10, 60, CollapseOutcome::Done);
        assert!(!b.allowed(50));
        assert!(b.allowed(110));
        b.record(110, 70, CollapseOutcome::Done);
        assert!(!b.allowed(250));
        assert!(b.allowed(310));
        b.record(310, 5, CollapseOutcome::Done);
        assert_eq!(b.streak(), 0);
        assert!(b.allowed(310));
    }

    #[test]
    fn backoff_pauses_when_no_hugepage_but_not_for_a_refused_region() {
        let mut b = Backoff::new(50, 100, 1000);
        b.record(10, 5, CollapseOutcome::RegionRefused);
        assert!(b.allowed(10));
        assert_eq!(b.streak(), 0);
        b.record(20, 5, CollapseOutcome::NoHugepage);
        assert!(!b.allowed(100));
        assert!(b.allowed(120));
        // A refused region neither pauses nor ends the streak of a hugepage shortage.
        b.record(120, 500, CollapseOutcome::RegionRefused);
        assert!(b.allowed(120));
        assert_eq!(b.streak(), 1);
        assert_eq!(CollapseOutcome::of_errno(libc::ENOMEM), CollapseOutcome::NoHugepage);
        assert_eq!(CollapseOutcome::of_errno(libc::EBUSY), CollapseOutcome::NoHugepage);
        assert_eq!(CollapseOutcome::of_errno(libc::EAGAIN), CollapseOutcome::RegionRefused);
        assert_eq!(CollapseOutcome::of_errno(libc::EINVAL), CollapseOutcome::RegionRefused);
    }

    proptest! {
        #[test]
        fn decisions_follow_the_threshold(total in 1u32..1024, obs_frac in 0.0f64..=1.0, act_frac in 0.0f64..=1.0, f in 0.01f64..1.0) {
            let observed = (total as f64 * obs_frac) as u32;
            let active = (observed as f64 * act_frac) as u32;
            let rule = RegionRule { promote_fraction: f, min_observed: 32, min_filled: 0.0 };
            let d = decide(&RegionView { total, observed, active }, &rule);
            match d {
                Decision::Promote => prop_assert!(active > 0 && active as f64 >= f * observed as f64),
                Decision::Compact => prop_assert!(observed == total && active > 0 && (active as f64) < f * observed as f64),
                Decision::ObserveFully => prop_assert!(observed < total && (active as f64) < f * observed as f64),
                Decision::Observe => prop_assert!(active == 0 || observed < 32.min(total)),
            }
            // Monotone: more active pages never turn a promotion into something else.
            if d == Decision::Promote && active < observed {
                prop_assert_eq!(decide(&RegionView { total, observed, active: active + 1 }, &rule), Decision::Promote);
            }
        }

        #[test]
        fn a_promotion_adds_at_most_what_the_rule_allows(total in 1u32..1024, resident in 0u32..1100, m in 0.0f64..=1.0) {
            let rule = RegionRule { min_filled: m, ..RegionRule::default() };
            let ok = filled_enough(resident, total, &rule);
            // Allowed: the zeroed pages a collapse adds are at most (1 - m) of the region.
            if ok { prop_assert!(f64::from(total - resident.min(total)) <= (1.0 - m) * f64::from(total) + 1e-9); }
            // A full region is always enough; with m = 1 nothing else is, with m = 0 anything.
            prop_assert!(filled_enough(total, total, &rule));
            if m == 0.0 { prop_assert!(ok); }
            let full_only = RegionRule { min_filled: 1.0, ..rule };
            if resident < total { prop_assert!(!filled_enough(resident, total, &full_only)); }
            // Monotone in what the region holds.
            if ok { prop_assert!(filled_enough(resident + 1, total, &rule)); }
        }

        #[test]
        fn backoff_pause_is_bounded_and_grows(slow in proptest::collection::vec(any::<bool>(), 1..40)) {
            let mut b = Backoff::new(50, 100, 10_000);
            let mut now = 0u64;
            let mut last_pause = 0u64;
            for s in slow {
                b.record(now, if s { 80 } else { 10 }, CollapseOutcome::Done);
                let mut t = now;
                while !b.allowed(t) { t += 10; }
                let pause = t - now;
                prop_assert!(pause <= 10_000 + 10);
                if s { prop_assert!(pause >= last_pause.min(10_000)); last_pause = pause; } else { prop_assert_eq!(pause, 0); last_pause = 0; }
                now = t;
            }
        }

        #[test]
        fn convergence_invariants(steps in proptest::collection::vec((any::<bool>(), 0u64..200, 0u64..200, any::<bool>()), 1..400),
                                  quiet in 1u32..20, idle in 1u32..50, probe in 0u32..10, window in 1u32..8) {
            let r = ConvergeRule { quiet_steps: quiet, max_session_steps: idle, probe_every: probe, window_steps: window, drift_drop: 0.5, min_share: 0.05, min_samples: 50 };
            let mut c = Convergence::new(r);
            // Steps since tracking (re)started, and whether one of them decided something.
            let (mut run, mut quiet_run, mut decided) = (0u32, 0u32, false);
            let mut since_probe = 0u32;
            for (changed, a, b, new_mem) in steps {
                let before = c.state();
                let act = if new_mem { c.on_new_memory() } else { c.step(changed, (a, b)) };
                match (before, act) {
                    (TrackState::Tracking, Action::Stop) => {
                        prop_assert!(!new_mem);
                        // Converged only after `quiet` quiet steps that followed a decision,
                        // or once the session lasted `idle` steps.
                        let decided_now = decided || changed;
                        let quiet_now = if changed { 0 } else { quiet_run + 1 };
                        prop_assert!((decided_now && quiet_now >= quiet) || run + 1 >= idle);
                        prop_assert_eq!(c.state(), TrackState::Converged);
                        since_probe = 0;
                    }
                    (TrackState::Tracking, a) => {
                        prop_assert_eq!(a, Action::Continue);
                        prop_assert_eq!(c.state(), TrackState::Tracking);
                        if new_mem { quiet_run = 0; } else {
                            run += 1;
                            decided |= changed;
                            quiet_run = if changed { 0 } else { quiet_run + 1 };
                            // Never tracks longer than the bounds allow.
                            prop_assert!(run < idle);
                            prop_assert!(quiet_run < quiet || !decided);
                        }
                    }
                    (TrackState::Converged, Action::Restart) => {
                        prop_assert_eq!(c.state(), TrackState::Tracking);
                        (run, quiet_run, decided) = (0, 0, false);
                    }
                    (TrackState::Converged, Action::Probe) => {
                        prop_assert!(probe > 0 && !changed);
                        prop_assert_eq!(since_probe + 1, probe);
                        since_probe = 0;
                    }
                    (TrackState::Converged, a) => {
                        prop_assert_eq!(a, Action::Continue);
                        // A decision while converged always restarts.
                        prop_assert!(!changed);
                        if probe > 0 { since_probe += 1; prop_assert!(since_probe < probe); }
                    }
                }
                if before == TrackState::Tracking && act == Action::Stop {
                    (run, quiet_run, decided) = (0, 0, false);
                }
                prop_assert!(c.stops >= c.restarts && c.stops <= c.restarts + 1);
            }
        }

        #[test]
        fn thinning_is_monotone_and_bounded(base in 1u64..100, max in 1u64..10_000, idle in 0u32..40) {
            let a = thinned_interval_ms(base, max, idle);
            let b = thinned_interval_ms(base, max, idle + 1);
            prop_assert!(a <= b);
            prop_assert!(b <= max.max(base));
            prop_assert!(a >= base.min(max.max(base)));
        }
    }
}
