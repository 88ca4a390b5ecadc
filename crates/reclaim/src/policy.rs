//! Pure policy: per-core thresholds with the paper's semantics, the kernel's watermark rule,
//! the reclaim worker's hysteresis and the split-reclaim triggers. No I/O, no clock.
//!
//! ## Per-core thresholds (seed 002)
//! Each core has `min_free_kbytes` (its pages_min in KiB), `pages_low_ratio` and
//! `pages_high_ratio` (pages_low and pages_high in % of pages_min; the kernel's historical
//! defaults 125 and 150, i.e. low = min + min/4, high = min + min/2). Writing the global value
//! sets every core to it with the default ratios; writing one core makes the global
//! min_free_kbytes the sum of every core's min.
//!
//! ## Rounding
//! Follows mm/page_alloc.c `__setup_per_zone_wmarks()`: pages_min = min_free_kbytes >>
//! (PAGE_SHIFT - 10), distributed over the low-memory zones in proportion to their managed
//! pages with integer (floor) division; ZONE_MOVABLE and highmem get managed/1024 clamped to
//! [SWAP_CLUSTER_MAX, 128]. The per-core low/high are floor(min * ratio / 100) of that zone min.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// pages_low_ratio the kernel's old rule implies (low = min * 5/4).
pub const DEFAULT_LOW_RATIO: u32 = 125;
/// pages_high_ratio the kernel's old rule implies (high = min * 3/2).
pub const DEFAULT_HIGH_RATIO: u32 = 150;
/// mm/vmscan.c SWAP_CLUSTER_MAX.
pub const SWAP_CLUSTER_MAX: u64 = 32;
/// The largest min_free_kbytes, for one core and for the sum of all cores: the kernel's
/// sysctl is an `int` (mm/page_alloc.c, proc_dointvec_minmax), so no larger value can apply.
pub const MAX_MIN_FREE_KBYTES: u64 = i32::MAX as u64;
/// The largest pages_low/high ratio: watermarks 1000× pages_min. Bounding it keeps every
/// product below in u64 (2^29 pages × 10^5 < 2^46).
pub const MAX_RATIO: u32 = 100_000;

/// A threshold the policy refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// A ratio below 100 would put pages_low or pages_high under pages_min.
    #[error("{key} = {value} is below 100 (it is a percentage of pages_min and must be at least 100)")]
    RatioBelow100 { key: &'static str, value: u32 },
    /// pages_high below pages_low leaves the worker no hysteresis.
    #[error("pages_high_ratio = {high} is below pages_low_ratio = {low}")]
    HighBelowLow { low: u32, high: u32 },
    /// The core is not in the table (not online / not configured).
    #[error("cpu{cpu} is not a known core (known: {known})")]
    UnknownCore { cpu: usize, known: String },
    /// A value above what the kernel or the arithmetic can hold.
    #[error("{key} = {value} is above the maximum {max}")]
    TooLarge { key: &'static str, value: u64, max: u64 },
    /// Unparsable per-core file text.
    #[error("bad per-core threshold text: {0}")]
    BadText(String),
}

/// One core's thresholds, as the paper's `/proc/sys/vm/percpu_free_mem/cpuN` holds them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoreThresholds {
    pub min_free_kbytes: u64,
    pub pages_low_ratio: u32,
    pub pages_high_ratio: u32,
}

/// Watermarks in pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Watermarks {
    pub min: u64,
    pub low: u64,
    pub high: u64,
}

impl CoreThresholds {
    /// `min_free_kbytes` with the default ratios 125/150.
    pub fn with_defaults(min_free_kbytes: u64) -> Self {
        CoreThresholds { min_free_kbytes, pages_low_ratio: DEFAULT_LOW_RATIO, pages_high_ratio: DEFAULT_HIGH_RATIO }
    }

    /// Ratios at least 100 and at most [`MAX_RATIO`], high ≥ low, min_free_kbytes at most
    /// [`MAX_MIN_FREE_KBYTES`].
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.min_free_kbytes > MAX_MIN_FREE_KBYTES {
            return Err(PolicyError::TooLarge {
                key: "min_free_kbytes",
                value: self.min_free_kbytes,
                max: MAX_MIN_FREE_KBYTES,
            });
        }
        for (key, value) in [("pages_low_ratio", self.pages_low_ratio), ("pages_high_ratio", self.pages_high_ratio)] {
            if value > MAX_RATIO {
                return Err(PolicyError::TooLarge { key, value: value.into(), max: MAX_RATIO.into() });
            }
        }
        if self.pages_low_ratio < 100 {
            return Err(PolicyError::RatioBelow100 { key: "pages_low_ratio", value: self.pages_low_ratio });
        }
        if self.pages_high_ratio < 100 {
            return Err(PolicyError::RatioBelow100 { key: "pages_high_ratio", value: self.pages_high_ratio });
        }
        if self.pages_high_ratio < self.pages_low_ratio {
            return Err(PolicyError::HighBelowLow { low: self.pages_low_ratio, high: self.pages_high_ratio });
        }
        Ok(())
    }

    /// pages_min of this core: min_free_kbytes >> (PAGE_SHIFT - 10).
    pub fn pages_min(&self, page_shift: u32) -> u64 {
        self.min_free_kbytes >> (page_shift - 10)
    }

    /// Watermarks for a zone minimum already in pages. Computed in u128 and saturated, so
    /// even thresholds that [`CoreThresholds::validate`] refuses cannot overflow.
    pub fn scaled(&self, zone_min: u64) -> Watermarks {
        let times = |ratio: u32| (u128::from(zone_min) * u128::from(ratio) / 100).min(u128::from(u64::MAX)) as u64;
        Watermarks { min: zone_min, low: times(self.pages_low_ratio), high: times(self.pages_high_ratio) }
    }

    /// Watermarks over one pool of pages (a memory cgroup's headroom): no zone split.
    pub fn watermarks(&self, page_shift: u32) -> Watermarks {
        self.scaled(self.pages_min(page_shift))
    }

    /// Watermarks of this core in one low-memory zone, distributed as the kernel does.
    pub fn zone_watermarks(&self, page_shift: u32, zone_managed: u64, lowmem_managed: u64) -> Watermarks {
        if lowmem_managed == 0 {
            return Watermarks::default();
        }
        let min =
            (u128::from(self.pages_min(page_shift)) * u128::from(zone_managed) / u128::from(lowmem_managed)) as u64;
        self.scaled(min)
    }

    /// The text of a per-core file: three `key value` lines.
    pub fn to_text(&self) -> String {
        format!(
            "min_free_kbytes {}\npages_low_ratio {}\npages_high_ratio {}\n",
            self.min_free_kbytes, self.pages_low_ratio, self.pages_high_ratio
        )
    }

    /// Parse a per-core file. Keys may come in any order; a missing ratio keeps `base`'s;
    /// a lone number sets min_free_kbytes with default ratios (like writing the global file).
    pub fn parse_text(text: &str, base: CoreThresholds) -> Result<Self, PolicyError> {
        let t = text.trim();
        if let Ok(kb) = t.parse::<u64>() {
            return Ok(Self::with_defaults(kb));
        }
        let mut out = base;
        let mut seen = false;
        for line in t.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let (k, v) = line
                .split_once(|c: char| c.is_whitespace() || c == '=')
                .ok_or_else(|| PolicyError::BadText(format!("line {line:?} is not `key value`")))?;
            let v = v.trim().trim_start_matches('=').trim();
            let num =
                |v: &str| v.parse::<u64>().map_err(|_| PolicyError::BadText(format!("{k}: {v:?} is not a number")));
            match k.trim() {
                "min_free_kbytes" => out.min_free_kbytes = num(v)?,
                "pages_low_ratio" => out.pages_low_ratio = num(v)?.min(u64::from(u32::MAX)) as u32,
                "pages_high_ratio" => out.pages_high_ratio = num(v)?.min(u64::from(u32::MAX)) as u32,
                other => return Err(PolicyError::BadText(format!("unknown key {other:?}"))),
            }
            seen = true;
        }
        if !seen {
            return Err(PolicyError::BadText("empty".into()));
        }
        out.validate()?;
        Ok(out)
    }
}

/// The per-core table and the global min_free_kbytes it implies.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PerCoreTable {
    cores: BTreeMap<usize, CoreThresholds>,
    global_min_free_kbytes: u64,
}

impl PerCoreTable {
    /// Every core of `cpus` at `global` with the default ratios (the state after writing the
    /// global min_free_kbytes).
    pub fn uniform(cpus: &BTreeSet<usize>, global: u64) -> Self {
        PerCoreTable {
            cores: cpus.iter().map(|&c| (c, CoreThresholds::with_defaults(global))).collect(),
            global_min_free_kbytes: global,
        }
    }

    /// Writing the global min_free_kbytes: every core gets it, with ratios 125/150.
    pub fn set_global(&mut self, kb: u64) -> Result<(), PolicyError> {
        CoreThresholds::with_defaults(kb).validate()?;
        for t in self.cores.values_mut() {
            *t = CoreThresholds::with_defaults(kb);
        }
        self.global_min_free_kbytes = kb;
        Ok(())
    }

    /// Writing one core: the global becomes the sum of all cores' mins, which is returned.
    /// Refused (and nothing changed) when the sum would pass [`MAX_MIN_FREE_KBYTES`].
    pub fn set_core(&mut self, cpu: usize, t: CoreThresholds) -> Result<u64, PolicyError> {
        if !self.cores.contains_key(&cpu) {
            return Err(PolicyError::UnknownCore { cpu, known: self.cpus_text() });
        }
        self.set_cores(&BTreeSet::from([cpu]), t)
    }

    /// Set several cores at once (a cpulist); the global is the sum afterwards. Refused (and
    /// nothing changed) when the sum would pass [`MAX_MIN_FREE_KBYTES`].
    pub fn set_cores(&mut self, cpus: &BTreeSet<usize>, t: CoreThresholds) -> Result<u64, PolicyError> {
        t.validate()?;
        if let Some(&cpu) = cpus.iter().find(|c| !self.cores.contains_key(c)) {
            return Err(PolicyError::UnknownCore { cpu, known: self.cpus_text() });
        }
        let mut next = self.cores.clone();
        for c in cpus {
            next.insert(*c, t);
        }
        let sum = next.values().try_fold(0u64, |acc, c| acc.checked_add(c.min_free_kbytes)).unwrap_or(u64::MAX);
        if sum > MAX_MIN_FREE_KBYTES {
            return Err(PolicyError::TooLarge {
                key: "sum of the cores' min_free_kbytes",
                value: sum,
                max: MAX_MIN_FREE_KBYTES,
            });
        }
        self.cores = next;
        self.global_min_free_kbytes = sum;
        Ok(sum)
    }

    pub fn get(&self, cpu: usize) -> Option<CoreThresholds> {
        self.cores.get(&cpu).copied()
    }

    pub fn cores(&self) -> &BTreeMap<usize, CoreThresholds> {
        &self.cores
    }

    pub fn global_min_free_kbytes(&self) -> u64 {
        self.global_min_free_kbytes
    }

    /// The sum of the cores' mins (at most [`MAX_MIN_FREE_KBYTES`] by construction).
    pub fn sum_of_mins(&self) -> u64 {
        self.cores.values().map(|t| t.min_free_kbytes).fold(0, u64::saturating_add)
    }

    fn cpus_text(&self) -> String {
        pagewise_kernel::cpu::format_cpulist(&self.cores.keys().copied().collect())
    }
}

/// One zone as the watermark rule sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZoneShape {
    pub managed: u64,
    /// ZONE_MOVABLE or highmem: not counted in lowmem_pages, gets the small fixed minimum.
    pub movable_or_high: bool,
}

/// The kernel's own watermarks for `min_free_kbytes` (mm/page_alloc.c __setup_per_zone_wmarks,
/// Linux 6.x, without boost): min, low = min + max(min/4, managed * wsf / 10000), high = low +
/// the same step.
pub fn kernel_watermarks(min_free_kbytes: u64, page_shift: u32, wsf: u64, zones: &[ZoneShape]) -> Vec<Watermarks> {
    let pages_min = min_free_kbytes >> (page_shift - 10);
    let lowmem: u64 = zones.iter().filter(|z| !z.movable_or_high).map(|z| z.managed).sum();
    zones
        .iter()
        .map(|z| {
            let tmp = if lowmem == 0 {
                0
            } else {
                (u128::from(pages_min) * u128::from(z.managed) / u128::from(lowmem)) as u64
            };
            let min = if z.movable_or_high { (z.managed / 1024).clamp(SWAP_CLUSTER_MAX, 128) } else { tmp };
            let step = (tmp >> 2).max((u128::from(z.managed) * u128::from(wsf) / 10000) as u64);
            Watermarks { min, low: min + step, high: min + 2 * step }
        })
        .collect()
}

/// The reclaim worker's hysteresis: start below `low`, reclaim until above `high`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hysteresis {
    pub active: bool,
}

impl Hysteresis {
    /// Given the free pages now, how many pages to reclaim in this step (at most `batch`).
    /// Zero when idle.
    pub fn step(&mut self, free: u64, wm: Watermarks, batch: u64) -> u64 {
        if free < wm.low {
            self.active = true;
        }
        if self.active && free >= wm.high {
            self.active = false;
        }
        if self.active {
            (wm.high - free).min(batch.max(1))
        } else {
            0
        }
    }
}

/// The rate at which a group uses up its headroom, from a cumulative counter (the reclaim
/// worker feeds its usage plus the pages it reclaimed: the charges net of what the group
/// freed itself; v1 `total_pgpgin` counts charge events, a large folio as one, and no
/// frees), smoothed so that it rises at once and decays over [`ChargeRate::DECAY_S`]: a
/// burst must be met at once, a lull should not shrink the headroom between two bursts.
///
/// A sample is taken over at least [`ChargeRate::WINDOW_S`]: the worker wakes every few ms,
/// and a rate from 2 ms (one readahead batch of a few workers) held at its peak read
/// 1–2 GiB/s on a load that charged 0.5 GiB/s, which sized half the group's limit as
/// headroom and cost the file-server load 65% more cache misses (issue 23). Pages seen in a
/// window still open count as if spread over the whole window, so a real burst raises the
/// rate before the window closes, and a short one does not read as a flood.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ChargeRate {
    /// The counter at the start of the open window, and how long the window has been open.
    window_start: Option<u64>,
    window_s: f64,
    /// The rate of the windows closed so far, smoothed.
    settled: f64,
    pages_per_s: f64,
}

impl ChargeRate {
    /// Time constant of the decay, in seconds.
    pub const DECAY_S: f64 = 1.0;
    /// The shortest span a rate is measured over, in seconds.
    pub const WINDOW_S: f64 = 0.05;

    /// Feed the counter's value `count` observed `dt_s` seconds after the previous one;
    /// returns the smoothed rate in pages per second.
    pub fn observe(&mut self, count: u64, dt_s: f64) -> f64 {
        let Some(start) = self.window_start else {
            self.window_start = Some(count);
            return self.pages_per_s;
        };
        if !(dt_s > 0.0 && dt_s.is_finite()) {
            return self.pages_per_s;
        }
        self.window_s += dt_s;
        let sample = count.saturating_sub(start) as f64 / self.window_s.max(Self::WINDOW_S);
        if self.window_s >= Self::WINDOW_S {
            let keep = (-self.window_s / Self::DECAY_S).exp();
            self.settled = sample.max(self.settled * keep + sample * (1.0 - keep));
            self.window_start = Some(count);
            self.window_s = 0.0;
            self.pages_per_s = self.settled;
        } else {
            // An open window can only raise the rate (a burst met at once).
            self.pages_per_s = self.settled.max(sample);
        }
        self.pages_per_s
    }

    pub fn pages_per_s(&self) -> f64 {
        self.pages_per_s
    }
}

/// The worker's watermarks raised for the charge rate it has to outrun (the kernel's
/// watermark_scale_factor and watermark boost do the same for kswapd): from the moment free
/// memory crosses `low` until the worker's pass ends, `rate × reaction_s` more pages are
/// charged, so `low` must cover that twice over (a safety factor of 2 for a rate that rises
/// within one reaction time), and the hysteresis gap must cover it once so that one pass
/// buys at least one reaction time. `high` is capped at `cap` pages (the share of the limit
/// the workload may lose to headroom), and the gap is kept when the cap bites: a capped
/// `low` equal to `high` made every pass a sliver, and the worker fell behind its load
/// (issue 23). The configured watermarks are the floor.
pub fn rate_sized_watermarks(base: Watermarks, rate_pages_per_s: f64, reaction_s: f64, cap: u64) -> Watermarks {
    let during = |factor: f64| {
        let pages = rate_pages_per_s.max(0.0) * reaction_s.max(0.0) * factor;
        if pages.is_finite() {
            pages.ceil().min(cap as f64) as u64
        } else {
            cap
        }
    };
    let base_gap = base.high - base.low;
    let gap = base_gap.max(during(1.0).min(cap / 2));
    let wanted_low = base.low.max(during(2.0));
    let high = wanted_low.saturating_add(gap).min(cap.max(base.high)).max(base.high);
    let low = base.low.max(wanted_low.min(high.saturating_sub(gap)));
    Watermarks { min: base.min.min(low), low, high }
}

/// What a group's memory is made of, in pages, as far as reclaim is concerned.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GroupMemory {
    /// Charged in all.
    pub usage: u64,
    /// Page cache on the file LRUs and reclaimable slab: what reclaim can free.
    pub reclaimable: u64,
    /// Anonymous, shmem and unevictable memory: with no swap, reclaim cannot free any of it,
    /// and a limit below it means an OOM kill.
    pub unreclaimable: u64,
}

/// The largest reclaim step, at most `want` pages, that cannot hurt the group: no more than
/// what is reclaimable, and never so much that the lowered limit (usage − step) falls below
/// the unreclaimable memory plus `margin` pages. A step smaller than `min_step` pages is not
/// worth lowering a limit for (it would scrape the last pages of cache a workload has).
/// Zero means: do not lower the limit at all.
pub fn safe_reclaim_pages(want: u64, m: GroupMemory, margin: u64, min_step: u64) -> u64 {
    let floor = m.unreclaimable.saturating_add(margin);
    let step = want.min(m.reclaimable).min(m.usage.saturating_sub(floor));
    if step < min_step.min(want) {
        0
    } else {
        step
    }
}

impl GroupMemory {
    /// This memory carried forward from its last reading to a newer usage, without reading
    /// the composition again: whatever usage grew by may all be unreclaimable, and the
    /// reclaimable memory never grows. The estimate's unreclaimable memory is never below the
    /// truth while the group only charges; what it cannot see is memory charged in place of
    /// cache freed meanwhile (by the caller's reclaim), so a caller whose step frees less
    /// than it asked reads the composition again before the next.
    pub fn carried_to(self, usage: u64) -> GroupMemory {
        let grown = usage.saturating_sub(self.usage);
        let unreclaimable = self.unreclaimable.saturating_add(grown).min(usage);
        GroupMemory { usage, reclaimable: self.reclaimable.min(usage - unreclaimable), unreclaimable }
    }

    /// Whether a step of `want` pages comes near enough to the unreclaimable floor (within a
    /// quarter of the usage) that the composition must be read afresh before it, however
    /// recent the last reading.
    pub fn near_floor(&self, want: u64) -> bool {
        want > 0 && self.usage.saturating_sub(self.unreclaimable).saturating_sub(want) < self.usage / 4
    }
}

/// Split-reclaim thresholds (seed 004), all in pages of the scope being watched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitThresholds {
    /// Free pages at or below which page-cache-only reclaim starts (the old direct-reclaim start).
    pub pstart: u64,
    /// Free pages the page reclaim stops at.
    pub pstop: u64,
    /// Reclaimable slab pages at or above which slab reclaim starts.
    pub sstart: u64,
    /// Slab pages the slab reclaim aims for before it stops (hysteresis under sstart).
    pub sstop: u64,
}

/// What to reclaim now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize)]
pub struct SplitDecision {
    /// Page-cache pages to reclaim (0: none).
    pub page_cache: u64,
    /// Slab pages to reclaim in this batch (0: none).
    pub slab: u64,
}

/// Default Sstart: 50% of the pages of the scope.
pub fn default_sstart(total_pages: u64) -> u64 {
    total_pages / 2
}

/// The split-reclaim trigger as a pure function of the observed state: page reclaim when
/// free ≤ Pstart (up to Pstop), slab reclaim when reclaimable slab ≥ Sstart (down to Sstop),
/// each bounded by its batch.
pub fn split_decide(t: SplitThresholds, free: u64, slab: u64, page_batch: u64, slab_batch: u64) -> SplitDecision {
    let page_cache = if free <= t.pstart { t.pstop.max(t.pstart + 1).saturating_sub(free).min(page_batch) } else { 0 };
    let slab = if slab >= t.sstart { slab.saturating_sub(t.sstop.min(t.sstart)).max(1).min(slab_batch) } else { 0 };
    SplitDecision { page_cache, slab }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cpus(n: usize) -> BTreeSet<usize> {
        (0..n).collect()
    }

    #[test]
    fn paper_table_round_trips() {
        // Seed 002, evaluation settings. Without: 3831/3831, 125/125, 150/150.
        let mut t = PerCoreTable::uniform(&cpus(2), 3831);
        for c in 0..2 {
            assert_eq!(
                t.get(c).unwrap(),
                CoreThresholds { min_free_kbytes: 3831, pages_low_ratio: 125, pages_high_ratio: 150 }
            );
        }
        assert_eq!(t.global_min_free_kbytes(), 3831);
        // With: core0 12288/240/400, core1 256/3300/4000.
        let c0 = CoreThresholds { min_free_kbytes: 12288, pages_low_ratio: 240, pages_high_ratio: 400 };
        let c1 = CoreThresholds { min_free_kbytes: 256, pages_low_ratio: 3300, pages_high_ratio: 4000 };
        t.set_core(0, c0).unwrap();
        assert_eq!(t.set_core(1, c1).unwrap(), 12288 + 256);
        for (cpu, c) in [(0, c0), (1, c1)] {
            let text = t.get(cpu).unwrap().to_text();
            assert_eq!(CoreThresholds::parse_text(&text, CoreThresholds::with_defaults(0)).unwrap(), c);
        }
        // In pages (4 KiB): core0 min 3072, low 7372, high 12288; core1 min 64, low 2112, high 2560.
        assert_eq!(c0.watermarks(12), Watermarks { min: 3072, low: 7372, high: 12288 });
        assert_eq!(c1.watermarks(12), Watermarks { min: 64, low: 2112, high: 2560 });
        // Writing the global again resets every core to it with default ratios.
        t.set_global(3831).unwrap();
        assert_eq!(t.get(1).unwrap(), CoreThresholds::with_defaults(3831));
        // 3831 KiB is 957 pages (floor), low 1196, high 1435.
        assert_eq!(t.get(0).unwrap().watermarks(12), Watermarks { min: 957, low: 1196, high: 1435 });
    }

    #[test]
    fn kernel_rule_matches_this_vm() {
        // /proc/zoneinfo of the 6.18 Firecracker VM at min_free_kbytes 67584, wsf 10:
        // DMA managed 3840 min 45 low 56 high 67; DMA32 772917: 9118/11397/13676;
        // Normal 655360: 7731/9663/11595; Movable 0: min 32.
        let zones = [
            ZoneShape { managed: 3840, movable_or_high: false },
            ZoneShape { managed: 772917, movable_or_high: false },
            ZoneShape { managed: 655360, movable_or_high: false },
            ZoneShape { managed: 0, movable_or_high: true },
        ];
        let w = kernel_watermarks(67584, 12, 10, &zones);
        assert_eq!(w[0], Watermarks { min: 45, low: 56, high: 67 });
        assert_eq!(w[1], Watermarks { min: 9118, low: 11397, high: 13676 });
        assert_eq!(w[2], Watermarks { min: 7731, low: 9663, high: 11595 });
        assert_eq!(w[3].min, 32);
        // The per-core distribution uses the same floor rule for min.
        let c = CoreThresholds::with_defaults(67584);
        assert_eq!(c.zone_watermarks(12, 655360, 3840 + 772917 + 655360).min, 7731);
    }

    #[test]
    fn bad_thresholds_are_refused() {
        let mut t = PerCoreTable::uniform(&cpus(2), 1000);
        let e = t.set_core(5, CoreThresholds::with_defaults(1)).unwrap_err();
        assert!(e.to_string().contains("cpu5"), "{e}");
        let e = t.set_core(0, CoreThresholds { min_free_kbytes: 1, pages_low_ratio: 99, pages_high_ratio: 150 });
        assert!(e.unwrap_err().to_string().contains("pages_low_ratio"));
        let e = t.set_core(0, CoreThresholds { min_free_kbytes: 1, pages_low_ratio: 200, pages_high_ratio: 150 });
        assert!(matches!(e, Err(PolicyError::HighBelowLow { .. })));
        assert!(CoreThresholds::parse_text("bogus 3", CoreThresholds::with_defaults(0)).is_err());
        assert!(CoreThresholds::parse_text("", CoreThresholds::with_defaults(0)).is_err());
        assert_eq!(
            CoreThresholds::parse_text("512\n", CoreThresholds::with_defaults(0)).unwrap(),
            CoreThresholds::with_defaults(512)
        );
        let partial =
            CoreThresholds::parse_text("pages_low_ratio=300\npages_high_ratio 400", CoreThresholds::with_defaults(64));
        assert_eq!(
            partial.unwrap(),
            CoreThresholds { min_free_kbytes: 64, pages_low_ratio: 300, pages_high_ratio: 400 }
        );
    }

    #[test]
    fn hysteresis_runs_from_low_to_high() {
        let wm = Watermarks { min: 10, low: 20, high: 40 };
        let mut h = Hysteresis::default();
        assert_eq!(h.step(25, wm, 100), 0);
        assert_eq!(h.step(19, wm, 100), 21);
        assert_eq!(h.step(30, wm, 4), 4, "still active between low and high, bounded by the batch");
        assert_eq!(h.step(40, wm, 100), 0);
        assert_eq!(h.step(30, wm, 100), 0, "idle again until below low");
    }

    #[test]
    fn split_triggers() {
        let t = SplitThresholds { pstart: 100, pstop: 200, sstart: 1000, sstop: 800 };
        assert_eq!(split_decide(t, 150, 10, 64, 64), SplitDecision { page_cache: 0, slab: 0 });
        assert_eq!(split_decide(t, 100, 10, 64, 64), SplitDecision { page_cache: 64, slab: 0 });
        assert_eq!(split_decide(t, 180, 10, 64, 64).page_cache, 0);
        assert_eq!(split_decide(t, 150, 1000, 64, 64), SplitDecision { page_cache: 0, slab: 64 });
        assert_eq!(split_decide(t, 150, 1010, 64, 1000), SplitDecision { page_cache: 0, slab: 210 });
        assert_eq!(default_sstart(1 << 20), 1 << 19);
    }

    #[test]
    fn thresholds_above_the_kernel_int_are_refused() {
        let mut t = PerCoreTable::uniform(&cpus(2), 1000);
        assert!(matches!(t.set_global(MAX_MIN_FREE_KBYTES + 1), Err(PolicyError::TooLarge { .. })));
        t.set_core(0, CoreThresholds::with_defaults(MAX_MIN_FREE_KBYTES - 1000)).unwrap();
        let e = t.set_core(1, CoreThresholds::with_defaults(MAX_MIN_FREE_KBYTES)).unwrap_err();
        assert!(e.to_string().contains("sum"), "{e}");
        assert_eq!(t.get(1), Some(CoreThresholds::with_defaults(1000)), "a refused write changes nothing");
        let e = CoreThresholds { min_free_kbytes: 1, pages_low_ratio: 200, pages_high_ratio: MAX_RATIO + 1 }.validate();
        assert!(matches!(e, Err(PolicyError::TooLarge { key: "pages_high_ratio", .. })));
    }

    #[test]
    fn charge_rate_rises_at_once_and_decays_slowly() {
        let mut r = ChargeRate::default();
        assert_eq!(r.observe(1000, 0.05), 0.0, "no rate from one sample");
        assert_eq!(r.observe(6000, 0.05), 100_000.0);
        let after_lull = r.observe(6000, 0.05);
        assert!(after_lull > 95_000.0 && after_lull < 100_000.0, "{after_lull}");
        assert_eq!(r.observe(46_000, 0.05), 800_000.0, "a burst is met at once");
    }

    #[test]
    fn a_short_burst_is_not_read_as_a_flood() {
        // 400 pages per 2 ms wake-up, then nothing for the rest of each 50 ms: 8,000 pages/s
        // on average, though one 2 ms sample alone says 200,000.
        let mut r = ChargeRate::default();
        let mut count = 0;
        r.observe(count, 0.0);
        let mut highest: f64 = 0.0;
        for _ in 0..20 {
            count += 400;
            highest = highest.max(r.observe(count, 0.002));
            for _ in 0..24 {
                highest = highest.max(r.observe(count, 0.002));
            }
        }
        assert!(highest <= 8_000.0 * 1.01, "peak {highest} pages/s for a load of 8000");
        assert!(r.pages_per_s() >= 8_000.0 * 0.9, "{}", r.pages_per_s());
        // A sustained flood (500,000 pages/s) shows before its first window closes: after
        // 20 ms as 20/50 of its rate, after 50 ms whole.
        let mut flood = ChargeRate::default();
        flood.observe(0, 0.0);
        let seen: Vec<f64> = (1..=25u64).map(|i| flood.observe(i * 1000, 0.002)).collect();
        assert!((seen[9] - 200_000.0).abs() < 1.0, "{}", seen[9]);
        assert!((seen[24] - 500_000.0).abs() < 1.0, "{}", seen[24]);
    }

    #[test]
    fn headroom_follows_rate_and_reaction() {
        let base = Watermarks { min: 4096, low: 8192, high: 12288 };
        // Idle: the configured watermarks.
        assert_eq!(rate_sized_watermarks(base, 0.0, 0.005, 40_000), base);
        // 1 GiB/s (262144 pages/s) and 10 ms to react: 2622 pages charged meanwhile; below low.
        assert_eq!(rate_sized_watermarks(base, 262_144.0, 0.01, 40_000), base);
        // 4 GiB/s and 10 ms: low 2 × 10486, gap 10486.
        let w = rate_sized_watermarks(base, 1_048_576.0, 0.01, 40_000);
        assert_eq!((w.low, w.high), (20_972, 31_458));
        // Capped by the share of the limit, keeping a gap: half the cap.
        let w = rate_sized_watermarks(base, 1e9, 1.0, 40_000);
        assert_eq!((w.low, w.high), (20_000, 40_000));
        // A cap below the configured watermarks leaves them as configured.
        assert_eq!(rate_sized_watermarks(base, 1e9, 1.0, 10_000), base);
    }

    #[test]
    fn a_step_never_cuts_into_anonymous_memory() {
        let m = GroupMemory { usage: 1000, reclaimable: 300, unreclaimable: 700 };
        assert_eq!(safe_reclaim_pages(500, m, 0, 1), 300);
        assert_eq!(safe_reclaim_pages(500, m, 50, 1), 250);
        assert_eq!(safe_reclaim_pages(500, m, 50, 256), 0, "a scrap of cache is not worth a lowered limit");
        assert_eq!(safe_reclaim_pages(100, m, 50, 256), 100, "a small want is met whole");
        let anon_only = GroupMemory { usage: 1000, reclaimable: 0, unreclaimable: 1000 };
        assert_eq!(safe_reclaim_pages(500, anon_only, 16, 1), 0);
    }

    #[test]
    fn a_carried_estimate_counts_new_charges_as_unreclaimable() {
        let read = GroupMemory { usage: 20_000, reclaimable: 18_000, unreclaimable: 1_000 };
        // 500 pages charged since: they may be anonymous.
        let e = read.carried_to(20_500);
        assert_eq!(e, GroupMemory { usage: 20_500, reclaimable: 18_000, unreclaimable: 1_500 });
        // Usage fell: nothing new counts, and what is reclaimable shrinks with it.
        let e = read.carried_to(15_000);
        assert_eq!(e, GroupMemory { usage: 15_000, reclaimable: 14_000, unreclaimable: 1_000 });
        assert!(!e.near_floor(4_000));
        assert!(e.near_floor(11_000), "3,000 of 14,000 reclaimable pages left is less than a quarter of the usage");
        assert!(!e.near_floor(0), "no step, no reading");
        // Grown past everything: all of it may be unreclaimable.
        assert_eq!(read.carried_to(60_000), GroupMemory { usage: 60_000, reclaimable: 18_000, unreclaimable: 41_000 });
    }

    proptest! {
        #[test]
        fn a_carried_estimate_never_lets_a_step_cut_into_new_anonymous_memory(
            cache in 0u64..1 << 20, anon in 0u64..1 << 20, other in 0u64..1 << 16,
            anon_more in 0u64..1 << 20, cache_more in 0u64..1 << 20, want in 0u64..1 << 21, margin in 0u64..1 << 12) {
            // Read: cache, anon and something neither (mapped file, kmem). Since: the group
            // charged `anon_more` anonymous pages and `cache_more` of cache.
            let read = GroupMemory { usage: cache + anon + other, reclaimable: cache, unreclaimable: anon };
            let usage = read.usage + anon_more + cache_more;
            let truth = anon + anon_more;
            let e = read.carried_to(usage);
            prop_assert!(e.unreclaimable >= truth, "{e:?} vs {truth}");
            prop_assert!(e.reclaimable + e.unreclaimable <= e.usage && e.reclaimable <= cache);
            let n = safe_reclaim_pages(want, e, margin, 1);
            prop_assert!(n == 0 || usage - n >= truth + margin);
        }

        #[test]
        fn any_thresholds_are_refused_or_ordered(kb in any::<u64>(), low in any::<u32>(), high in any::<u32>(),
                                                 managed in any::<u64>(), more in any::<u64>()) {
            let c = CoreThresholds { min_free_kbytes: kb, pages_low_ratio: low, pages_high_ratio: high };
            let ok = c.validate().is_ok();
            prop_assert_eq!(ok, kb <= MAX_MIN_FREE_KBYTES && (100..=MAX_RATIO).contains(&low)
                && (100..=MAX_RATIO).contains(&high) && low <= high);
            // Never a panic, whatever the input; ordered when valid.
            let w = c.zone_watermarks(12, managed, managed.saturating_add(more));
            let whole = c.watermarks(12);
            if ok {
                prop_assert!(w.min <= w.low && w.low <= w.high);
                prop_assert!(whole.min <= whole.low && whole.low <= whole.high);
                prop_assert!(whole.high <= (MAX_MIN_FREE_KBYTES >> 2) * u64::from(MAX_RATIO) / 100);
            }
            let mut t = PerCoreTable::uniform(&cpus(3), 1000);
            match t.set_cores(&BTreeSet::from([0, 1]), c) {
                Ok(sum) => prop_assert!(ok && sum <= MAX_MIN_FREE_KBYTES && sum == t.sum_of_mins()),
                Err(_) => prop_assert_eq!(t, PerCoreTable::uniform(&cpus(3), 1000)),
            }
        }

        #[test]
        fn rate_sized_watermarks_are_ordered_and_bounded(min in 0u64..1 << 20, dl in 0u64..1 << 20, dh in 0u64..1 << 20,
                                                         rate in 0.0f64..1e9, reaction in 0.0f64..10.0, cap in 0u64..1 << 24) {
            let base = Watermarks { min, low: min + dl, high: min + dl + dh };
            let w = rate_sized_watermarks(base, rate, reaction, cap);
            prop_assert!(w.min <= w.low && w.low <= w.high);
            prop_assert!(w.low >= base.low && w.high >= base.high, "never below the configured watermarks");
            prop_assert!(w.low <= cap.max(base.low) && w.high <= cap.max(base.high), "never above the cap");
            prop_assert!(w.high - w.low >= base.high - base.low, "the hysteresis gap never shrinks");
        }

        #[test]
        fn safe_steps_leave_the_unreclaimable_memory(want in any::<u64>(), usage in any::<u64>(), r in any::<u64>(),
                                                     margin in 0u64..1 << 20, min_step in 0u64..1 << 12) {
            let reclaimable = r % (usage.saturating_add(1));
            let m = GroupMemory { usage, reclaimable, unreclaimable: usage - reclaimable };
            let n = safe_reclaim_pages(want, m, margin, min_step);
            prop_assert!(n <= want && n <= reclaimable);
            prop_assert!(n == 0 || n >= min_step.min(want));
            prop_assert!(n == 0 || usage - n >= m.unreclaimable + margin);
        }

        #[test]
        fn setting_cores_makes_global_the_sum(mins in proptest::collection::vec(0u64..1 << 24, 1..64),
                                              low in 100u32..5000, extra in 0u32..5000) {
            let n = mins.len();
            let mut t = PerCoreTable::uniform(&cpus(n), 3831);
            for (c, &m) in mins.iter().enumerate() {
                t.set_core(c, CoreThresholds { min_free_kbytes: m, pages_low_ratio: low, pages_high_ratio: low + extra }).unwrap();
            }
            prop_assert_eq!(t.global_min_free_kbytes(), mins.iter().sum::<u64>());
            t.set_global(mins[0]).unwrap();
            prop_assert!(t.cores().values().all(|c| *c == CoreThresholds::with_defaults(mins[0])));
        }

        #[test]
        fn watermarks_are_ordered_and_text_round_trips(kb in 0u64..=MAX_MIN_FREE_KBYTES, low in 100u32..50_000, extra in 0u32..50_000,
                                                       managed in 1u64..1 << 24, more in 0u64..1 << 24) {
            let c = CoreThresholds { min_free_kbytes: kb, pages_low_ratio: low, pages_high_ratio: low + extra };
            let w = c.zone_watermarks(12, managed, managed + more);
            prop_assert!(w.min <= w.low && w.low <= w.high);
            prop_assert!(w.min <= c.pages_min(12));
            prop_assert_eq!(CoreThresholds::parse_text(&c.to_text(), CoreThresholds::with_defaults(1)).unwrap(), c);
        }

        #[test]
        fn zone_mins_sum_to_at_most_pages_min(kb in 0u64..1 << 32, zones in proptest::collection::vec(1u64..1 << 22, 1..5)) {
            let shapes: Vec<ZoneShape> = zones.iter().map(|&m| ZoneShape { managed: m, movable_or_high: false }).collect();
            let w = kernel_watermarks(kb, 12, 10, &shapes);
            let sum: u64 = w.iter().map(|w| w.min).sum();
            prop_assert!(sum <= kb >> 2 && sum + zones.len() as u64 > kb >> 2);
        }

        #[test]
        fn hysteresis_never_overshoots(free in 0u64..10_000, low in 0u64..5000, gap in 0u64..5000, batch in 1u64..1000) {
            let wm = Watermarks { min: 0, low, high: low + gap };
            let mut h = Hysteresis::default();
            let n = h.step(free, wm, batch);
            prop_assert!(n <= batch);
            prop_assert!(n == 0 || free + n <= wm.high);
            prop_assert_eq!(n > 0, free < low && free < low + gap);
        }
    }
}
