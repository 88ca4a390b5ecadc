//! The page-size tuner of an unmodified program (`pagewise run --page-size auto`): windows of
//! time instead of `dlm_start`/`dlm_end` loops. Pure: the runtime passes in each window's
//! share of time spent serving faults and what it touched (`measure.rs`).
//!
//! # Why not the loop rule
//! The loop rule (`tune.rs`) shrinks the unit until what a loop touches fits in local memory.
//! A window is not a loop: a program that sweeps arrays larger than local memory touches more
//! than fits at *every* size, so the rule drove it to the smallest unit — where a sweep is
//! slowest (each fault fetches one page) — and locked it there: a real solver ran 1.76× its
//! best fixed size at 50% local memory, 2.3–3.1× for two programs sweeping at 10% (issue 22).
//! What fits says little about what is fast; the program's own time does.
//!
//! # The rule: try a neighbour, keep it only if measured faster
//! The tuner holds a *home* size. After a few windows there it *tries* a neighbour (half or
//! twice the size) for [`TRIAL_WINDOWS`] windows, then returns home for one more window, and
//! compares the neighbour's share of time in faults with the home windows just before and just
//! after it (A-B-A: a program drifting between phases moves both home measurements, so drift
//! is not mistaken for a better size). The neighbour becomes home only when it is faster by
//! more than [`BETTER_BY`]; then the next neighbour in the same direction is tried at once.
//! A neighbour that is not faster turns the search around; when both directions have failed
//! the home is settled and trials thin out (the settling time doubles up to
//! [`MAX_SETTLE_WINDOWS`]): a phase change later can still move it, at a small cost.
//!
//! Where to start and which way to look first come from what the windows touched: if the
//! touched units fit in local memory at the home size, reuse is kept and a larger unit may
//! fetch more per fault — look up; if not, look down first. The start is the middle of the
//! range (log scale), so either end is a few moves away.
//!
//! # Cost
//! One trial costs at most [`TRIAL_WINDOWS`] windows at a worse size; once settled, one trial
//! per [`MAX_SETTLE_WINDOWS`] windows. Moves only ever go to a measured-faster size.

use super::{Decision, Reason, Touched, TunerConfig};

/// Windows a neighbour is tried for.
pub const TRIAL_WINDOWS: u32 = 2;
/// A neighbour must spend this much less of its time in faults to become home.
pub const BETTER_BY: f64 = 0.08;
/// Windows at home before the first trial, and the longest wait between trials once settled.
pub const FIRST_SETTLE_WINDOWS: u32 = 1;
pub const MAX_SETTLE_WINDOWS: u32 = 32;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    /// At home, `left` windows before the next trial.
    Home { left: u32 },
    /// Trying `set`: its shares so far.
    Trial { set: u32, left: u32, sum: f64, n: u32 },
    /// Back home for one window after trying `set` (its mean share `share`).
    After { set: u32, share: f64 },
}

/// The state of the window tuner.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WindowTuner {
    /// The settled size (set count).
    pub home: u32,
    phase: Phase,
    /// The mean share of the home windows before the current trial.
    home_share: Option<f64>,
    /// Direction of the next trial: smaller (true) or larger.
    down: bool,
    /// Trials in a row that found nothing better (0, 1 or 2: both directions tried).
    misses: u32,
    /// Windows to wait at home before the next trial.
    settle: u32,
    iterations: u32,
}

impl WindowTuner {
    /// Start in the middle of the candidate sizes (log scale).
    pub fn new(cfg: &TunerConfig) -> Self {
        let c: Vec<u32> = cfg.candidates().collect();
        let home = c[c.len() / 2];
        WindowTuner {
            home,
            phase: Phase::Home { left: FIRST_SETTLE_WINDOWS },
            home_share: None,
            down: false,
            misses: 0,
            settle: FIRST_SETTLE_WINDOWS,
            iterations: 0,
        }
    }

    /// The set count in force now.
    pub fn set(&self) -> u32 {
        match self.phase {
            Phase::Trial { set, .. } => set,
            _ => self.home,
        }
    }

    /// A window closed: it spent `share` of its time serving faults and touched `touched`.
    /// Returns the decision (its `new_size` is in force from now on).
    pub fn on_window(&mut self, cfg: &TunerConfig, touched: &Touched, share: f64, loop_id: u64) -> Decision {
        let cur = self.set();
        let (next, reason) = match self.phase {
            Phase::Home { left } => {
                self.home_share = Some(match self.home_share {
                    Some(s) => 0.5 * s + 0.5 * share,
                    None => share,
                });
                if left > 1 {
                    self.phase = Phase::Home { left: left - 1 };
                    (self.home, Reason::Settled)
                } else {
                    if self.misses == 0 && self.iterations == 0 {
                        // First look: down if what the windows touch does not fit here.
                        self.down = touched.at(self.home) > cfg.local_units(self.home);
                    }
                    match self.neighbour(cfg) {
                        Some(n) => {
                            self.phase = Phase::Trial { set: n, left: TRIAL_WINDOWS, sum: 0.0, n: 0 };
                            (n, Reason::Explore)
                        }
                        None => {
                            self.phase = Phase::Home { left: self.settle };
                            (self.home, Reason::Settled)
                        }
                    }
                }
            }
            Phase::Trial { set, left, sum, n } => {
                let (sum, n) = (sum + share, n + 1);
                if left > 1 {
                    self.phase = Phase::Trial { set, left: left - 1, sum, n };
                    (set, Reason::Explore)
                } else {
                    self.phase = Phase::After { set, share: sum / n as f64 };
                    (self.home, Reason::Explore)
                }
            }
            Phase::After { set, share: trial } => {
                let before = self.home_share.unwrap_or(share);
                let base = 0.5 * (before + share);
                if trial < base * (1.0 - BETTER_BY) {
                    // Faster: it is home now; keep going the same way at once.
                    self.home = set;
                    self.home_share = Some(trial);
                    self.misses = 0;
                    self.settle = FIRST_SETTLE_WINDOWS;
                    self.phase = Phase::Home { left: FIRST_SETTLE_WINDOWS };
                    (set, Reason::Better)
                } else {
                    self.home_share = Some(base);
                    self.misses += 1;
                    self.down = !self.down;
                    if self.misses >= 2 {
                        // Both ways tried: settled; look again later, less and less often.
                        self.misses = 0;
                        self.settle = (self.settle * 2).clamp(4, MAX_SETTLE_WINDOWS);
                    }
                    self.phase =
                        Phase::Home { left: if self.misses == 1 { FIRST_SETTLE_WINDOWS } else { self.settle } };
                    (self.home, Reason::Worse)
                }
            }
        };
        let d = Decision {
            loop_id,
            iteration: self.iterations,
            working_set: touched.at(cur),
            local_units: cfg.local_units(cur),
            old_size: cur as usize * cfg.base_page,
            new_size: next as usize * cfg.base_page,
            loop_time: share,
            reason,
        };
        self.iterations += 1;
        d
    }

    /// The neighbour to try next: half or twice home, in the current direction, turning around
    /// at the ends of the range; `None` when there is only one size.
    fn neighbour(&mut self, cfg: &TunerConfig) -> Option<u32> {
        let smaller = (self.home > cfg.min_set).then_some(self.home / 2);
        let larger = (self.home < cfg.max_set).then_some(self.home * 2);
        let (first, second) = if self.down { (smaller, larger) } else { (larger, smaller) };
        match (first, second) {
            (Some(n), _) => Some(n),
            (None, Some(n)) => {
                self.down = !self.down;
                Some(n)
            }
            (None, None) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cfg() -> TunerConfig {
        // pagewise run: 4 KiB base, 4 KiB .. 1 MiB, 32 MiB local.
        TunerConfig { base_page: 4096, local_mem: 32 << 20, min_set: 1, max_set: 256 }
    }

    /// Run `windows` windows of a program whose share in faults at set count s is `cost(s)`.
    fn run(cost: impl Fn(u32) -> f64, windows: usize) -> (WindowTuner, Vec<u32>) {
        let c = cfg();
        let mut t = WindowTuner::new(&c);
        let mut sets = Vec::new();
        for _ in 0..windows {
            let s = t.set();
            sets.push(s);
            let d = t.on_window(&c, &Touched::default(), cost(s), u64::MAX);
            assert_eq!(d.new_size, t.set() as usize * 4096);
        }
        (t, sets)
    }

    #[test]
    fn starts_in_the_middle_of_the_range() {
        assert_eq!(WindowTuner::new(&cfg()).home, 16);
    }

    #[test]
    fn a_sweep_climbs_to_the_largest_unit() {
        // Larger units fetch more per fault: the share falls with the size.
        let (t, _) = run(|s| 0.9 / (1.0 + (s as f64).log2()), 60);
        assert_eq!(t.home, 256);
    }

    #[test]
    fn random_access_descends_to_the_smallest_unit() {
        let (t, _) = run(|s| 0.2 + 0.7 * (s as f64).log2() / 8.0, 60);
        assert_eq!(t.home, 1);
    }

    #[test]
    fn settles_on_a_best_size_in_between_and_trials_thin_out() {
        // Best at 32 (128 KiB): share grows by 0.1 per step away from it.
        let cost = |s: u32| 0.3 + 0.1 * ((s as f64).log2() - 5.0).abs();
        let (t, sets) = run(cost, 400);
        assert_eq!(t.home, 32);
        let late_trials = sets[300..].iter().filter(|&&s| s != 32).count();
        assert!(late_trials <= 100 / MAX_SETTLE_WINDOWS as usize * TRIAL_WINDOWS as usize + 2, "{late_trials}");
    }

    #[test]
    fn one_size_only_never_explores() {
        let c = TunerConfig { min_set: 8, max_set: 8, ..cfg() };
        let mut t = WindowTuner::new(&c);
        for _ in 0..10 {
            let d = t.on_window(&c, &Touched::default(), 0.5, u64::MAX);
            assert_eq!(d.new_size, 8 * 4096);
        }
    }

    proptest! {
        /// Whatever the measurements: the size stays in range; home only moves to a size just
        /// tried, by one step; and a trial never lasts longer than TRIAL_WINDOWS windows.
        #[test]
        fn moves_are_measured_steps_within_range(shares in proptest::collection::vec(0.0f64..1.0, 1..300)) {
            let c = cfg();
            let mut t = WindowTuner::new(&c);
            let mut away = 0;
            for share in shares {
                let home = t.home;
                let d = t.on_window(&c, &Touched::default(), share, u64::MAX);
                let s = t.set();
                prop_assert!(s >= c.min_set && s <= c.max_set);
                prop_assert!(t.home == home || t.home == home * 2 || t.home * 2 == home);
                if t.home != home {
                    prop_assert_eq!(d.reason, Reason::Better);
                    prop_assert_eq!(d.old_size, home as usize * 4096);
                }
                away = if s != t.home { away + 1 } else { 0 };
                prop_assert!(away <= TRIAL_WINDOWS);
            }
        }

        /// With noise on a unimodal cost, the tuner ends within one step of the best size.
        #[test]
        fn finds_the_best_size_through_noise(best in 0u32..9, seed in 0u64..1000) {
            let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            let cost = move |s: u32| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let noise = ((x >> 33) as f64 / (1u64 << 31) as f64 - 0.5) * 0.04;
                0.3 + 0.12 * ((s as f64).log2() - best as f64).abs() + noise
            };
            let c = cfg();
            let mut t = WindowTuner::new(&c);
            let mut cost = cost;
            for _ in 0..300 {
                let s = t.set();
                t.on_window(&c, &Touched::default(), cost(s), u64::MAX);
            }
            let got = t.home.trailing_zeros() as i64;
            prop_assert!((got - best as i64).abs() <= 1, "home 2^{} best 2^{}", got, best);
        }
    }
}
