//! What a tracked page's fault costs the thread that takes it, timed by the tracker itself.
//!
//! Under the handler thread the tracker can count the handler's CPU time, but that is the
//! smaller part of a fault when the handler does not share the faulting thread's CPU (a
//! program with more than one thread: no colocation, `pagewise_kernel::colocate`): the
//! faulting thread also waits for two cross-CPU wake-ups, on a VM often of a halted vCPU the
//! host must wake. Measured under `pagewise hps run` on a JVM (HeapWork, its 770 MiB heap
//! tracked): 25,601 tracked faults made the run 1.3 s slower, 51 µs a fault, where the pace
//! had been charged only the handler's CPU time. What a wake-up costs depends on the moment:
//! this probe took 45 µs a fault with the other CPU idle and 4–5 µs with it busy. So the
//! tracker times a fault as a thread of the process sees it — its own, on a page of its own,
//! again from time to time — and the pace charges that.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use pagewise_kernel::mem::{self, Advice, MapOptions, Mapping};
use pagewise_kernel::uffd::RegisterMode;

use super::{Delivery, MinorTracker};
use crate::{Result, PAGE};

impl MinorTracker {
    /// Wall time of a minor fault served by the handler thread as the calling thread sees it:
    /// the median of `n` faults it takes on a page of its own (never counted in the stats nor
    /// a reason to pin a thread). `None` under SIGBUS delivery, where the faulting thread
    /// serves itself and the handler's cost is all there is.
    pub fn time_fault(&self, n: usize) -> Result<Option<Duration>> {
        if self.inner.delivery != Delivery::HandlerThread || n == 0 {
            return Ok(None);
        }
        let fd = mem::memfd_create("pagewise-fault-probe", None)?;
        mem::ftruncate(&fd, PAGE as u64)?;
        let page = Mapping::of_fd(&fd, PAGE, 0, &MapOptions { shared: true, ..Default::default() })?;
        // SAFETY: our own fresh shared mapping of one page; the write puts the page in the
        // memfd's page cache, so each fault after a MADV_DONTNEED is a minor one.
        unsafe { page.as_ptr().write_volatile(1) };
        self.inner.probe_page.store(page.addr(), Ordering::Release);
        let timed = self.time_faults_on(page.addr(), n);
        self.inner.probe_page.store(0, Ordering::Release);
        let mut times = timed?;
        times.sort_unstable();
        Ok(times.get(n / 2).copied())
    }

    fn time_faults_on(&self, addr: usize, n: usize) -> Result<Vec<Duration>> {
        self.inner.uffd.register(addr, PAGE, RegisterMode { minor: true, ..Default::default() })?;
        let mut times = Vec::with_capacity(n);
        let mut r = Ok(());
        for _ in 0..n {
            if let Err(e) = mem::madvise(addr, PAGE, Advice::DontNeed) {
                r = Err(e.into());
                break;
            }
            let t = Instant::now();
            // SAFETY: `addr` is the caller's mapped page; the read faults and is served.
            unsafe { (addr as *const u8).read_volatile() };
            times.push(t.elapsed());
        }
        self.inner.uffd.unregister(addr, PAGE)?;
        r.map(|()| times)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timed_fault_is_served_and_never_counted() {
        let t = MinorTracker::with_delivery(Delivery::HandlerThread).unwrap();
        let d = t.time_fault(5).unwrap().expect("the handler thread serves the probe");
        assert!(d > Duration::ZERO && d < Duration::from_secs(1), "{d:?}");
        let s = t.stats();
        assert_eq!((s.faults, s.unpinned_faults), (0, 0), "{s:?}");
        assert_eq!(t.inner.probe_page.load(Ordering::Acquire), 0);
    }
}
