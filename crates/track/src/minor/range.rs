//! One tracked range's tables: per page, the periods it was accessed and observed, whether it
//! is armed, and whether it is still tracked; per 2 MiB region, what the tracker does with it.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, AtomicUsize, Ordering};
use std::sync::RwLock;

use crate::plan::RegionMode;
use crate::table::Table;
use crate::{Result, PAGE, PAGES_PER_REGION};

/// One tracked range: per-page counts and per-region modes.
#[derive(Debug)]
pub struct TrackedRange {
    pub start: usize,
    pub len: usize,
    /// Periods in which the page was accessed (the paper's acscount).
    pub(super) acs: Table<AtomicU32>,
    /// Periods in which the page was armed (observed).
    pub(super) obs: Table<AtomicU32>,
    pub(super) armed: Table<AtomicBool>,
    /// Armed while not resident: credited by `settle` if it became resident.
    pub(super) absent: Table<AtomicBool>,
    pub(super) absent_count: AtomicUsize,
    /// Seen resident at an earlier arming: mincore(2) is skipped for runs of such pages.
    pub(super) known_resident: Table<AtomicBool>,
    /// No longer tracked (`forget`): unmapped or taken over; never armed again.
    pub(super) gone: Table<AtomicBool>,
    /// Arming, settling and collapsing hold it shared, `forget` and `retire` exclusively: once
    /// either returns, nothing the tracker does touches the forgotten pages' addresses (or any
    /// of a retired range's), which the program may unmap and the kernel give to another
    /// mapping.
    pub(super) ops: RwLock<()>,
    /// Untracked ([`TrackedRange::retire`]): no page of it is armed, settled or collapsed again,
    /// though a tracking period that listed the ranges before it went still holds it.
    pub(super) retired: AtomicBool,
    pub(super) modes: Box<[AtomicU8]>,
    pub(super) cursor: AtomicUsize,
}

/// Zero `a` unless it is: a table page that was never written stays unpopulated.
fn clear(a: &AtomicU32) {
    if a.load(Ordering::Relaxed) != 0 {
        a.store(0, Ordering::Relaxed);
    }
}

/// Clear flag `f`, writing only if it is set (as [`clear`]); true if this call cleared it.
fn clear_flag(f: &AtomicBool) -> bool {
    f.load(Ordering::Relaxed) && f.swap(false, Ordering::Relaxed)
}

impl TrackedRange {
    pub(super) fn new(start: usize, len: usize) -> Result<Self> {
        let pages = len / PAGE;
        let regions = pages.div_ceil(PAGES_PER_REGION);
        Ok(TrackedRange {
            start,
            len,
            acs: Table::zeroed(pages)?,
            obs: Table::zeroed(pages)?,
            armed: Table::zeroed(pages)?,
            absent: Table::zeroed(pages)?,
            absent_count: AtomicUsize::new(0),
            known_resident: Table::zeroed(pages)?,
            gone: Table::zeroed(pages)?,
            ops: RwLock::new(()),
            retired: AtomicBool::new(false),
            modes: (0..regions).map(|_| AtomicU8::new(RegionMode::Sample as u8)).collect(),
            cursor: AtomicUsize::new(0),
        })
    }

    pub fn pages(&self) -> usize {
        self.acs.len()
    }

    pub fn regions(&self) -> usize {
        self.modes.len()
    }

    pub fn contains(&self, addr: usize) -> bool {
        addr >= self.start && addr < self.start + self.len
    }

    /// Whether `addr` is in the range and its page still tracked: ranges may overlap where
    /// one has forgotten pages another now tracks (an arena made by the program's MAP_FIXED
    /// in a hole of another, `crate::TrackedArena::at`), and a page belongs to the one that
    /// holds it.
    pub fn holds(&self, addr: usize) -> bool {
        self.contains(addr) && !self.is_retired() && !self.gone[self.page_of(addr)].load(Ordering::Relaxed)
    }

    /// Whether the range was untracked ([`TrackedRange::retire`]).
    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    /// The range is no longer tracked (untracked: its arena freed, its memory about to be
    /// unmapped): waits for arming, settling or collapsing under way, then none of its pages
    /// is touched again — not even by a period that listed the ranges before it went. Pages
    /// are not marked one by one (`forget`): a large range's tables stay unpopulated.
    pub(super) fn retire(&self) {
        let _ops = self.ops.write().unwrap_or_else(|e| e.into_inner());
        self.retired.store(true, Ordering::Release);
    }

    /// acscount of page `i`.
    pub fn acs(&self, i: usize) -> u32 {
        self.acs[i].load(Ordering::Relaxed)
    }

    /// Periods in which page `i` was observed.
    pub fn obs(&self, i: usize) -> u32 {
        self.obs[i].load(Ordering::Relaxed)
    }

    /// All acscounts.
    pub fn counts(&self) -> Vec<u32> {
        self.acs.iter().map(|a| a.load(Ordering::Relaxed)).collect()
    }

    pub fn mode(&self, region: usize) -> RegionMode {
        RegionMode::from_u8(self.modes[region].load(Ordering::Relaxed))
    }

    pub fn set_mode(&self, region: usize, mode: RegionMode) {
        self.modes[region].store(mode as u8, Ordering::Relaxed);
    }

    /// Forget page `i`'s history (after its contents moved away or were released). Stores only
    /// what is set: the tables stay unpopulated where a page never had a history (a store of
    /// zero would still fault in a page of the table; forgetting a 2 GiB allocation the program
    /// took over wrote 6 MiB of them).
    pub fn reset_page(&self, i: usize) {
        clear(&self.acs[i]);
        clear(&self.obs[i]);
        clear_flag(&self.known_resident[i]);
    }

    /// Stop tracking pages `[first, first + count)` for good (the program unmaps them or takes
    /// them over): waits for arming, settling or collapsing under way, then they are never
    /// armed or collapsed again.
    pub fn forget(&self, first: usize, count: usize) {
        let _ops = self.ops.write().unwrap_or_else(|e| e.into_inner());
        for i in first..(first + count).min(self.pages()) {
            self.gone[i].store(true, Ordering::Relaxed);
            clear_flag(&self.armed[i]);
            if clear_flag(&self.absent[i]) {
                self.absent_count.fetch_sub(1, Ordering::Relaxed);
            }
            self.reset_page(i);
        }
    }

    /// Whether every page of `region` is still tracked (none forgotten): only such a region
    /// may be collapsed.
    pub fn region_whole(&self, region: usize) -> bool {
        if self.is_retired() {
            return false;
        }
        let first = region * PAGES_PER_REGION;
        (first..(first + PAGES_PER_REGION).min(self.pages())).all(|i| !self.gone[i].load(Ordering::Relaxed))
    }

    /// Hold off `forget` while touching the range's memory (collapsing a region).
    pub fn hold(&self) -> std::sync::RwLockReadGuard<'_, ()> {
        self.ops.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The runs `(first, count)` of pages in `[first, first + count)` still tracked.
    pub(super) fn live_runs(&self, first: usize, count: usize) -> Vec<(usize, usize)> {
        let mut runs = Vec::new();
        if self.is_retired() {
            return runs;
        }
        let mut i = first;
        let end = (first + count).min(self.pages());
        while i < end {
            if self.gone[i].load(Ordering::Relaxed) {
                i += 1;
                continue;
            }
            let s = i;
            while i < end && !self.gone[i].load(Ordering::Relaxed) {
                i += 1;
            }
            runs.push((s, i - s));
        }
        runs
    }

    /// Index of the page holding `addr`.
    pub fn page_of(&self, addr: usize) -> usize {
        (addr - self.start) / PAGE
    }

    /// Forget every count.
    pub fn reset_all(&self) {
        for i in 0..self.pages() {
            self.reset_page(i);
        }
    }

    pub(super) fn record_fault(&self, addr: usize) {
        let i = (addr - self.start) / PAGE;
        if self.armed[i].swap(false, Ordering::AcqRel) {
            self.acs[i].fetch_add(1, Ordering::Relaxed);
        }
    }
}
