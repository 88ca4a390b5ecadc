//! Which pages to arm in a tracking period: a pure function of the regions' modes, the
//! budget and a cursor.
//!
//! Why a rotating chunk per region and not random single pages: arming is one MADV_DONTNEED per
//! contiguous run, and each call flushes the TLB, so 64 scattered pages cost 64 syscalls and 64
//! flushes where one 256 KiB chunk costs one. A chunk of 1/8 of a region, moved by one chunk
//! each period, observes every page of a region once in 8 periods, and after one period already
//! gives an unbiased estimate of the region's active fraction for a uniformly hot region —
//! which is all the promotion rule needs. Regions the policy wants counted page-exactly
//! (`Full`: candidates for compaction) are armed whole; the cost of a fault is paid only for
//! pages actually touched, so arming an idle page is nearly free.

/// What the tracker does with a 2 MiB region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum RegionMode {
    /// Arm a rotating chunk each period.
    Sample = 0,
    /// Arm every page each period (page-exact counts for compaction).
    Full = 1,
    /// Never arm: promoted (PMD-mapped; arming would split it) or retired.
    Skip = 2,
    /// Not armed while a decision about it is pending: its counts already say what to do, and
    /// arming it again would only cost the application faults.
    Hold = 3,
}

impl RegionMode {
    pub fn from_u8(v: u8) -> Self {
        match v {
            1 => RegionMode::Full,
            2 => RegionMode::Skip,
            3 => RegionMode::Hold,
            _ => RegionMode::Sample,
        }
    }
}

/// Bounds of one period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanConfig {
    /// Pages per region (512 for 2 MiB regions of 4 KiB pages).
    pub pages_per_region: usize,
    /// Pages of a `Sample` region armed per period (a chunk).
    pub sample_pages: usize,
    /// At most this many pages armed per period over all regions (at least one region's worth
    /// is always armed so tracking makes progress).
    pub budget_pages: usize,
}

/// The plan of one period: runs of pages `(first_page, count)` relative to the range start, in
/// increasing order and coalesced, and the region to start from next period.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub runs: Vec<(usize, usize)>,
    pub next_cursor: usize,
    pub pages: usize,
}

/// Plan period number `period` starting at region `cursor` (round-robin).
pub fn plan(modes: &[RegionMode], cfg: &PlanConfig, period: u64, cursor: usize) -> Plan {
    let n = modes.len();
    let ppr = cfg.pages_per_region.max(1);
    let sample = cfg.sample_pages.clamp(1, ppr);
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut pages = 0usize;
    let mut next_cursor = if n == 0 { 0 } else { cursor % n };
    for step in 0..n {
        let r = (cursor + step) % n;
        let (off, count) = match modes[r] {
            RegionMode::Skip | RegionMode::Hold => {
                next_cursor = (r + 1) % n;
                continue;
            }
            RegionMode::Full => (0, ppr),
            // The chunk index rotates with the period and differs between neighbours, so a
            // pattern aligned to region boundaries is not always sampled at the same offset.
            RegionMode::Sample => {
                let chunks = ppr.div_ceil(sample);
                let idx = ((period as usize).wrapping_add(r)) % chunks;
                let off = idx * sample;
                (off, sample.min(ppr - off))
            }
        };
        if pages > 0 && pages + count > cfg.budget_pages {
            break;
        }
        pages += count;
        next_cursor = (r + 1) % n;
        runs.push((r * ppr + off, count));
    }
    runs.sort_unstable();
    let mut merged: Vec<(usize, usize)> = Vec::with_capacity(runs.len());
    for (s, c) in runs {
        match merged.last_mut() {
            Some((ps, pc)) if *ps + *pc == s => *pc += c,
            _ => merged.push((s, c)),
        }
    }
    Plan { runs: merged, next_cursor, pages }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn mode() -> impl Strategy<Value = RegionMode> {
        prop_oneof![Just(RegionMode::Sample), Just(RegionMode::Full), Just(RegionMode::Skip), Just(RegionMode::Hold)]
    }

    #[test]
    fn full_regions_are_armed_whole_and_coalesced() {
        let cfg = PlanConfig { pages_per_region: 512, sample_pages: 64, budget_pages: 1 << 20 };
        let p = plan(&[RegionMode::Full, RegionMode::Full, RegionMode::Skip], &cfg, 0, 0);
        assert_eq!(p.runs, vec![(0, 1024)]);
        assert_eq!(p.pages, 1024);
    }

    proptest! {
        #[test]
        fn plan_respects_bounds_budget_and_skips(
            modes in proptest::collection::vec(mode(), 0..40),
            sample in 1usize..600, budget in 1usize..20_000, period in 0u64..1000, cursor in 0usize..100,
        ) {
            let cfg = PlanConfig { pages_per_region: 512, sample_pages: sample, budget_pages: budget };
            let p = plan(&modes, &cfg, period, cursor);
            let total: usize = p.runs.iter().map(|r| r.1).sum();
            prop_assert_eq!(total, p.pages);
            // Over budget only when a single region's chunk alone exceeds it.
            prop_assert!(p.pages <= budget.max(512));
            let mut last_end = 0;
            for &(s, c) in &p.runs {
                prop_assert!(c > 0);
                prop_assert!(s >= last_end, "runs overlap or are unsorted");
                last_end = s + c;
                prop_assert!(s + c <= modes.len() * 512);
                for page in s..s + c {
                    prop_assert!(!matches!(modes[page / 512], RegionMode::Skip | RegionMode::Hold));
                }
            }
        }

        #[test]
        fn sample_regions_are_fully_covered_after_a_rotation(n in 1usize..20, sample in 1usize..513) {
            let modes = vec![RegionMode::Sample; n];
            let cfg = PlanConfig { pages_per_region: 512, sample_pages: sample, budget_pages: usize::MAX };
            let mut seen = vec![false; n * 512];
            for period in 0..512u64.div_ceil(sample as u64) {
                for (s, c) in plan(&modes, &cfg, period, 0).runs {
                    for x in &mut seen[s..s + c] { *x = true; }
                }
            }
            prop_assert!(seen.iter().all(|&x| x));
        }

        #[test]
        fn round_robin_reaches_every_region(n in 1usize..30, budget in 1usize..2000) {
            let modes = vec![RegionMode::Sample; n];
            let cfg = PlanConfig { pages_per_region: 512, sample_pages: 64, budget_pages: budget };
            let mut touched = vec![false; n];
            let mut cursor = 0;
            for period in 0..n as u64 {
                let p = plan(&modes, &cfg, period, cursor);
                // A run may span two regions (neighbouring chunks coalesce).
                for (s, c) in p.runs { for page in s..s + c { touched[page / 512] = true; } }
                cursor = p.next_cursor;
            }
            prop_assert!(touched.iter().all(|&t| t));
        }
    }
}
