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
//! workers always do.

use std::time::Duration;

/// The first window after a gap a window would have caught (KVM's `halt_poll_ns_grow_start`).
pub const START: Duration = Duration::from_micros(10);

/// `--poll-us` when not given: the largest window, in µs. Under YCSB's Java client on this
/// project's 2-vCPU machine, 50 µs took its throughput up by 12% for 8.5 µs more server CPU
/// per request, 100 µs by 27% for 20 µs more (docs/hps.md).
pub const DEFAULT_MAX_US: u64 = 50;

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
