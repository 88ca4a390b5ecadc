//! Measurement for the tuner: which base pages a loop (or a window) faulted on, how long it
//! took, and the decisions taken. The runtime marks pages on its fault path (a bit per base
//! page, allocated with the area: nothing is allocated while a fault is served) and asks
//! [`crate::tune::decide`] at `dlm_end` or when a window closes.
//!
//! - `dlm_start(id)` / `dlm_end(id)`: each loop id has its own [`LoopState`] (size, history);
//!   at start the loop's own size is put in force, at end the tuner decides its next one.
//! - Windows (`Config::auto_tune`, for programs without start/end): while no loop is measured,
//!   every `Config::tune_window` (with at least [`MIN_WINDOW_FAULTS`] faults) closes a window.
//!   A window's "time" is the fraction of it spent serving faults: a window has no fixed
//!   amount of work, so its wall time says nothing, but the share lost to paging does.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::tune::{Decision, LoopState, Touched, TunerConfig, WindowTuner};

/// The loop id of tuning windows.
pub const WINDOW_ID: u64 = u64::MAX;
/// A window closes only once it saw this many faults (fewer say too little about the size).
pub const MIN_WINDOW_FAULTS: u64 = 64;
/// Decisions kept (room reserved up front: windows decide on the fault path).
pub const MAX_DECISIONS: usize = 4096;

pub(crate) struct Measure {
    pub tuner: TunerConfig,
    pub auto: bool,
    pub window: Duration,
    /// The loop being measured and when it started.
    pub active: Option<(u64, Instant)>,
    pub loops: HashMap<u64, LoopState>,
    /// The window tuner (used while no loop is measured).
    pub window_state: WindowTuner,
    pub window_start: Instant,
    pub window_faults: u64,
    pub window_fault_time: Duration,
    pub decisions: Vec<Decision>,
    /// Decisions not kept (the log was full).
    pub dropped: u64,
    /// Faults of the measured loop since it started (or since its last early decision).
    pub loop_faults: usize,
}

impl Measure {
    pub fn new(tuner: TunerConfig, auto: bool, window: Duration) -> Self {
        Measure {
            tuner,
            auto,
            window,
            active: None,
            loops: HashMap::new(),
            window_state: WindowTuner::new(&tuner),
            window_start: Instant::now(),
            window_faults: 0,
            window_fault_time: Duration::ZERO,
            decisions: Vec::with_capacity(MAX_DECISIONS),
            dropped: 0,
            loop_faults: 0,
        }
    }

    /// Record a decision (allocation-free: the log has its room).
    pub fn log(&mut self, d: Decision) {
        if self.decisions.len() < self.decisions.capacity() {
            self.decisions.push(d);
        } else {
            self.dropped += 1;
        }
    }

    /// A fault served in `took`: whether a tuning window is due now.
    pub fn fault(&mut self, took: Duration, now: Instant) -> bool {
        self.window_faults += 1;
        self.window_fault_time += took;
        self.auto
            && self.active.is_none()
            && self.window_faults >= MIN_WINDOW_FAULTS
            && now.duration_since(self.window_start) >= self.window
    }

    /// Close the window: decide from what it touched; returns the new set count.
    pub fn close_window(&mut self, touched: &Touched, now: Instant) -> u32 {
        let wall = now.duration_since(self.window_start).as_secs_f64().max(1e-9);
        let share = self.window_fault_time.as_secs_f64() / wall;
        let d = self.window_state.on_window(&self.tuner, touched, share, WINDOW_ID);
        self.log(d);
        self.reset_window(now);
        self.window_state.set()
    }

    /// A fault of the measured loop: whether it has faulted more than twice its local units
    /// at `set` since it started (it is thrashing: time for [`crate::tune::decide_early`]).
    pub fn loop_fault(&mut self, set: u32) -> bool {
        if self.active.is_none() {
            return false;
        }
        self.loop_faults += 1;
        self.loop_faults > 2 * self.tuner.local_units(set) + 16
    }

    pub fn reset_window(&mut self, now: Instant) {
        self.window_start = now;
        self.window_faults = 0;
        self.window_fault_time = Duration::ZERO;
    }
}

/// Mark base page `page` in `bits`.
#[inline]
pub fn mark(bits: &mut [u64], page: usize) {
    bits[page / 64] |= 1 << (page % 64);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_close_after_time_and_enough_faults() {
        let t = TunerConfig { base_page: 4096, local_mem: 64 * 4096, min_set: 1, max_set: 8 };
        let mut m = Measure::new(t, true, Duration::from_millis(10));
        let start = m.window_start;
        for _ in 0..MIN_WINDOW_FAULTS - 1 {
            assert!(!m.fault(Duration::from_micros(5), start + Duration::from_millis(20)));
        }
        assert!(m.fault(Duration::from_micros(5), start + Duration::from_millis(20)));
        // The window tuner starts in the middle (set 4 of 1..8) and, with touched units that
        // do not fit, tries the smaller neighbour first.
        assert_eq!(m.window_state.set(), 4);
        let mut touched = Touched::default();
        touched.units[..4].copy_from_slice(&[40, 40, 40, 100]);
        assert_eq!(m.close_window(&touched, start + Duration::from_millis(20)), 2);
        assert_eq!(m.decisions.len(), 1);
        assert_eq!(m.decisions[0].loop_id, WINDOW_ID);
        assert_eq!(m.window_faults, 0);
        // While a loop is measured, windows never close.
        m.active = Some((3, start));
        for _ in 0..2 * MIN_WINDOW_FAULTS {
            assert!(!m.fault(Duration::ZERO, start + Duration::from_secs(1)));
        }
    }
}
