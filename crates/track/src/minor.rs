//! The userfaultfd-minor backend: "clear the accessed bit" = drop the PTE, "the bit was set"
//! = a minor fault arrived.
//!
//! Two ways to hear of a fault ([`Delivery`]): a handler thread reading the userfaultfd
//! (poll(2), read, UFFDIO_CONTINUE; the faulting thread sleeps until the handler is scheduled),
//! or UFFD_FEATURE_SIGBUS, where the kernel raises SIGBUS on the faulting thread and the
//! signal handler counts and resolves the fault itself (no second thread, no context switch:
//! on a loaded machine the handler thread can wait a whole scheduler slice per fault). The
//! `hps-tracker-cost` experiment measures both; SIGBUS is the default.
//! Ordering: a page's `armed` flag is set *before* its PTE is dropped, and the handler clears
//! it with a swap, so a page touched by two threads at once is counted once per period and a
//! fault can never be missed by the count (a fault only exists after the drop).

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pagewise_kernel::colocate::Colocation;
use pagewise_kernel::cpu::CpuClock;
use pagewise_kernel::mem::{self, Advice};
use pagewise_kernel::signal::WhileHandling;
use pagewise_kernel::uffd::{self, feature, Event, RegisterMode, Uffd, UffdBuilder};

mod fault_cost;
mod range;

pub use fault_cost::FaultTiming;
pub use range::TrackedRange;

use crate::plan::{self, PlanConfig, RegionMode};
use crate::{Error, Result, PAGE};

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
    /// Of `faults`, those served while the handler did not share the faulting thread's CPU.
    pub unpinned_faults: u64,
}

/// How minor faults reach the tracker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// A dedicated thread reads fault messages from the userfaultfd.
    HandlerThread,
    /// SIGBUS on the faulting thread (UFFD_FEATURE_SIGBUS); one such tracker per process.
    Sigbus,
}

const SLOTS: usize = 64;

/// The SIGBUS handler's view of the tracked ranges: lock-free, because a signal handler may
/// not take locks. A slot is published (range pointer, then bounds) before the range is
/// registered, and retired (bounds cleared) before it is unregistered; retired ranges are kept
/// alive until the tracker is dropped, so a handler racing with `untrack` never sees freed
/// memory.
struct Slot {
    start: AtomicUsize,
    end: AtomicUsize,
    range: std::sync::atomic::AtomicPtr<TrackedRange>,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY_SLOT: Slot = Slot {
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    range: std::sync::atomic::AtomicPtr::new(std::ptr::null_mut()),
};
static SIGBUS_SLOTS: [Slot; SLOTS] = [EMPTY_SLOT; SLOTS];
static SIGBUS_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);
static SIGBUS_OWNED: AtomicBool = AtomicBool::new(false);
static SIGBUS_FAULTS: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to SA_SIGINFO handlers; si_addr is the fault.
    let addr = unsafe { (*info).si_addr() } as usize;
    let page = addr & !(PAGE - 1);
    for slot in &SIGBUS_SLOTS {
        let (s, e) = (slot.start.load(Ordering::Acquire), slot.end.load(Ordering::Acquire));
        if page >= s && page < e {
            let r = slot.range.load(Ordering::Acquire);
            // SAFETY: as below.
            if !r.is_null() && unsafe { &*r }.holds(page) {
                // SAFETY: published ranges stay alive until the tracker is dropped (see Slot).
                unsafe { &*r }.record_fault(page);
                SIGBUS_FAULTS.fetch_add(1, Ordering::Relaxed);
                // EEXIST means another thread's fault mapped it first: returning retries the
                // access, which now succeeds.
                let _ = uffd::continue_raw(SIGBUS_FD.load(Ordering::Acquire), page, PAGE, true);
                return;
            }
        }
    }
    // Not a tracked page: somebody else's SIGBUS (another userfaultfd user such as DLM, or a
    // real bus error): the handler we replaced gets it.
    // SAFETY: PREV_BUS points at the sigaction saved by `with_delivery` (never freed while the
    // handler can run); we are in the SIGBUS handler with the kernel's arguments.
    unsafe { pagewise_kernel::signal::forward_to_previous(PREV_BUS.load(Ordering::Acquire), sig, info, ctx) }
}

/// The SIGBUS action our handler replaced (leaked on purpose: a handler may still read it).
static PREV_BUS: std::sync::atomic::AtomicPtr<libc::sigaction> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

struct Inner {
    uffd: Uffd,
    delivery: Delivery,
    /// SIGBUS_FAULTS when this tracker started (the counter is process-wide).
    sigbus_base: u64,
    retired: Mutex<Vec<Arc<TrackedRange>>>,
    ranges: RwLock<Vec<Arc<TrackedRange>>>,
    stop: AtomicBool,
    periods: AtomicU64,
    armed_pages: AtomicU64,
    faults: AtomicU64,
    arm_ns: AtomicU64,
    /// Faults served while the handler did not share the faulting thread's CPU: each cost
    /// that thread two cross-CPU wake-ups besides the handler's work (`crate::fault_cost`).
    unpinned_faults: AtomicU64,
    /// The CPU the handler shares with the program's one thread now (colocation;
    /// `crate::fault_cost` times a fault there); -1: none.
    pinned_cpu: AtomicIsize,
    /// The page the tracker faults on itself to time a fault (`crate::fault_cost`): served,
    /// never counted, never a reason to pin or release a thread. 0: none.
    probe_page: AtomicUsize,
    /// The handler thread's CPU clock, read by whoever asks for the stats (the thread lives
    /// as long as the tracker): a thread reading its own clock is a system call, about 1 µs
    /// here, too dear to pay per fault.
    handler_clock: Mutex<Option<CpuClock>>,
}

/// The userfaultfd-minor tracker of this process's [`crate::TrackedArena`]s.
pub struct MinorTracker {
    inner: Arc<Inner>,
    handler: Mutex<Option<JoinHandle<()>>>,
}

impl MinorTracker {
    /// A tracker with the faster delivery available: SIGBUS (see the module doc), or the
    /// handler thread when this process already has a SIGBUS tracker or the kernel lacks
    /// UFFD_FEATURE_SIGBUS.
    pub fn new() -> Result<Self> {
        Self::with_delivery(Delivery::Sigbus).or_else(|_| Self::with_delivery(Delivery::HandlerThread))
    }

    /// Open a userfaultfd with MINOR_SHMEM and start hearing faults by `delivery`.
    pub fn with_delivery(delivery: Delivery) -> Result<Self> {
        Self::with_options(delivery, None)
    }

    /// As [`MinorTracker::with_delivery`]; with `colocate: Some(n)` (the handler thread's
    /// runtime has `n` threads in all, the handler among them) the handler thread keeps the
    /// program's one thread company on one CPU ([`pagewise_kernel::colocate`]): each fault
    /// then costs no cross-CPU wake-up.
    pub fn with_options(delivery: Delivery, colocate: Option<u32>) -> Result<Self> {
        let mut features = feature::MINOR_SHMEM;
        if delivery == Delivery::Sigbus {
            if SIGBUS_OWNED.swap(true, Ordering::AcqRel) {
                return Err(Error::Kernel(pagewise_kernel::Error::Invalid(
                    "only one SIGBUS-delivery tracker per process".into(),
                )));
            }
            features |= feature::SIGBUS;
        }
        // Which thread faulted, for co-location (Linux 4.14; without it there is none).
        let wanted = if colocate.is_some() { feature::THREAD_ID } else { 0 };
        let uffd = match UffdBuilder::new().require(features).want(wanted).nonblocking(true).open() {
            Ok(u) => u,
            Err(e) => {
                if delivery == Delivery::Sigbus {
                    SIGBUS_OWNED.store(false, Ordering::Release);
                }
                return Err(e.into());
            }
        };
        if delivery == Delivery::Sigbus {
            SIGBUS_FD.store(uffd.as_raw_fd(), Ordering::Release);
            match pagewise_kernel::signal::swap_handler(libc::SIGBUS, on_sigbus, WhileHandling::BlockNone) {
                Ok(prev) => {
                    let old = PREV_BUS.swap(Box::into_raw(Box::new(prev)), Ordering::AcqRel);
                    // The previous saved action is not freed: a handler running on another
                    // thread may still be reading it. One small leak per SIGBUS tracker.
                    let _ = old;
                }
                Err(e) => {
                    SIGBUS_OWNED.store(false, Ordering::Release);
                    return Err(e.into());
                }
            }
        }
        let inner = Arc::new(Inner {
            uffd,
            delivery,
            sigbus_base: SIGBUS_FAULTS.load(Ordering::Relaxed),
            retired: Mutex::new(Vec::new()),
            ranges: RwLock::new(Vec::new()),
            stop: AtomicBool::new(false),
            periods: AtomicU64::new(0),
            armed_pages: AtomicU64::new(0),
            faults: AtomicU64::new(0),
            arm_ns: AtomicU64::new(0),
            unpinned_faults: AtomicU64::new(0),
            pinned_cpu: AtomicIsize::new(-1),
            probe_page: AtomicUsize::new(0),
            handler_clock: Mutex::new(None),
        });
        let handle = if delivery == Delivery::HandlerThread {
            let worker = inner.clone();
            Some(
                pagewise_kernel::signal::spawn_blocking_signals(
                    std::thread::Builder::new().name("pw-track-uffd".into()),
                    move || serve(&worker, colocate),
                )
                .map_err(|e| Error::Io { path: "thread spawn".into(), source: e })?,
            )
        } else {
            None
        };
        Ok(MinorTracker { inner, handler: Mutex::new(handle) })
    }

    pub fn delivery(&self) -> Delivery {
        self.inner.delivery
    }

    /// Whether the handler thread shares the program's one thread's CPU now (colocation):
    /// a fault then costs no cross-CPU wake-up.
    pub fn colocated(&self) -> bool {
        self.inner.pinned_cpu.load(Ordering::Relaxed) >= 0
    }

    /// Start tracking `[start, start+len)` (a shared-memory mapping, page aligned).
    pub fn track(&self, start: usize, len: usize) -> Result<Arc<TrackedRange>> {
        self.track_parts(start, len, &[(start, len)])
    }

    /// Start tracking the parts `live` (address, length) of `[start, start+len)`, page aligned
    /// and inside it; the rest is forgotten from the start, never registered or armed (not
    /// the caller's memory: an arena whose view covers only part of its regions).
    pub fn track_parts(&self, start: usize, len: usize, live: &[(usize, usize)]) -> Result<Arc<TrackedRange>> {
        let aligned = |a: usize, n: usize| n > 0 && a.is_multiple_of(PAGE) && n.is_multiple_of(PAGE);
        if !aligned(start, len) || !live.iter().all(|&(a, n)| aligned(a, n) && a >= start && a + n <= start + len) {
            return Err(Error::Kernel(pagewise_kernel::Error::Invalid(format!(
                "tracked range {start:#x}+{len:#x} (parts {live:x?}) is not page aligned"
            ))));
        }
        let range = Arc::new(TrackedRange::new(start, len)?);
        let mut at = start;
        for &(a, n) in live.iter().chain([(start + len, 0)].iter()) {
            if a > at {
                range.forget((at - start) / PAGE, (a - at) / PAGE);
            }
            at = at.max(a + n);
        }
        if self.inner.delivery == Delivery::Sigbus {
            let slot = SIGBUS_SLOTS
                .iter()
                .find(|s| s.range.load(Ordering::Acquire).is_null())
                .ok_or_else(|| Error::Kernel(pagewise_kernel::Error::Invalid("too many tracked ranges".into())))?;
            slot.range.store(Arc::as_ptr(&range) as *mut TrackedRange, Ordering::Release);
            slot.start.store(start, Ordering::Release);
            slot.end.store(start + len, Ordering::Release);
        }
        for (i, &(a, n)) in live.iter().enumerate() {
            if let Err(e) = self.inner.uffd.register(a, n, RegisterMode { minor: true, ..Default::default() }) {
                for &(a, n) in &live[..i] {
                    let _ = self.inner.uffd.unregister(a, n);
                }
                retire_slot(start);
                return Err(e.into());
            }
        }
        self.inner.ranges.write().expect("ranges lock").push(range.clone());
        Ok(range)
    }

    /// Stop tracking the range starting at `start`; its pages stay mapped as they are.
    pub fn untrack(&self, start: usize) -> Result<()> {
        self.untrack_where(|r| r.start == start, start)
    }

    fn untrack_where(&self, which: impl Fn(&Arc<TrackedRange>) -> bool, start: usize) -> Result<()> {
        let r = {
            let mut ranges = self.inner.ranges.write().expect("ranges lock");
            let pos = ranges.iter().position(which).ok_or(Error::NotTracked(start))?;
            ranges.remove(pos)
        };
        let live = r.live_runs(0, r.pages());
        // A tracking period that listed the ranges before this one went may still arm it (or
        // a decision step collapse it): the caller is about to unmap the range, and another
        // mapping may take its place (glibc's malloc maps its heaps without a word to anyone),
        // whose pages MADV_DONTNEED would zero. Retiring waits for such work under way and
        // ends it for good.
        r.retire();
        let mut res = Ok(());
        for (first, count) in live {
            if let Err(e) = self.inner.uffd.unregister(r.start + first * PAGE, count * PAGE) {
                res = res.and(Err(e.into()));
            }
        }
        if self.inner.delivery == Delivery::Sigbus {
            retire_slot(r.start);
        }
        self.inner.retired.lock().expect("retired lock").push(r);
        res
    }

    /// Stop tracking `[addr, addr + len)` for good ([`TrackedRange::forget`]).
    pub fn forget(&self, addr: usize, len: usize) -> Result<()> {
        let r = self.range_of(addr).ok_or(Error::NotTracked(addr))?;
        r.forget(r.page_of(addr), len.div_ceil(PAGE));
        Ok(())
    }

    /// The tracked ranges.
    pub fn ranges(&self) -> Vec<Arc<TrackedRange>> {
        self.inner.ranges.read().expect("ranges lock").clone()
    }

    /// The range containing `addr`.
    pub fn range_of(&self, addr: usize) -> Option<Arc<TrackedRange>> {
        let ranges = self.inner.ranges.read().expect("ranges lock");
        ranges.iter().find(|r| r.holds(addr)).or_else(|| ranges.iter().find(|r| r.contains(addr))).cloned()
    }

    /// Stop tracking `range` (one of [`MinorTracker::ranges`]): as [`MinorTracker::untrack`],
    /// for ranges that may share a start.
    pub fn untrack_range(&self, range: &Arc<TrackedRange>) -> Result<()> {
        self.untrack_where(|r| Arc::ptr_eq(r, range), range.start)
    }

    /// Clear the "accessed bit" of pages `[first, first+count)` of `range`.
    ///
    /// A page not yet in the memfd cannot raise a minor fault: its first touch is a normal
    /// (missing) fault the kernel serves itself. Such pages are marked `absent` instead, and
    /// [`MinorTracker::settle`] credits the ones that became resident since (mincore(2)), so a
    /// region being populated is not mistaken for an idle one.
    pub fn arm(&self, range: &TrackedRange, first: usize, count: usize) -> Result<()> {
        let _ops = range.hold();
        for (first, count) in range.live_runs(first, count) {
            self.arm_run(range, first, count)?;
        }
        Ok(())
    }

    fn arm_run(&self, range: &TrackedRange, first: usize, count: usize) -> Result<()> {
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
            let _ops = r.hold();
            for (first, count) in r.live_runs(0, r.pages()) {
                let mut resident = vec![0u8; count];
                mem::mincore(r.start + first * PAGE, count * PAGE, &mut resident)?;
                for (k, res) in resident.iter().enumerate() {
                    let i = first + k;
                    if res & 1 != 0 && r.absent[i].load(Ordering::Relaxed) {
                        r.absent[i].store(false, Ordering::Relaxed);
                        r.absent_count.fetch_sub(1, Ordering::Relaxed);
                        r.acs[i].fetch_add(1, Ordering::Relaxed);
                    }
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
            faults: match i.delivery {
                Delivery::HandlerThread => i.faults.load(Ordering::Relaxed),
                Delivery::Sigbus => SIGBUS_FAULTS.load(Ordering::Relaxed) - i.sigbus_base,
            },
            arm_ns: i.arm_ns.load(Ordering::Relaxed),
            handler_cpu_ns: i
                .handler_clock
                .lock()
                .expect("handler clock lock")
                .as_ref()
                .map_or(0, |c| c.now().as_nanos() as u64),
            unpinned_faults: i.unpinned_faults.load(Ordering::Relaxed),
        }
    }
}

impl Drop for MinorTracker {
    fn drop(&mut self) {
        // Unregister first: a thread faulting on an armed page after the handler stops would
        // otherwise wait forever. Unregistering wakes such waiters and later touches fault in
        // normally from the page cache.
        for r in self.ranges() {
            for (first, count) in r.live_runs(0, r.pages()) {
                let _ = self.inner.uffd.unregister(r.start + first * PAGE, count * PAGE);
            }
        }
        if self.inner.delivery == Delivery::Sigbus {
            for r in self.ranges() {
                retire_slot(r.start);
            }
            // SAFETY: PREV_BUS is null or the valid sigaction saved at install.
            let _ = unsafe {
                pagewise_kernel::signal::restore_if_current(
                    libc::SIGBUS,
                    on_sigbus as *const () as usize,
                    PREV_BUS.load(Ordering::Acquire),
                )
            };
            SIGBUS_FD.store(-1, Ordering::Release);
            SIGBUS_OWNED.store(false, Ordering::Release);
        }
        self.inner.stop.store(true, Ordering::Release);
        if let Some(h) = self.handler.lock().expect("handler lock").take() {
            let _ = h.join();
        }
    }
}

fn retire_slot(start: usize) {
    for slot in &SIGBUS_SLOTS {
        if slot.start.load(Ordering::Acquire) == start && !slot.range.load(Ordering::Acquire).is_null() {
            slot.end.store(0, Ordering::Release);
            slot.start.store(0, Ordering::Release);
            slot.range.store(std::ptr::null_mut(), Ordering::Release);
        }
    }
}

fn serve(inner: &Inner, colocate: Option<u32>) {
    let mut colocation = colocate.and_then(Colocation::new);
    *inner.handler_clock.lock().expect("handler clock lock") = CpuClock::this_thread().ok();
    while !inner.stop.load(Ordering::Acquire) {
        // A 50 ms timeout lets the loop see `stop`; while pinned, threads the program starts
        // share its one CPU until the next check: check often.
        let wait = if colocation.as_ref().is_some_and(Colocation::is_pinned) { 10 } else { 50 };
        match pagewise_kernel::fd::poll_readable(&inner.uffd, Duration::from_millis(wait)) {
            Ok(true) => {}
            Ok(false) => {
                if let Some(c) = &mut colocation {
                    c.check(None);
                }
                continue;
            }
            // Not expected for an open userfaultfd; wait out the period rather than spin.
            Err(_) => {
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        }
        loop {
            match inner.uffd.read_event() {
                Ok(Some(Event::Pagefault { addr, thread_id, .. })) => {
                    let page = addr & !(PAGE - 1);
                    if page != inner.probe_page.load(Ordering::Acquire) {
                        if let (Some(c), true) = (&mut colocation, thread_id != 0) {
                            c.check(Some(thread_id));
                        }
                        let pinned_cpu = colocation.as_ref().and_then(Colocation::pinned_cpu);
                        let pinned = pinned_cpu.is_some();
                        inner.pinned_cpu.store(pinned_cpu.map_or(-1, |c| c as isize), Ordering::Relaxed);
                        if let Some(r) = inner.ranges.read().expect("ranges lock").iter().find(|r| r.holds(page)) {
                            r.record_fault(page);
                        }
                        inner.faults.fetch_add(1, Ordering::Relaxed);
                        if !pinned {
                            inner.unpinned_faults.fetch_add(1, Ordering::Relaxed);
                        }
                    }
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
    }
    if let Some(c) = &mut colocation {
        c.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TrackedArena;

    /// SIGBUS delivery is one per process: tests using it take turns.
    static SIGBUS_TURN: Mutex<()> = Mutex::new(());

    /// Memory populated in `tables` (address ranges), in bytes: their pages present in
    /// /proc/self/pagemap, the shared zero page a read maps not counted. Page by page, so
    /// memory of other tests that the kernel merged into the same mappings is not counted
    /// either (smaps' `Rss` is per mapping: it once counted 2 MiB of a neighbour's).
    fn populated(tables: &[(usize, usize)]) -> u64 {
        use std::os::unix::fs::FileExt;
        let page = mem::page_size();
        let pagemap = std::fs::File::open("/proc/self/pagemap").unwrap();
        let pfn_of = |addr: usize| {
            let mut e = [0u8; 8];
            pagemap.read_exact_at(&mut e, (addr / page * 8) as u64).unwrap();
            let e = u64::from_le_bytes(e);
            (e >> 63 == 1).then_some(e & ((1 << 55) - 1))
        };
        // The zero page's frame, as a read of a fresh page maps it.
        let probe = mem::Mapping::anonymous(page, &mem::MapOptions::default()).unwrap();
        // SAFETY: the probe is ours and readable.
        let _ = unsafe { std::ptr::read_volatile(probe.addr() as *const u8) };
        // Frame numbers read as 0 without CAP_SYS_ADMIN: then every present page counts.
        let zero = pfn_of(probe.addr()).filter(|&pfn| pfn != 0);
        let mut total = 0;
        for &(start, end) in tables {
            for addr in (start / page * page..end).step_by(page) {
                if pfn_of(addr).is_some_and(|pfn| Some(pfn) != zero) {
                    total += page as u64;
                }
            }
        }
        total
    }

    /// Forgetting pages that never had a history (an allocation the program took over before
    /// the tracker saw it), and resetting them, writes only the `gone` marks: the other tables
    /// stay unpopulated (they were 12 bytes per page, 12 MiB for these 4 GiB).
    #[test]
    fn forgetting_pages_without_history_populates_only_their_gone_marks() {
        let r = TrackedRange::new(0x1000_0000_0000, 4 << 30).unwrap(); // 1 Mi pages
        r.forget(0, r.pages());
        r.reset_all();
        assert!(!r.region_whole(0));
        // Each table's address range: only addresses, nothing is read.
        let span = |p: *const u8, bytes: usize| (p as usize, p as usize + bytes);
        let tables = [
            span(r.acs.as_ptr().cast(), r.pages() * 4),
            span(r.obs.as_ptr().cast(), r.pages() * 4),
            span(r.armed.as_ptr().cast(), r.pages()),
            span(r.absent.as_ptr().cast(), r.pages()),
            span(r.known_resident.as_ptr().cast(), r.pages()),
            span(r.gone.as_ptr().cast(), r.pages()),
        ];
        let gone = r.pages() as u64; // one byte per page
        let got = populated(&tables);
        assert!(got >= gone && got < gone + (1 << 20), "{got} bytes populated, {gone} of them the gone marks");
    }

    #[test]
    fn a_touch_after_arming_is_counted_once_and_data_survives_handler_thread() {
        counted_once(Delivery::HandlerThread);
    }

    #[test]
    fn a_touch_after_arming_is_counted_once_and_data_survives_sigbus() {
        let _turn = SIGBUS_TURN.lock().unwrap_or_else(|e| e.into_inner());
        counted_once(Delivery::Sigbus);
        // The slot is free again for the next SIGBUS tracker.
        assert!(MinorTracker::with_delivery(Delivery::Sigbus).is_ok());
    }

    static CHAINED: AtomicU64 = AtomicU64::new(0);

    extern "C" fn previous(_sig: libc::c_int, _info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
        CHAINED.fetch_add(1, Ordering::Relaxed);
    }

    #[test]
    fn a_sigbus_that_is_not_ours_goes_to_the_previous_handler_and_it_is_restored() {
        let _turn = SIGBUS_TURN.lock().unwrap_or_else(|e| e.into_inner());
        let before = pagewise_kernel::signal::swap_handler(libc::SIGBUS, previous, WhileHandling::BlockNone).unwrap();
        {
            let _t = MinorTracker::with_delivery(Delivery::Sigbus).unwrap();
            // SAFETY: raising SIGBUS synchronously on this thread; the address (null) is in
            // no tracked range, so our handler must chain to `previous`.
            unsafe { libc::raise(libc::SIGBUS) };
            assert_eq!(CHAINED.load(Ordering::Relaxed), 1);
        }
        // Dropping the tracker put `previous` back.
        // SAFETY: as above.
        unsafe { libc::raise(libc::SIGBUS) };
        assert_eq!(CHAINED.load(Ordering::Relaxed), 2);
        pagewise_kernel::signal::set_action(libc::SIGBUS, &before).unwrap();
    }

    #[test]
    fn a_second_sigbus_tracker_is_refused() {
        let _turn = SIGBUS_TURN.lock().unwrap_or_else(|e| e.into_inner());
        let _a = MinorTracker::with_delivery(Delivery::Sigbus).unwrap();
        assert!(MinorTracker::with_delivery(Delivery::Sigbus).is_err());
    }

    /// An arena made in a hole of another (the program's MAP_FIXED over part of a packed
    /// arena) shares its span: its pages' faults count in its own range, and untracking one
    /// range leaves the other tracked.
    #[test]
    fn a_page_belongs_to_the_range_that_holds_it_where_ranges_overlap() {
        let outer = TrackedArena::new("pw-minor-outer", 2 << 20).unwrap();
        let t = MinorTracker::with_delivery(Delivery::HandlerThread).unwrap();
        let r_outer = t.track(outer.addr(), outer.len()).unwrap();
        let hole = outer.addr() + (64 << 10);
        t.forget(hole, 64 << 10).unwrap();
        outer.give_up(hole, 64 << 10).unwrap();
        // SAFETY: the hole is no longer the outer arena's; we map our own arena there.
        let inner = unsafe { TrackedArena::at("pw-minor-inner", hole, 64 << 10) }.unwrap();
        assert_eq!((inner.addr(), inner.len(), inner.view_addr()), (outer.addr(), outer.len(), hole));
        let r_inner = t.track_parts(inner.addr(), inner.len(), &inner.live_parts(inner.addr(), inner.len())).unwrap();
        assert!(Arc::ptr_eq(&t.range_of(hole).unwrap(), &r_inner));
        assert!(Arc::ptr_eq(&t.range_of(outer.addr()).unwrap(), &r_outer));
        // SAFETY: the inner arena's view.
        unsafe { mem::touch_pages(hole, 64 << 10) };
        let page = r_inner.page_of(hole);
        t.arm(&r_inner, page, 16).unwrap();
        // SAFETY: as above; the fault is served by the handler thread.
        unsafe { std::ptr::read_volatile((hole + PAGE) as *const u8) };
        assert_eq!((r_inner.acs(page + 1), r_outer.acs(page + 1)), (1, 0));
        t.untrack_range(&r_inner).unwrap();
        assert!(Arc::ptr_eq(&t.range_of(outer.addr()).unwrap(), &r_outer));
        assert_eq!(t.ranges().len(), 1);
    }

    /// A tracking period lists the ranges, then arms them one by one: a range untracked in
    /// between (its arena freed, another mapping put where it was, as glibc's malloc maps its
    /// heaps) must be left alone, or MADV_DONTNEED zeroes that mapping's private pages.
    #[test]
    fn a_range_untracked_after_a_period_listed_it_is_never_armed() {
        let arena = TrackedArena::new("pw-minor-stale", 2 << 20).unwrap();
        let t = MinorTracker::with_delivery(Delivery::HandlerThread).unwrap();
        let r = t.track(arena.addr(), arena.len()).unwrap();
        let listed = t.ranges();
        t.untrack_range(&r).unwrap();
        let (addr, len) = (arena.addr(), arena.len());
        arena.give_up(addr, len).unwrap();
        // SAFETY: the arena gave its view up; private memory replaces it in one step (no
        // moment unmapped, so no other test's mapping can land there).
        let other = unsafe { mem::Mapping::anonymous_at(addr, len, &mem::MapOptions::default()) }.unwrap();
        // SAFETY: our own mapping, just made.
        unsafe { (addr as *mut u64).add(512 * 5).write(0x5eed) };
        for r in &listed {
            t.arm(r, 0, r.pages()).unwrap();
        }
        t.settle().unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { (addr as *const u64).add(512 * 5).read() }, 0x5eed, "an untracked range was armed");
        assert!(listed.iter().all(|r| !r.region_whole(0)), "an untracked range is never collapsed");
        drop(other);
    }

    fn counted_once(delivery: Delivery) {
        let arena = TrackedArena::new("pw-minor-test", 2 << 20).unwrap();
        // SAFETY: our own arena.
        unsafe { mem::touch_pages(arena.addr(), arena.len()) };
        // SAFETY: as above.
        unsafe { (arena.addr() as *mut u64).add(512 * 3).write(77) };
        let t = MinorTracker::with_delivery(delivery).unwrap();
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
        assert_eq!(t.stats().faults, 1);
        assert_eq!(t.delivery(), delivery);
        // The handler thread's CPU time is read from its clock; SIGBUS has no such thread.
        assert_eq!(t.stats().handler_cpu_ns > 0, delivery == Delivery::HandlerThread, "{:?}", t.stats());
    }
}
