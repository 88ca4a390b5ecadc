//! First-touch hugepages ahead of a dense fill, the mechanism ([`crate::fill`] is the rule):
//! arenas on a huge-capable tmpfs, their residency probed through each arena's alias, advice
//! applied to the program's view, and the tracker kept off the regions advised.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use pagewise_kernel::mem::{self, Advice, HUGE_PMD};
use pagewise_kernel::procfs::{KpageFlags, Pagemap, Pid, KPF_THP, PAGEMAP_PFN_MASK, PAGEMAP_PRESENT};
use pagewise_kernel::signal;
use pagewise_kernel::tmpfs::HugeTmpfs;
use pagewise_track::{RegionMode, TrackedArena, TrackedRange};

use crate::fill::{self, FillFronts, Price, Residency};

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
    /// Regions of windows declined because hugepages were dear ([`fill::Price`]).
    pub(super) declined: AtomicU64,
    /// Whether windows wait for cheap hugepages ([`fill::FirstTouch::Priced`]).
    priced: bool,
    price: Mutex<Price>,
    /// Tells whether a measured region got its hugepage (root; without it, it is assumed).
    kpageflags: Option<(Pagemap, Mutex<KpageFlags>)>,
    /// Regions (their addresses) un-advised with MADV_NOHUGEPAGE, which MADV_COLLAPSE refuses
    /// (EINVAL): advised huge again just before the tracker collapses one.
    unadvised: Mutex<HashSet<usize>>,
}

impl FillWatch {
    /// None where no tmpfs can be mounted (no CAP_SYS_ADMIN): arenas stay memfds.
    pub(super) fn new(priced: bool) -> Option<FillWatch> {
        Some(FillWatch {
            fs: HugeTmpfs::new().ok()?,
            fronts: Mutex::new(Vec::new()),
            idle: AtomicU32::new(0),
            advised: AtomicU64::new(0),
            declined: AtomicU64::new(0),
            priced,
            price: Mutex::new(Price::default()),
            kpageflags: Pagemap::open(Pid::SelfProcess).ok().zip(KpageFlags::open().ok().map(Mutex::new)),
            unadvised: Mutex::new(HashSet::new()),
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
        let mut fronts = self.fronts.lock().expect("fronts lock");
        if let Some((_, _, taken)) = fronts.iter().find(|(a, ..)| *a == addr) {
            let end = addr + taken.len() * HUGE_PMD;
            self.unadvised.lock().expect("unadvised lock").retain(|r| !(addr..end).contains(r));
        }
        fronts.retain(|(a, ..)| *a != addr);
    }

    /// Before the tracker collapses the region at `addr`: advise it huge again if this watch
    /// un-advised it, since MADV_COLLAPSE refuses a range advised MADV_NOHUGEPAGE.
    pub(super) fn before_collapse(&self, addr: usize) {
        if self.unadvised.lock().expect("unadvised lock").remove(&addr) {
            let _ = mem::madvise(addr, HUGE_PMD, Advice::HugePage);
        }
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
            // The arena's own range, not the one holding `addr`: arenas' spans overlap.
            let Some(arena) = arenas.iter().find(|a| a.view_addr() == *addr) else { continue };
            let Some(range) = s.range_of_arena(arena.id()) else { continue };
            out.clear();
            changed |= f.check(&mut Probe(arena), &mut budget, &mut out);
            for advice in &out {
                let (first, count) = match *advice {
                    fill::Advice::Huge { first, count } => (first, count),
                    fill::Advice::Small { region } => {
                        if self.apply(arena, &range, taken, region, false) {
                            self.unadvised.lock().expect("unadvised lock").insert(arena.addr() + region * HUGE_PMD);
                        }
                        continue;
                    }
                    fill::Advice::Filled { region } => {
                        self.keep_if_huge(arena, &range, taken, region);
                        continue;
                    }
                };
                let now = s.epoch.elapsed().as_nanos() as u64;
                let given = if !self.priced {
                    count
                } else if self.price.lock().expect("price lock").dear(now) {
                    0
                } else {
                    self.measure_on(arena, &range, taken, first, now).map_or(0, |cheap| if cheap { count } else { 1 })
                };
                // The measured region, if any, was advised by the measurement.
                let start = if self.priced { first + given.min(1) } else { first };
                for region in start..first + given {
                    self.apply(arena, &range, taken, region, true);
                }
                if given < count {
                    f.decline(first + given, count - given);
                    self.declined.fetch_add((count - given) as u64, Ordering::Relaxed);
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

impl FillWatch {
    /// Advise region `region` and populate it here, timed: what a hugepage at first touch
    /// costs now, recorded in the price. Some(cheap) when the region got its hugepage; None
    /// when it could not be advised, or it did not get one (the program was writing it as it
    /// was populated, or no hugepage was to be had): then it is given back to the tracker,
    /// which collapses it if it turns out hot, and nothing is recorded.
    fn measure_on(
        &self,
        arena: &TrackedArena,
        range: &TrackedRange,
        taken: &mut [bool],
        region: usize,
        now_ns: u64,
    ) -> Option<bool> {
        if !self.apply(arena, range, taken, region, true) {
            return None;
        }
        let at = arena.addr() + region * HUGE_PMD;
        let cpu0 = signal::thread_cpu_time();
        let populated = mem::madvise(at, HUGE_PMD, Advice::PopulateWrite);
        let cost = (signal::thread_cpu_time() - cpu0).as_nanos() as u64;
        if populated.is_err() || !self.got_hugepage(range, region, at) {
            give_back(range, taken, region);
            return None;
        }
        let mut price = self.price.lock().expect("price lock");
        price.record(now_ns, cost);
        Some(!price.dear(now_ns))
    }

    /// Region `region`, advised, has been filled densely: keep it from the tracker if it got
    /// its hugepage, else give it back, to be collapsed if it is hot. Without kpageflags a
    /// hugepage is assumed, as in [`Self::measure_on`].
    fn keep_if_huge(&self, arena: &TrackedArena, range: &TrackedRange, taken: &mut [bool], region: usize) {
        if !self.got_hugepage(range, region, arena.addr() + region * HUGE_PMD) {
            give_back(range, taken, region);
        }
    }

    /// Whether region `region` (at `addr`) is a hugepage mapped whole ([`map_whole`]);
    /// assumed without kpageflags.
    fn got_hugepage(&self, range: &TrackedRange, region: usize, addr: usize) -> bool {
        let Some(k) = &self.kpageflags else { return true };
        // Not while the program unmaps part of it; never a region no longer whole (as `apply`).
        let _ops = range.hold();
        range.region_whole(region) && is_thp(k, addr) && map_whole(addr)
    }

    /// Advise region `region` of `arena` huge (or no longer huge) and take it from the tracker
    /// (or give it back); false when the region is no longer whole or the advice failed.
    fn apply(&self, arena: &TrackedArena, range: &TrackedRange, taken: &mut [bool], region: usize, huge: bool) -> bool {
        // Not while the program unmaps part of it; never a region no longer whole.
        let _ops = range.hold();
        if !range.region_whole(region) {
            return false;
        }
        let at = arena.addr() + region * HUGE_PMD;
        let advice = if huge { Advice::HugePage } else { Advice::NoHugePage };
        if mem::madvise(at, HUGE_PMD, advice).is_err() {
            return false;
        }
        // An advised region is not observed: dropping a page of a hugepage's mapping would
        // split it. Un-advised, it is tracked as any other.
        match (huge, range.mode(region)) {
            (true, RegionMode::Sample | RegionMode::Full) => {
                range.set_mode(region, RegionMode::Skip);
                taken[region] = true;
            }
            (false, RegionMode::Skip) if taken[region] => {
                range.set_mode(region, RegionMode::Sample);
                taken[region] = false;
            }
            _ => {}
        }
        if huge {
            self.advised.fetch_add(1, Ordering::Relaxed);
        }
        true
    }
}

/// Map the hugepage at `addr` with one PMD entry; false if the kernel refused. A hugepage is
/// mapped by 512 PTEs instead when a page table was already there for its range (the region
/// was observed before it was advised): seen here as a region that stayed out of
/// ShmemPmdMapped, and out of the tracker, for good. MADV_COLLAPSE of a range that is one
/// hugepage already only replaces the page table with the PMD entry (no copy); on one mapped
/// so already it does nothing and succeeds. It can be refused for the moment (EAGAIN: a page
/// busy, as the program writes the region): the region then goes back to the tracker, which
/// collapses it if it is hot, trying again after a refusal. Kept from the tracker it would stay
/// on 4 KiB mappings for good — what a clean run of the drift test under `--first-touch always`
/// saw once (one hot region of four never PMD-mapped); not reproduced since, so maybe another
/// way in.
fn map_whole(addr: usize) -> bool {
    mem::madvise(addr, HUGE_PMD, Advice::Collapse).is_ok()
}

/// Give region `region`, taken from the tracker, back to it (sampled as any other).
fn give_back(range: &TrackedRange, taken: &mut [bool], region: usize) {
    let _ops = range.hold();
    if taken[region] && range.region_whole(region) {
        range.set_mode(region, RegionMode::Sample);
        taken[region] = false;
    }
}

/// Whether the page at `addr` of this process is part of a transparent hugepage (pagemap's
/// PFN, then kpageflags' KPF_THP). A failed read says no.
fn is_thp((pagemap, flags): &(Pagemap, Mutex<KpageFlags>), addr: usize) -> bool {
    let Ok(entry) = pagemap.read_raw(addr, 1) else { return false };
    let pfn = entry[0] & PAGEMAP_PFN_MASK;
    entry[0] & PAGEMAP_PRESENT != 0
        && pfn != 0
        && flags.lock().expect("kpageflags lock").flags(pfn).is_ok_and(|f| f & KPF_THP != 0)
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
