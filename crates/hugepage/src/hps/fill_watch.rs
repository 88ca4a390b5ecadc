//! First-touch hugepages ahead of a dense fill, the mechanism ([`crate::fill`] is the rule):
//! arenas on a huge-capable tmpfs, their residency probed through each arena's alias, advice
//! applied to the program's view, and the tracker kept off the regions advised.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use pagewise_kernel::mem::{self, Advice, HUGE_PMD};
use pagewise_kernel::tmpfs::HugeTmpfs;
use pagewise_track::{RegionMode, TrackedArena};

use crate::fill::{self, FillFronts, Residency};

use super::Shared;

/// Empty regions probed per check over all arenas, the arenas taking turns to go first: bounds
/// a check's cost however much memory is routed (a probe is two one-page mincore calls, about
/// 2 µs).
const PROBE_BUDGET: usize = 64;
/// The first check interval after a change, doubling while nothing changes up to 32 ms.
const CHECK_MS: u64 = 2;
const MAX_BACKOFF: u32 = 4;

pub(super) struct FillWatch {
    fs: HugeTmpfs,
    /// Per arena (its address): the rule's state, and which regions this watch took from the
    /// tracker (only those it gives back).
    fronts: Mutex<Vec<(usize, FillFronts, Vec<bool>)>>,
    /// Checks in a row that changed nothing.
    idle: AtomicU32,
    /// Regions advised so far.
    pub(super) advised: AtomicU64,
}

impl FillWatch {
    /// None where no tmpfs can be mounted (no CAP_SYS_ADMIN): arenas stay memfds.
    pub(super) fn new() -> Option<FillWatch> {
        Some(FillWatch {
            fs: HugeTmpfs::new().ok()?,
            fronts: Mutex::new(Vec::new()),
            idle: AtomicU32::new(0),
            advised: AtomicU64::new(0),
        })
    }

    pub(super) fn new_arena(&self, name: &str, len: usize) -> pagewise_track::Result<TrackedArena> {
        let arena = TrackedArena::on(Some(&self.fs), name, len)?;
        let regions = arena.len() / HUGE_PMD;
        self.fronts.lock().expect("fronts lock").push((arena.addr(), FillFronts::new(regions), vec![false; regions]));
        self.idle.store(0, Ordering::Relaxed);
        Ok(arena)
    }

    pub(super) fn forget_arena(&self, addr: usize) {
        self.fronts.lock().expect("fronts lock").retain(|(a, ..)| *a != addr);
    }

    /// How long until the next check, or None when no check can change anything.
    pub(super) fn next_check(&self) -> Option<Duration> {
        let fronts = self.fronts.lock().expect("fronts lock");
        fronts
            .iter()
            .any(|(_, f, _)| f.active())
            .then(|| Duration::from_millis(CHECK_MS << self.idle.load(Ordering::Relaxed).min(MAX_BACKOFF)))
    }

    /// One check of every arena; advice applied.
    pub(super) fn check(&self, s: &Shared) {
        let arenas = s.arenas.lock().expect("arenas lock");
        let mut fronts = self.fronts.lock().expect("fronts lock");
        let mut changed = false;
        let mut out = Vec::new();
        let mut budget = PROBE_BUDGET;
        // Round robin: the arena that went first goes last next time.
        if !fronts.is_empty() {
            fronts.rotate_left(1);
        }
        for (addr, f, taken) in fronts.iter_mut().filter(|(_, f, _)| f.active()) {
            let (Some(arena), Some(range)) = (arenas.iter().find(|a| a.addr() == *addr), s.tracker.range_of(*addr))
            else {
                continue;
            };
            out.clear();
            changed |= f.check(&mut Probe(arena), &mut budget, &mut out);
            for advice in &out {
                let (first, count, huge) = match *advice {
                    fill::Advice::Huge { first, count } => (first, count, true),
                    fill::Advice::Small { region } => (region, 1, false),
                };
                for (region, took) in taken.iter_mut().enumerate().take(first + count).skip(first) {
                    // Not while the program unmaps part of it; never a region no longer whole.
                    let _ops = range.hold();
                    if !range.region_whole(region) {
                        continue;
                    }
                    let at = arena.addr() + region * HUGE_PMD;
                    let advice = if huge { Advice::HugePage } else { Advice::NoHugePage };
                    if mem::madvise(at, HUGE_PMD, advice).is_err() {
                        continue;
                    }
                    // An advised region is not observed: dropping a page of a hugepage's
                    // mapping would split it. Un-advised, it is tracked as any other.
                    match (huge, range.mode(region)) {
                        (true, RegionMode::Sample | RegionMode::Full) => {
                            range.set_mode(region, RegionMode::Skip);
                            *took = true;
                        }
                        (false, RegionMode::Skip) if *took => {
                            range.set_mode(region, RegionMode::Sample);
                            *took = false;
                        }
                        _ => {}
                    }
                    if huge {
                        self.advised.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        if changed {
            self.idle.store(0, Ordering::Relaxed);
        } else {
            self.idle.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// An arena's residency, through its alias.
struct Probe<'a>(&'a TrackedArena);

impl Residency for Probe<'_> {
    fn page(&mut self, region: usize, page: u32) -> bool {
        self.0.page_resident(region, page as usize)
    }

    fn count(&mut self, region: usize) -> u32 {
        self.0.region_resident_pages(region)
    }
}
