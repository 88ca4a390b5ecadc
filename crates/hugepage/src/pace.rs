//! How fast `pagewise hps run` may promote: a pure rule.
//!
//! A promotion costs before it pays. MADV_COLLAPSE allocates a hugepage and copies 512 pages
//! into it, and what that costs moves by 7× on one machine within seconds: on this VM kind
//! 0.6 ms of CPU a region when the hugepage comes from memory freed a moment ago, 3.9 ms when
//! it comes from memory the host has taken back (`pagewise_kernel::page_reporting`; the
//! warm-up before each collapse, `crate::promote::warm_hugepage`, moves that cost off the
//! program's path but not off the machine). What it pays back — fewer TLB misses on a hot
//! region — needs the program to run on. A program nobody tuned for HPS may be about to end:
//! GNU sort of 64 MiB runs 0.7 s, and collapsing the regions of its buffer it used made it
//! 1.14× slower, for nothing it could still use.
//!
//! So promotion is paced the way ski rental is solved: never spend on it more than a share of
//! the time the program has already run. A token bucket of CPU time fills at `share` of wall
//! time, up to `burst`; a collapse may start while the bucket is not empty and takes what it
//! measured (the bucket may go into debt: a collapse costs what it costs, and the next waits
//! until the debt is paid). The share itself grows with the program's age, from none at its
//! start to `share` after `ramp`: the longer a program has run, the likelier it runs long
//! enough to earn a hugepage back, and a short one should lose next to nothing. The CPU is
//! not free because it is another core's: a program's own other threads, or the process
//! reading its output, want that core (sort's output read through a pipe: 1.16× plain at a
//! flat 20%, 1.04× at a flat 2%). Whatever the program does, promotion has taken at most
//! `burst + ∫ share` of CPU by the time it ends, plus the collapse that was running: a bounded
//! loss for a program that gets nothing from hugepages, `share × t² / (2 ramp)` for one that
//! ends at `t` within the ramp. A program that runs on gets every region the rule picks,
//! later: at 20% of one CPU, about 35 regions a second when a hugepage is dear here and 250
//! when it is cheap. The pace adapts to the price by itself, since it counts what collapses
//! took.

/// The pace of promotion: a token bucket of CPU nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pace {
    /// CPU time promotion may take per unit of wall time, once the ramp is over.
    pub share: f64,
    /// Most CPU time saved up (ns).
    pub burst_ns: u64,
    /// Wall time over which the share grows from none to `share` (ns); 0: `share` at once.
    pub ramp_ns: u64,
    tokens_ns: f64,
    last_ns: u64,
}

impl Pace {
    /// An empty bucket at time 0 (the first promotion may start at once and goes into debt).
    pub fn new(share: f64, burst_ns: u64, ramp_ns: u64) -> Pace {
        Pace { share: share.clamp(0.0, 1.0), burst_ns, ramp_ns, tokens_ns: 0.0, last_ns: 0 }
    }

    /// CPU time the bucket has received from time 0 to `t_ns`, without the burst's cap: the
    /// integral of the share, which grows linearly over the ramp and then stays.
    pub fn earned_ns(&self, t_ns: u64) -> f64 {
        let (t, ramp) = (t_ns as f64, self.ramp_ns as f64);
        if t <= ramp && ramp > 0.0 {
            self.share * t * t / (2.0 * ramp)
        } else {
            self.share * (t - ramp / 2.0)
        }
    }

    fn refill(&mut self, now_ns: u64) {
        if now_ns > self.last_ns {
            let earned = self.earned_ns(now_ns) - self.earned_ns(self.last_ns);
            self.tokens_ns = (self.tokens_ns + earned).min(self.burst_ns as f64);
            self.last_ns = now_ns;
        }
    }

    /// May a promotion start at `now_ns`?
    pub fn allowed(&mut self, now_ns: u64) -> bool {
        self.refill(now_ns);
        self.tokens_ns > 0.0
    }

    /// A promotion that ended at `now_ns` took `cost_ns` of CPU.
    pub fn spend(&mut self, now_ns: u64, cost_ns: u64) {
        self.refill(now_ns);
        self.tokens_ns -= cost_ns as f64;
    }

    /// From `now_ns` on, the whole share: the program has shown it runs on (a server that
    /// began listening for connections runs until it is stopped), so its age no longer says
    /// how soon it may end. What the ramp earned so far stays; nothing is earned backwards.
    pub fn end_ramp(&mut self, now_ns: u64) {
        self.refill(now_ns);
        self.ramp_ns = 0;
    }
}

/// A pace charged with a running total rather than per use: tracking's cost (the handler's CPU
/// time, the time spent arming) grows on its own between periods, and each look charges what
/// it grew by since the last.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChargedPace {
    pace: Pace,
    charged_ns: u64,
}

impl ChargedPace {
    pub fn new(pace: Pace) -> ChargedPace {
        ChargedPace { pace, charged_ns: 0 }
    }

    /// Charge the growth of `total_ns` since the last look, then: may the next use start at
    /// `now_ns`?
    pub fn allows(&mut self, now_ns: u64, total_ns: u64) -> bool {
        self.pace.spend(now_ns, total_ns.saturating_sub(self.charged_ns));
        self.charged_ns = self.charged_ns.max(total_ns);
        self.pace.allowed(now_ns)
    }

    /// [`Pace::end_ramp`].
    pub fn end_ramp(&mut self, now_ns: u64) {
        self.pace.end_ramp(now_ns);
    }

    /// Charge as [`ChargedPace::allows`], then what a use starting at `now_ns` may spend: the
    /// CPU time saved up, or `None` while in debt (or with nothing saved).
    pub fn affordable_ns(&mut self, now_ns: u64, total_ns: u64) -> Option<f64> {
        self.allows(now_ns, total_ns).then_some(self.pace.tokens_ns)
    }
}

/// Fewest faults per armed page a period is planned for: a program whose armed pages went
/// mostly untouched so far may touch all of the next period's, and then overspends the pace
/// by at most this factor's inverse (8×) before the debt holds tracking back.
pub const MIN_FAULT_RATIO: f64 = 0.125;

/// How many pages a tracking period may arm with `tokens_ns` to spend, when a fault costs the
/// program `fault_ns` and a `fault_ratio` of armed pages has faulted so far (`None`: no
/// history; every armed page is assumed touched). A period's faults are paid after it starts,
/// so what it arms is its cost: a whole 770 MiB heap armed at once cost a JVM 9% of its run.
pub fn affordable_pages(tokens_ns: f64, fault_ns: f64, fault_ratio: Option<f64>) -> usize {
    let ratio = fault_ratio.unwrap_or(1.0).clamp(MIN_FAULT_RATIO, 1.0);
    let per_page = (fault_ns * ratio).max(1.0);
    (tokens_ns.max(0.0) / per_page) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn without_a_ramp_the_share_sets_the_pace_and_debt_is_paid_first() {
        let mut p = Pace::new(0.05, 20 * MS, 0);
        assert!(!p.allowed(0), "nothing earned at time 0");
        // Saved up to the burst: five collapses of 4 ms back to back, the sixth waits.
        let mut now = 1000 * MS;
        let mut done = 0;
        while p.allowed(now) {
            p.spend(now, 4 * MS);
            done += 1;
        }
        assert_eq!(done, 5);
        // From then on, one 4 ms collapse every 80 ms of wall time.
        now += 1;
        assert!(p.allowed(now));
        p.spend(now, 4 * MS);
        assert!(!p.allowed(now + 79 * MS));
        assert!(p.allowed(now + 81 * MS));
        // One dear collapse: its debt is paid before the next.
        let t = now + 81 * MS;
        p.spend(t, 30 * MS);
        assert!(!p.allowed(t + 550 * MS));
        assert!(p.allowed(t + 610 * MS));
    }

    #[test]
    fn the_share_grows_over_the_ramp() {
        let p = Pace::new(0.2, 25 * MS, 10_000 * MS);
        // A quarter of the way through, a sixteenth of what the whole ramp earns; then 20%.
        assert!((p.earned_ns(2_500 * MS) - 0.2 * 2_500.0 * MS as f64 / 8.0).abs() < 1.0);
        assert!((p.earned_ns(10_000 * MS) - 1_000.0 * MS as f64).abs() < 1.0);
        assert!((p.earned_ns(11_000 * MS) - 1_200.0 * MS as f64).abs() < 1.0);
        // A program of 0.7 s: one 5 ms collapse at its start, and no other before 0.7 s.
        let mut p = p;
        assert!(p.allowed(MS));
        p.spend(6 * MS, 5 * MS);
        assert!(!p.allowed(700 * MS));
        assert!(p.allowed(800 * MS));
    }

    #[test]
    fn ending_the_ramp_gives_the_whole_share_from_then_on_and_nothing_backwards() {
        let mut p = Pace::new(0.2, 25 * MS, 10_000 * MS);
        // At 1 s the ramp has earned 10 ms (0.2 × 1² / 20); an 11 ms collapse leaves 1 ms of debt.
        assert!(p.allowed(1_000 * MS));
        p.spend(1_000 * MS, 11 * MS);
        let mut ramped = p;
        p.end_ramp(1_000 * MS);
        // The debt is paid at 20% from then on (5 ms), not at the ramp's 2% of this age (50 ms).
        assert!(!p.allowed(1_004 * MS));
        assert!(p.allowed(1_006 * MS));
        assert!(!ramped.allowed(1_006 * MS));
        // Then 10 ms of collapse per 50 ms.
        p.spend(1_006 * MS, 10 * MS);
        assert!(!p.allowed(1_050 * MS));
        assert!(p.allowed(1_056 * MS));
    }

    #[test]
    fn a_running_total_is_charged_by_its_growth() {
        let mut p = ChargedPace::new(Pace::new(0.2, 25 * MS, 0));
        assert!(p.allows(10 * MS, 0), "2 ms earned, nothing spent");
        // 5 ms spent by 20 ms, when 4 ms were earned: in debt until 25 ms.
        assert!(!p.allows(20 * MS, 5 * MS));
        assert!(!p.allows(25 * MS, 5 * MS), "the same total is not charged twice, and 5 ms earned just pays it");
        assert!(p.allows(26 * MS, 5 * MS));
        // A total that reads lower (a clock read before another) charges nothing.
        assert!(p.allows(27 * MS, 4 * MS));
        assert!(!p.allows(28 * MS, 6 * MS), "1 ms more than the highest total charged");
    }

    #[test]
    fn a_period_arms_what_its_faults_can_pay() {
        // 2 ms saved, 50 µs a fault: 40 pages all touched, 160 when a quarter are.
        assert_eq!(affordable_pages(2e6, 50e3, None), 40);
        assert_eq!(affordable_pages(2e6, 50e3, Some(0.25)), 160);
        // A history of untouched pages counts for at most an eighth.
        assert_eq!(affordable_pages(2e6, 50e3, Some(0.0)), 320);
        assert_eq!(affordable_pages(-1e6, 50e3, None), 0);
        let mut p = ChargedPace::new(Pace::new(0.2, 25 * MS, 0));
        assert_eq!(p.affordable_ns(10 * MS, 0), Some(2e6));
        assert_eq!(p.affordable_ns(20 * MS, 5 * MS), None, "in debt");
    }

    proptest! {
        /// Whatever the cost and history, the pages planned, all faulting, cost at most the
        /// tokens over the least fault ratio.
        #[test]
        fn planned_faults_never_cost_more_than_the_tokens_allow(
            tokens in 0.0f64..1e9, fault_ns in 10.0f64..1e6, ratio in proptest::option::of(0.0f64..1.0),
        ) {
            let pages = affordable_pages(tokens, fault_ns, ratio) as f64;
            prop_assert!(pages * fault_ns * MIN_FAULT_RATIO <= tokens + 1e-6);
            let r = ratio.unwrap_or(1.0).max(MIN_FAULT_RATIO);
            prop_assert!((pages + 1.0) * fault_ns * r > tokens, "not the most affordable: {pages}");
        }
    }

    #[test]
    fn a_zero_share_allows_nothing() {
        let mut p = Pace::new(0.0, 5 * MS, 0);
        assert!(!p.allowed(0));
        assert!(!p.allowed(u64::MAX / 2));
    }

    proptest! {
        /// Whatever the costs and the times, the CPU taken by promotions that started never
        /// exceeds what the share earned up to then (at most the burst saved up at a time)
        /// plus the cost of the last one started.
        #[test]
        fn spending_is_bounded_by_the_share_earned(
            share in 0.0f64..0.5,
            burst_ms in 0u64..50,
            ramp_ms in prop_oneof![Just(0u64), 1u64..20_000],
            steps in proptest::collection::vec((0u64..200 * MS, 0u64..10 * MS), 1..200),
            ramp_ends_at in proptest::option::of(0usize..200),
        ) {
            let mut p = Pace::new(share, burst_ms * MS, ramp_ms * MS);
            let (mut now, mut spent, mut last) = (0u64, 0u64, 0u64);
            for (i, (gap, cost)) in steps.into_iter().enumerate() {
                now += gap;
                if ramp_ends_at == Some(i) {
                    // Ended at any time, the bound holds with the share earned flat from 0.
                    p.end_ramp(now);
                }
                if p.allowed(now) {
                    p.spend(now, cost);
                    spent += cost;
                    last = cost;
                }
                let bound = p.earned_ns(now) + last as f64;
                prop_assert!(spent as f64 <= bound + 1.0, "spent {spent} > bound {bound}");
            }
        }
    }
}
