//! How fast `pagewise hps run` may promote: a pure rule.
//!
//! A promotion costs before it pays. MADV_COLLAPSE allocates a hugepage and copies 512 pages
//! into it, and what that costs moves by 7× on one machine within seconds: on this VM kind
//! 0.6 ms of CPU a region when the hugepage comes from memory freed a moment ago, 3.9 ms when
//! it comes from memory the host has taken back (`pagewise_kernel::page_reporting`). What it
//! pays back — fewer TLB misses on a hot region — needs the program to run on. A program
//! nobody tuned for HPS may be about to end: GNU sort of 64 MiB runs 0.66 s, and collapsing
//! the 62 regions of its buffer it used made it 1.14× slower, for nothing it could still use.
//!
//! So promotion is paced the way ski rental is solved: never spend on it more than a share of
//! the time the program has already run. A token bucket of CPU time fills at `share` of wall
//! time, up to `burst`; a collapse may start while the bucket is not empty and takes what it
//! measured (the bucket may go into debt: a collapse costs what it costs, and the next waits
//! until the debt is paid). Whatever the program does, promotion has taken at most
//! `burst + share × elapsed` of CPU by the time it ends: a bounded loss for a program that gets
//! nothing from hugepages. A program that runs on gets every region the rule picks, later: at
//! 20% of one CPU, about 35 regions a second when a hugepage is dear here and 250 when it is
//! cheap. The pace adapts to the price by itself, since it counts what collapses took.

/// The pace of promotion: a token bucket of CPU nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pace {
    /// CPU time promotion may take per unit of wall time.
    pub share: f64,
    /// Most CPU time saved up (ns); also what the bucket starts with.
    pub burst_ns: u64,
    tokens_ns: f64,
    last_ns: u64,
}

impl Pace {
    /// A full bucket at time 0.
    pub fn new(share: f64, burst_ns: u64) -> Pace {
        Pace { share: share.clamp(0.0, 1.0), burst_ns, tokens_ns: burst_ns as f64, last_ns: 0 }
    }

    fn refill(&mut self, now_ns: u64) {
        let dt = now_ns.saturating_sub(self.last_ns);
        self.last_ns = self.last_ns.max(now_ns);
        self.tokens_ns = (self.tokens_ns + dt as f64 * self.share).min(self.burst_ns as f64);
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

    /// When the bucket is next non-empty, at the earliest (ns), for a caller that would sleep.
    pub fn next_allowed_ns(&self) -> u64 {
        if self.tokens_ns > 0.0 || self.share == 0.0 {
            return self.last_ns;
        }
        self.last_ns + (-self.tokens_ns / self.share).ceil() as u64 + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_full_bucket_lets_the_burst_through_then_the_share_sets_the_pace() {
        let mut p = Pace::new(0.05, 20 * MS);
        let mut now = 0;
        let mut done = 0;
        // Collapses of 4 ms back to back: the burst covers five, the sixth waits.
        while p.allowed(now) {
            p.spend(now, 4 * MS);
            done += 1;
        }
        assert_eq!(done, 5);
        // Paying 0 ms back at 5%: the next one starts 1 ns later... no: the bucket is at 0.
        assert!(!p.allowed(now));
        now = p.next_allowed_ns();
        assert!(p.allowed(now));
        // From then on, one 4 ms collapse every 80 ms of wall time.
        p.spend(now, 4 * MS);
        let t = now;
        assert!(!p.allowed(t + 79 * MS));
        assert!(p.allowed(t + 81 * MS));
    }

    #[test]
    fn debt_is_paid_before_the_next_promotion_and_saving_stops_at_the_burst() {
        let mut p = Pace::new(0.1, 10 * MS);
        p.spend(0, 30 * MS); // one dear collapse: 20 ms of debt
        assert!(!p.allowed(199 * MS));
        assert!(p.allowed(201 * MS));
        // A long idle stretch saves up only the burst.
        assert!(p.allowed(100_000 * MS));
        p.spend(100_000 * MS, 10 * MS);
        assert!(!p.allowed(100_000 * MS));
    }

    #[test]
    fn a_zero_share_allows_only_the_burst() {
        let mut p = Pace::new(0.0, 5 * MS);
        assert!(p.allowed(0));
        p.spend(0, 6 * MS);
        assert!(!p.allowed(u64::MAX / 2));
    }

    proptest! {
        /// Whatever the costs and the times, the CPU taken by promotions that started never
        /// exceeds burst + share × elapsed + the cost of the last one started.
        #[test]
        fn spending_is_bounded_by_the_share_of_elapsed_time(
            share in 0.0f64..0.5,
            burst_ms in 0u64..50,
            steps in proptest::collection::vec((0u64..20 * MS, 0u64..10 * MS), 1..200),
        ) {
            let mut p = Pace::new(share, burst_ms * MS);
            let (mut now, mut spent, mut last) = (0u64, 0u64, 0u64);
            for (gap, cost) in steps {
                now += gap;
                if p.allowed(now) {
                    p.spend(now, cost);
                    spent += cost;
                    last = cost;
                }
                let bound = (burst_ms * MS) as f64 + share * now as f64 + last as f64;
                prop_assert!(spent as f64 <= bound + 1.0, "spent {spent} > bound {bound}");
            }
        }
    }
}
