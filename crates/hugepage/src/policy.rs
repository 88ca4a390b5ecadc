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
}

impl Default for RegionRule {
    fn default() -> Self {
        RegionRule { promote_fraction: 0.25, min_observed: 32 }
    }
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

/// Latency guard of synchronous promotion (TCMalloc's hugepage-aware allocator backs off when
/// a collapse is slow: a collapse over `slow_ns` means the kernel had to compact memory to find
/// a hugepage, and more attempts now would stall the application). After a slow collapse,
/// promotion pauses for `base_pause_ns`, doubling with each consecutive slow one up to
/// `max_pause_ns`; a fast collapse resets the streak.
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

    /// Record a collapse that ended at `now_ns` after `took_ns` (or failed: `ok == false`,
    /// which counts as slow: the kernel found no hugepage).
    pub fn record(&mut self, now_ns: u64, took_ns: u64, ok: bool) {
        if ok && took_ns <= self.slow_ns {
            self.streak = 0;
            return;
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

    #[test]
    fn backoff_pauses_after_slow_and_resets_after_fast() {
        let mut b = Backoff::new(50, 100, 1000);
        assert!(b.allowed(0));
        b.record(10, 60, true);
        assert!(!b.allowed(50));
        assert!(b.allowed(110));
        b.record(110, 70, true);
        assert!(!b.allowed(250));
        assert!(b.allowed(310));
        b.record(310, 5, true);
        assert_eq!(b.streak(), 0);
        assert!(b.allowed(310));
    }

    proptest! {
        #[test]
        fn decisions_follow_the_threshold(total in 1u32..1024, obs_frac in 0.0f64..=1.0, act_frac in 0.0f64..=1.0, f in 0.01f64..1.0) {
            let observed = (total as f64 * obs_frac) as u32;
            let active = (observed as f64 * act_frac) as u32;
            let rule = RegionRule { promote_fraction: f, min_observed: 32 };
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
        fn backoff_pause_is_bounded_and_grows(slow in proptest::collection::vec(any::<bool>(), 1..40)) {
            let mut b = Backoff::new(50, 100, 10_000);
            let mut now = 0u64;
            let mut last_pause = 0u64;
            for s in slow {
                b.record(now, if s { 80 } else { 10 }, true);
                let mut t = now;
                while !b.allowed(t) { t += 10; }
                let pause = t - now;
                prop_assert!(pause <= 10_000 + 10);
                if s { prop_assert!(pause >= last_pause.min(10_000)); last_pause = pause; } else { prop_assert_eq!(pause, 0); last_pause = 0; }
                now = t;
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
