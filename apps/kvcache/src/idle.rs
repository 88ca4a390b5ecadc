//! How long an idle worker keeps polling for requests before it sleeps in `epoll_wait`: a
//! window that adapts to the gaps between requests, as KVM's halt-polling adapts
//! `halt_poll_ns` (virt/kvm/kvm_main.c: grow from a start value by doubling, up to a maximum).
//!
//! Why poll: a worker asleep in `epoll_wait` is woken by the client's `send`, and on a virtual
//! machine the waker pays for that wake-up of an idle CPU (an IPI to a halted vCPU, a trip
//! through the hypervisor) inside its own system call. A worker still polling when the request
//! lands needs no wake-up, so the client's core does less per request; a client that saturates
//! its core (YCSB's Java client) then gets more requests through, and one that waits for each
//! reply gets it sooner. Why adapt: the polling is paid by the server's core, and where
//! requests come further apart than the largest window it would be paid for nothing, so the
//! window shrinks to none and an idle or lightly used server sleeps at once, as memcached's
//! workers always do. Where: only on cores the server was given (its CPU affinity narrower than
//! the online CPUs: taskset, a cpuset, a container's exclusive cores), as polling systems such
//! as DPDK and Seastar assume pinned cores. A poller keeps its core from looking idle, and left
//! to the scheduler on shared cores that cost a latency-bound client more than polling saved
//! (memcslap, all four threads unpinned on 2 cores: 1.34× and 1.49× the polling server's
//! throughput without polling, medians of two runs of 12 pairs). And a worker that finds
//! another task on its core while it polls stops ([`IdlePoll::core_shared`]), as KVM stops
//! halt-polling when another task is runnable.

use std::collections::BTreeSet;
use std::time::Duration;

/// The first window after a gap a window would have caught (KVM's `halt_poll_ns_grow_start`).
pub const START: Duration = Duration::from_micros(10);

/// `--poll-us` when not given: the largest window, in µs. Under YCSB's Java client on this
/// project's 2-vCPU machine, 50 µs took its throughput up by 12% for 8.5 µs more server CPU
/// per request, 100 µs by 27% for 20 µs more (docs/hps.md).
pub const DEFAULT_MAX_US: u64 = 50;

/// The largest window to use: `requested` when the server may run on only some of the online
/// CPUs (`allowed`, its affinity), none when it may run on all of them.
pub fn max_window(requested: Duration, allowed: &BTreeSet<usize>, online: &BTreeSet<usize>) -> Duration {
    let confined = !allowed.is_empty() && allowed.is_subset(online) && allowed.len() < online.len();
    if confined {
        requested
    } else {
        Duration::ZERO
    }
}

/// The poll window of one worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdlePoll {
    window: Duration,
    max: Duration,
}

impl IdlePoll {
    /// A window that starts closed and never exceeds `max` (zero: never poll).
    pub fn new(max: Duration) -> Self {
        IdlePoll { window: Duration::ZERO, max }
    }

    /// How long to poll before sleeping, now.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Another task ran on the worker's core while it polled: polling there only delays whoever
    /// shares the core (a client on it), so the window closes until short gaps reopen it.
    pub fn core_shared(&mut self) {
        self.window = Duration::ZERO;
    }

    /// The worker went idle and its next event came `gap` later (polling and sleeping both
    /// counted). A gap the window covered changes nothing; one a longer window would have
    /// covered doubles it (from [`START`], up to the maximum); one longer than the maximum
    /// halves it, to none once below [`START`]: a single long pause among short gaps does not
    /// stop polling outright, a run of them does.
    pub fn woke_after(&mut self, gap: Duration) {
        if gap <= self.window {
            return;
        }
        self.window = if gap > self.max {
            let half = self.window / 2;
            if half < START {
                Duration::ZERO
            } else {
                half
            }
        } else {
            (self.window * 2).max(START).min(self.max)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn only_a_server_confined_to_some_of_the_cpus_polls() {
        let set = |v: &[usize]| v.iter().copied().collect::<BTreeSet<usize>>();
        let want = 50 * US;
        assert_eq!(max_window(want, &set(&[1]), &set(&[0, 1])), want);
        assert_eq!(max_window(want, &set(&[2, 3]), &set(&[0, 1, 2, 3])), want);
        // All of them, the only one, or an affinity the online CPUs do not cover: no polling.
        assert_eq!(max_window(want, &set(&[0, 1]), &set(&[0, 1])), Duration::ZERO);
        assert_eq!(max_window(want, &set(&[0]), &set(&[0])), Duration::ZERO);
        assert_eq!(max_window(want, &set(&[]), &set(&[0, 1])), Duration::ZERO);
        assert_eq!(max_window(want, &set(&[0, 1, 2]), &set(&[0, 1])), Duration::ZERO);
    }

    #[test]
    fn another_task_on_the_core_closes_the_window_until_short_gaps_reopen_it() {
        let mut p = IdlePoll::new(50 * US);
        for _ in 0..4 {
            p.woke_after(45 * US);
        }
        assert_eq!(p.window(), 50 * US);
        p.core_shared();
        assert_eq!(p.window(), Duration::ZERO);
        p.woke_after(30 * US);
        assert_eq!(p.window(), START);
    }

    #[test]
    fn short_gaps_open_the_window_by_doubling_up_to_the_maximum() {
        let mut p = IdlePoll::new(50 * US);
        assert_eq!(p.window(), Duration::ZERO);
        let mut seen = Vec::new();
        for _ in 0..5 {
            p.woke_after(45 * US);
            seen.push(p.window().as_micros());
        }
        assert_eq!(seen, [10, 20, 40, 50, 50]);
    }

    #[test]
    fn a_gap_the_window_covered_changes_nothing() {
        let mut p = IdlePoll::new(50 * US);
        p.woke_after(5 * US);
        p.woke_after(15 * US);
        assert_eq!(p.window(), 20 * US);
        p.woke_after(3 * US);
        p.woke_after(20 * US);
        assert_eq!(p.window(), 20 * US);
    }

    #[test]
    fn gaps_beyond_the_maximum_close_the_window_by_halving() {
        let mut p = IdlePoll::new(80 * US);
        for _ in 0..4 {
            p.woke_after(70 * US);
        }
        assert_eq!(p.window(), 80 * US);
        let mut seen = Vec::new();
        for _ in 0..4 {
            p.woke_after(Duration::from_millis(5));
            seen.push(p.window().as_micros());
        }
        assert_eq!(seen, [40, 20, 10, 0]);
        // Closed, it stays closed while the server is idle.
        p.woke_after(Duration::from_secs(1));
        assert_eq!(p.window(), Duration::ZERO);
    }

    #[test]
    fn a_zero_maximum_never_polls() {
        let mut p = IdlePoll::new(Duration::ZERO);
        for gap in [0, 1, 5, 10, 100] {
            p.woke_after(gap * US);
            assert_eq!(p.window(), Duration::ZERO);
        }
    }

    #[test]
    fn a_maximum_below_the_start_value_caps_the_first_window() {
        let mut p = IdlePoll::new(4 * US);
        p.woke_after(3 * US);
        assert_eq!(p.window(), 4 * US);
        p.woke_after(9 * US);
        assert_eq!(p.window(), Duration::ZERO);
    }

    /// Whatever the gaps, the window stays within zero and the maximum.
    #[test]
    fn the_window_never_exceeds_the_maximum() {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        for max_us in [0u64, 3, 10, 37, 50, 200] {
            let max = Duration::from_micros(max_us);
            let mut p = IdlePoll::new(max);
            for _ in 0..10_000 {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                p.woke_after(Duration::from_micros(rng % 400));
                assert!(p.window() <= max, "{:?} > {max:?}", p.window());
            }
        }
    }
}
