//! How often the CLOCK hand samples reference bits: a pure policy, no I/O.
//!
//! A resident unit's use is seen only by *arming* it (`runtime.rs`, "Reference bits"): the
//! hand takes its pages out of the program's view, and its next access faults and puts them
//! back. An arm and its reference fault cost two page-table moves and a fault's round trip —
//! about a fifth of fetching a 64 KiB unit from its home (25 µs against 124 µs, handler thread,
//! measured as below), and far more than a hardware accessed bit. They pay when the bit tells units apart: a few hot units among many the
//! program has done with (a scan, a finished phase), where keeping the hot ones saves fetches.
//!
//! They do not pay when nearly every armed unit comes back before the hand does: the program
//! uses all of what is resident, so keeping one unit rather than another saves nothing, and
//! each eviction pays for every referenced unit the hand passes on its way to an unreferenced
//! one. Random reads over 48 MiB with 5% of it not local (64 KiB units, handler thread) paid
//! 6.6 reference faults per fetch and took 46.7 s, against 19.0 s with second chances thinned
//! as below; a JVM summing its heap in scattered order, 2 MiB short, 22.5 s against 1.9 s
//! (issue 22: a CI run killed at its time limit).
//!
//! So the policy watches the *return rate* — of the units armed lately, the share whose next
//! access came (decayed counts: the last [`WINDOW`] to twice that many arms). While it is at most
//! [`MAX_RETURN_RATE`], every referenced unit the hand passes gets its second chance, as in
//! plain CLOCK. Above it, only one in [`SPARSE`] does — enough to keep measuring the rate, so a
//! phase with a cold set to evict turns full sampling back on — and the hand takes the others
//! as they come, which for a program that uses all it holds is as good a victim as any.
//!
//! Where [`MAX_RETURN_RATE`] comes from: passing units that each come back with probability
//! `r`, the hand arms `r / (1 - r)` of them per eviction, each costing a reference fault `R`;
//! evicting under the hand instead takes a unit still in use with probability about `r`, which
//! costs a fetch `F` later. Sampling pays while `1 / (1 - r) < F / R`: with `F / R` about 5
//! (64 KiB units), while `r` < 0.8. The bound errs towards sampling: smaller units cost less
//! to fetch.

/// The return rate above which second chances thin out.
pub const MAX_RETURN_RATE: f64 = 0.75;
/// Above that rate, one referenced unit in this many gets its second chance.
pub const SPARSE: u32 = 8;
/// The counts are halved when they reach twice this many arms: the rate follows the
/// program's phase.
pub const WINDOW: u32 = 64;
/// Fewer arms than this (since the start) say nothing yet: every second chance is given.
pub const MIN_ARMS: u32 = 16;

/// The return rate of armed units and the second chances it allows.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sampling {
    /// Arms counted (decayed).
    armed: u32,
    /// Reference faults counted (decayed with `armed`).
    returned: u32,
    /// Referenced units passed over without a second chance since the last one given.
    passed: u32,
}

impl Sampling {
    /// The share of armed units whose next access came; `None` before [`MIN_ARMS`] arms.
    pub fn return_rate(&self) -> Option<f64> {
        (self.armed >= MIN_ARMS).then(|| f64::from(self.returned.min(self.armed)) / f64::from(self.armed))
    }

    /// The hand meets a referenced unit it could arm: whether to (give it a second chance).
    /// When not, the caller takes it as the victim.
    pub fn second_chance(&mut self) -> bool {
        if self.return_rate().is_none_or(|r| r <= MAX_RETURN_RATE) {
            self.passed = 0;
            return true;
        }
        self.passed += 1;
        if self.passed >= SPARSE {
            self.passed = 0;
            return true;
        }
        false
    }

    /// A unit was armed.
    pub fn armed(&mut self) {
        self.armed += 1;
        if self.armed >= 2 * WINDOW {
            self.armed /= 2;
            self.returned /= 2;
        }
    }

    /// An armed unit was accessed (its reference fault).
    pub fn returned(&mut self) {
        self.returned = self.returned.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Arm `n` units of which the first `back` come back.
    fn arm(s: &mut Sampling, n: u32, back: u32) {
        for i in 0..n {
            s.armed();
            if i < back {
                s.returned();
            }
        }
    }

    #[test]
    fn every_chance_is_given_until_the_rate_is_known() {
        let mut s = Sampling::default();
        arm(&mut s, MIN_ARMS - 1, MIN_ARMS - 1);
        assert_eq!(s.return_rate(), None);
        assert!((0..100).all(|_| s.second_chance()));
    }

    #[test]
    fn units_that_stay_away_keep_full_sampling() {
        // A scan past a few hot units: most armed units never come back.
        let mut s = Sampling::default();
        arm(&mut s, 1000, 200);
        assert!(s.return_rate().unwrap() <= MAX_RETURN_RATE);
        assert!((0..100).all(|_| s.second_chance()));
    }

    #[test]
    fn units_that_all_come_back_get_one_chance_in_sparse() {
        // Uniform use of everything resident: every armed unit comes back.
        let mut s = Sampling::default();
        arm(&mut s, 1000, 1000);
        let given = (0..SPARSE * 10).filter(|_| s.second_chance()).count();
        assert_eq!(given, 10);
    }

    #[test]
    fn the_rate_follows_a_change_of_phase() {
        let mut s = Sampling::default();
        arm(&mut s, 1000, 1000);
        assert!(!s.second_chance());
        // Then a phase whose armed units stay away: within a few windows, full sampling.
        for _ in 0..4 {
            arm(&mut s, WINDOW, 0);
        }
        assert!(s.return_rate().unwrap() <= MAX_RETURN_RATE, "{s:?}");
        assert!((0..10).all(|_| s.second_chance()));
    }

    proptest! {
        /// Whatever arms and returns happen, the rate is a share, and no more than SPARSE - 1
        /// referenced units in a row go without a second chance.
        #[test]
        fn chances_are_never_refused_more_than_sparse_in_a_row(
            ops in proptest::collection::vec(0u8..3, 1..2000),
        ) {
            let mut s = Sampling::default();
            let mut refused_in_a_row = 0;
            for op in ops {
                match op {
                    0 => s.armed(),
                    1 => s.returned(),
                    _ => {
                        if s.second_chance() {
                            refused_in_a_row = 0;
                        } else {
                            refused_in_a_row += 1;
                        }
                    }
                }
                prop_assert!(refused_in_a_row < SPARSE);
                if let Some(r) = s.return_rate() {
                    prop_assert!((0.0..=1.0).contains(&r));
                }
            }
        }
    }
}
