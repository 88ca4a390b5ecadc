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
//!
//! When the handler shares the faulting thread's CPU (colocation), the wake-ups are cheap but
//! the CPU is the program's: a fault costs the program the handler's CPU time and the faulting
//! thread's own (the trap, queueing the message, switching out and back, the retried fault).
//! The wall time of a probe would include waiting behind the program for that CPU, so for this
//! case the probe's own CPU time is taken instead, on that CPU: the probe moves there for its
//! faults, so its wake-ups are the local ones a colocated fault takes.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use pagewise_kernel::mem::{self, Advice, MapOptions, Mapping};
use pagewise_kernel::signal::thread_cpu_time;
use pagewise_kernel::uffd::RegisterMode;

use super::{Delivery, MinorTracker};
use crate::{Result, PAGE};

/// One fault as the thread that took it saw it (medians of a probe's faults).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultTiming {
    /// From the access to its return: what the faulting thread waited.
    pub wall: Duration,
    /// The faulting thread's own CPU time in it: what a fault costs a program whose handler
    /// shares its CPU, besides the handler's work.
    pub thread_cpu: Duration,
}

impl MinorTracker {
    /// A minor fault served by the handler thread as the calling thread sees it: the medians
    /// of `n` faults it takes on a page of its own (never counted in the stats nor a reason to
    /// pin a thread). `None` under SIGBUS delivery, where the faulting thread serves itself and
    /// the handler's cost is all there is.
    pub fn time_fault(&self, n: usize) -> Result<Option<FaultTiming>> {
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
        let shared_cpu = usize::try_from(self.inner.pinned_cpu.load(Ordering::Relaxed)).ok();
        let own_mask = shared_cpu.and_then(|cpu| {
            let mask = pagewise_kernel::cpu::affinity(0).ok()?;
            pagewise_kernel::cpu::pin_to(cpu).ok()?;
            Some(mask)
        });
        let timed = self.time_faults_on(page.addr(), n);
        if let Some(mask) = own_mask {
            // Best effort: the probing thread is the tracker's, which runs anywhere.
            let _ = pagewise_kernel::cpu::set_affinity(&mask);
        }
        self.inner.probe_page.store(0, Ordering::Release);
        let (mut wall, mut cpu): (Vec<Duration>, Vec<Duration>) = timed?.into_iter().unzip();
        wall.sort_unstable();
        cpu.sort_unstable();
        Ok(wall.get(n / 2).zip(cpu.get(n / 2)).map(|(&wall, &thread_cpu)| FaultTiming { wall, thread_cpu }))
    }

    fn time_faults_on(&self, addr: usize, n: usize) -> Result<Vec<(Duration, Duration)>> {
        self.inner.uffd.register(addr, PAGE, RegisterMode { minor: true, ..Default::default() })?;
        let mut times = Vec::with_capacity(n);
        let mut r = Ok(());
        for _ in 0..n {
            if let Err(e) = mem::madvise(addr, PAGE, Advice::DontNeed) {
                r = Err(e.into());
                break;
            }
            // The wall interval encloses the CPU one.
            let t = Instant::now();
            let c = thread_cpu_time();
            // SAFETY: `addr` is the caller's mapped page; the read faults and is served.
            unsafe { (addr as *const u8).read_volatile() };
            let cpu = thread_cpu_time().saturating_sub(c);
            times.push((t.elapsed(), cpu));
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
        assert!(d.wall > Duration::ZERO && d.wall < Duration::from_secs(1), "{d:?}");
        // Its own CPU time is part of what it waited (the rest is the handler's work and the
        // wake-ups).
        assert!(d.thread_cpu <= d.wall, "{d:?}");
        let s = t.stats();
        assert_eq!((s.faults, s.unpinned_faults), (0, 0), "{s:?}");
        assert_eq!(t.inner.probe_page.load(Ordering::Acquire), 0);
    }

    /// Timed where the handler shares the program's CPU: served there, and the probing thread
    /// gets its own CPUs back.
    #[test]
    fn a_fault_timed_on_the_shared_cpu_leaves_the_prober_where_it_was() {
        let t = MinorTracker::with_delivery(Delivery::HandlerThread).unwrap();
        let before = pagewise_kernel::cpu::affinity(0).unwrap();
        let cpu = *before.iter().next().expect("a CPU");
        t.inner.pinned_cpu.store(cpu as isize, Ordering::Relaxed);
        let d = t.time_fault(3).unwrap().expect("the handler thread serves the probe");
        assert!(d.thread_cpu <= d.wall, "{d:?}");
        assert_eq!(pagewise_kernel::cpu::affinity(0).unwrap(), before);
    }
}
