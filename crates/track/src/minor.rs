//! The userfaultfd-minor backend: "clear the accessed bit" = drop the PTE, "the bit was set"
//! = a minor fault arrived.
//!
//! One handler thread serves every fault (poll(2) on the userfaultfd, then UFFDIO_CONTINUE).
//! Ordering: a page's `armed` flag is set *before* its PTE is dropped, and the handler clears
//! it with a swap, so a page touched by two threads at once is counted once per period and a
//! fault can never be missed by the count (a fault only exists after the drop).

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Instant;

use pagewise_kernel::mem::{self, Advice};
use pagewise_kernel::uffd::{feature, Event, RegisterMode, Uffd, UffdBuilder};

use crate::plan::{self, PlanConfig, RegionMode};
use crate::{Error, Result, PAGE, PAGES_PER_REGION};

/// One tracked range: per-page counts and per-region modes.
#[derive(Debug)]
pub struct TrackedRange {
    pub start: usize,
    pub len: usize,
    /// Periods in which the page was accessed (the paper's acscount).
    acs: Box<[AtomicU32]>,
    /// Periods in which the page was armed (observed).
    obs: Box<[AtomicU32]>,
    armed: Box<[AtomicBool]>,
    /// Armed while not resident: credited by `settle` if it became resident.
    absent: Box<[AtomicBool]>,
    absent_count: AtomicUsize,
    /// Seen resident at an earlier arming: mincore(2) is skipped for runs of such pages.
    known_resident: Box<[AtomicBool]>,
    modes: Box<[AtomicU8]>,
    cursor: AtomicUsize,
}

impl TrackedRange {
    fn new(start: usize, len: usize) -> Self {
        let pages = len / PAGE;
        let regions = pages.div_ceil(PAGES_PER_REGION);
        TrackedRange {
            start,
            len,
            acs: (0..pages).map(|_| AtomicU32::new(0)).collect(),
            obs: (0..pages).map(|_| AtomicU32::new(0)).collect(),
            armed: (0..pages).map(|_| AtomicBool::new(false)).collect(),
            absent: (0..pages).map(|_| AtomicBool::new(false)).collect(),
            absent_count: AtomicUsize::new(0),
            known_resident: (0..pages).map(|_| AtomicBool::new(false)).collect(),
            modes: (0..regions).map(|_| AtomicU8::new(RegionMode::Sample as u8)).collect(),
            cursor: AtomicUsize::new(0),
        }
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

    /// Forget page `i`'s history (after its contents moved away or were released).
    pub fn reset_page(&self, i: usize) {
        self.acs[i].store(0, Ordering::Relaxed);
        self.obs[i].store(0, Ordering::Relaxed);
        self.known_resident[i].store(false, Ordering::Relaxed);
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

    fn record_fault(&self, addr: usize) {
        let i = (addr - self.start) / PAGE;
        if self.armed[i].swap(false, Ordering::AcqRel) {
            self.acs[i].fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Counters of the tracker's own work.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TrackerStats {
    pub periods: u64,
    /// Pages armed (PTEs dropped) over all periods.
    pub armed_pages: u64,
    /// Minor faults served.
    pub faults: u64,
    /// Wall time spent arming (madvise and bookkeeping), ns.
    pub arm_ns: u64,
    /// CPU time of the fault-handler thread, ns.
    pub handler_cpu_ns: u64,
}

struct Inner {
    uffd: Uffd,
    ranges: RwLock<Vec<Arc<TrackedRange>>>,
    stop: AtomicBool,
    periods: AtomicU64,
    armed_pages: AtomicU64,
    faults: AtomicU64,
    arm_ns: AtomicU64,
    handler_cpu_ns: AtomicU64,
}

/// The userfaultfd-minor tracker of this process's [`crate::TrackedArena`]s.
pub struct MinorTracker {
    inner: Arc<Inner>,
    handler: Mutex<Option<JoinHandle<()>>>,
}

impl MinorTracker {
    /// Open a userfaultfd with MINOR_SHMEM and start the handler thread.
    pub fn new() -> Result<Self> {
        let uffd = UffdBuilder::new().require(feature::MINOR_SHMEM).nonblocking(true).open()?;
        let inner = Arc::new(Inner {
            uffd,
            ranges: RwLock::new(Vec::new()),
            stop: AtomicBool::new(false),
            periods: AtomicU64::new(0),
            armed_pages: AtomicU64::new(0),
            faults: AtomicU64::new(0),
            arm_ns: AtomicU64::new(0),
            handler_cpu_ns: AtomicU64::new(0),
        });
        let worker = inner.clone();
        let handle = std::thread::Builder::new()
            .name("pw-track-uffd".into())
            .spawn(move || serve(&worker))
            .map_err(|e| Error::Io { path: "thread spawn".into(), source: e })?;
        Ok(MinorTracker { inner, handler: Mutex::new(Some(handle)) })
    }

    /// Start tracking `[start, start+len)` (a shared-memory mapping, page aligned).
    pub fn track(&self, start: usize, len: usize) -> Result<Arc<TrackedRange>> {
        if len == 0 || start % PAGE != 0 || len % PAGE != 0 {
            return Err(Error::Kernel(pagewise_kernel::Error::Invalid(format!(
                "tracked range {start:#x}+{len:#x} is not page aligned"
            ))));
        }
        self.inner.uffd.register(start, len, RegisterMode { minor: true, ..Default::default() })?;
        let range = Arc::new(TrackedRange::new(start, len));
        self.inner.ranges.write().expect("ranges lock").push(range.clone());
        Ok(range)
    }

    /// Stop tracking the range starting at `start`; its pages stay mapped as they are.
    pub fn untrack(&self, start: usize) -> Result<()> {
        let mut ranges = self.inner.ranges.write().expect("ranges lock");
        let pos = ranges.iter().position(|r| r.start == start).ok_or(Error::NotTracked(start))?;
        let r = ranges.remove(pos);
        self.inner.uffd.unregister(r.start, r.len)?;
        Ok(())
    }

    /// The tracked ranges.
    pub fn ranges(&self) -> Vec<Arc<TrackedRange>> {
        self.inner.ranges.read().expect("ranges lock").clone()
    }

    /// The range containing `addr`.
    pub fn range_of(&self, addr: usize) -> Option<Arc<TrackedRange>> {
        self.inner.ranges.read().expect("ranges lock").iter().find(|r| r.contains(addr)).cloned()
    }

    /// Clear the "accessed bit" of pages `[first, first+count)` of `range`.
    ///
    /// A page not yet in the memfd cannot raise a minor fault: its first touch is a normal
    /// (missing) fault the kernel serves itself. Such pages are marked `absent` instead, and
    /// [`MinorTracker::settle`] credits the ones that became resident since (mincore(2)), so a
    /// region being populated is not mistaken for an idle one.
    pub fn arm(&self, range: &TrackedRange, first: usize, count: usize) -> Result<()> {
        let t = Instant::now();
        // Pages stay resident until released (which resets them), so residency is asked once.
        let mut resident = vec![1u8; count];
        if !(first..first + count).all(|i| range.known_resident[i].load(Ordering::Relaxed)) {
            mem::mincore(range.start + first * PAGE, count * PAGE, &mut resident)?;
        }
        for (k, i) in (first..first + count).enumerate() {
            range.obs[i].fetch_add(1, Ordering::Relaxed);
            if resident[k] & 1 != 0 {
                range.known_resident[i].store(true, Ordering::Relaxed);
                range.armed[i].store(true, Ordering::Release);
            } else if !range.absent[i].swap(true, Ordering::Relaxed) {
                range.absent_count.fetch_add(1, Ordering::Relaxed);
            }
        }
        mem::madvise(range.start + first * PAGE, count * PAGE, Advice::DontNeed)?;
        self.inner.armed_pages.fetch_add(count as u64, Ordering::Relaxed);
        self.inner.arm_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Credit pages armed while absent that have been populated since (first touches).
    pub fn settle(&self) -> Result<()> {
        for r in self.ranges() {
            if r.absent_count.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let mut resident = vec![0u8; r.pages()];
            mem::mincore(r.start, r.len, &mut resident)?;
            for (i, res) in resident.iter().enumerate() {
                if res & 1 != 0 && r.absent[i].load(Ordering::Relaxed) {
                    r.absent[i].store(false, Ordering::Relaxed);
                    r.absent_count.fetch_sub(1, Ordering::Relaxed);
                    r.acs[i].fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        Ok(())
    }

    /// One tracking period over every range (after settling the previous one): arm what the plan picks within `cfg`'s budget
    /// (shared by all ranges). Returns the number of pages armed.
    pub fn run_period(&self, cfg: &PlanConfig) -> Result<usize> {
        self.settle()?;
        let period = self.inner.periods.fetch_add(1, Ordering::Relaxed);
        let mut left = cfg.budget_pages;
        let mut armed = 0;
        for r in self.ranges() {
            if left == 0 {
                break;
            }
            let modes: Vec<RegionMode> = (0..r.regions()).map(|i| r.mode(i)).collect();
            let c = PlanConfig { budget_pages: left, ..*cfg };
            let p = plan::plan(&modes, &c, period, r.cursor.load(Ordering::Relaxed));
            for &(first, count) in &p.runs {
                let count = count.min(r.pages() - first);
                self.arm(&r, first, count)?;
            }
            r.cursor.store(p.next_cursor, Ordering::Relaxed);
            armed += p.pages;
            left = left.saturating_sub(p.pages);
        }
        Ok(armed)
    }

    pub fn stats(&self) -> TrackerStats {
        let i = &self.inner;
        TrackerStats {
            periods: i.periods.load(Ordering::Relaxed),
            armed_pages: i.armed_pages.load(Ordering::Relaxed),
            faults: i.faults.load(Ordering::Relaxed),
            arm_ns: i.arm_ns.load(Ordering::Relaxed),
            handler_cpu_ns: i.handler_cpu_ns.load(Ordering::Relaxed),
        }
    }
}

impl Drop for MinorTracker {
    fn drop(&mut self) {
        // Unregister first: a thread faulting on an armed page after the handler stops would
        // otherwise wait forever. Unregistering wakes such waiters and later touches fault in
        // normally from the page cache.
        for r in self.ranges() {
            let _ = self.inner.uffd.unregister(r.start, r.len);
        }
        self.inner.stop.store(true, Ordering::Release);
        if let Some(h) = self.handler.lock().expect("handler lock").take() {
            let _ = h.join();
        }
    }
}

fn serve(inner: &Inner) {
    let mut pfd = libc::pollfd { fd: inner.uffd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    while !inner.stop.load(Ordering::Acquire) {
        // SAFETY: pfd is one valid pollfd; a 50 ms timeout lets the loop see `stop`.
        let n = unsafe { libc::poll(&mut pfd, 1, 50) };
        if n <= 0 {
            continue;
        }
        loop {
            match inner.uffd.read_event() {
                Ok(Some(Event::Pagefault { addr, .. })) => {
                    let page = addr & !(PAGE - 1);
                    if let Some(r) = inner.ranges.read().expect("ranges lock").iter().find(|r| r.contains(page)) {
                        r.record_fault(page);
                    }
                    inner.faults.fetch_add(1, Ordering::Relaxed);
                    // EEXIST: another thread's fault on the same page was resolved first; the
                    // waiters still need waking.
                    if inner.uffd.continue_range(page, PAGE, true).is_err() {
                        let _ = inner.uffd.wake(page, PAGE);
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        inner.handler_cpu_ns.store(pagewise_kernel::signal::thread_cpu_time().as_nanos() as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TrackedArena;

    #[test]
    fn a_touch_after_arming_is_counted_once_and_data_survives() {
        let arena = TrackedArena::new("pw-minor-test", 2 << 20).unwrap();
        // SAFETY: our own arena.
        unsafe { mem::touch_pages(arena.addr(), arena.len()) };
        // SAFETY: as above.
        unsafe { (arena.addr() as *mut u64).add(512 * 3).write(77) };
        let t = MinorTracker::new().unwrap();
        let r = t.track(arena.addr(), arena.len()).unwrap();
        t.arm(&r, 0, 16).unwrap();
        for _ in 0..3 {
            // SAFETY: page 3 of the arena; the fault is served by the handler thread.
            assert_eq!(unsafe { std::ptr::read_volatile((arena.addr() as *const u64).add(512 * 3)) }, 77);
        }
        assert_eq!(r.acs(3), 1);
        assert_eq!(r.obs(3), 1);
        assert_eq!(r.acs(4), 0);
        assert_eq!(r.obs(100), 0);
        // A page armed before it was ever touched is credited once it is populated.
        let fresh = TrackedArena::new("pw-minor-fresh", 2 << 20).unwrap();
        let r2 = t.track(fresh.addr(), fresh.len()).unwrap();
        t.arm(&r2, 0, 4).unwrap();
        // SAFETY: our own arena; a first touch (missing fault, served by the kernel).
        unsafe { (fresh.addr() as *mut u64).add(512).write(1) };
        t.settle().unwrap();
        assert_eq!((r2.acs(0), r2.acs(1), r2.obs(1)), (0, 1, 1));
        assert!(t.stats().faults >= 1);
    }
}
