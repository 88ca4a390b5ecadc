//! Measurement for the tuner: which base pages a loop (or a window) faulted on, how long it
//! took, and the decisions taken. The runtime marks pages on its fault path (a bit per base
//! page, allocated with the area: nothing is allocated while a fault is served) and asks
//! [`crate::tune::decide`] at `dlm_end` or when a window closes.
//!
//! - `dlm_start(id)` / `dlm_end(id)`: each loop id has its own [`LoopState`] (size, history);
//!   at start the loop's own size is put in force, at end the tuner decides its next one.
//! - Windows (`Config::auto_tune`, for programs without start/end): while no loop is measured,
//!   every `Config::tune_window` (with at least [`MIN_WINDOW_FAULTS`] faults; a trial window:
//!   a quarter of both) closes a window.
//!   A window's cost is its wall time per second of the program's own CPU time (`tune/window.rs`
//!   says why): the runtime reads the program's CPU clock (the process's less its own thread's)
//!   when a window opens and closes; faults served on the program's threads (SIGBUS) are not
//!   the program's work and are taken out here. The runtime also counts the bytes each window
//!   fetched, how many of them continued a stream, and the bytes it wrote back: a sweep's cost
//!   is its wall time per byte streamed in or written back (`tune/window.rs`, "Sweeps").

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::tune::window::{Cost, TRIAL_WINDOW_DIVISOR};
use crate::tune::{Decision, LoopState, Touched, TunerConfig, WindowSeen, WindowTuner};

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
    /// The program's CPU time when the window opened.
    pub window_cpu: Duration,
    /// Faults are served on the program's own threads (SIGBUS): their time is in its CPU time.
    pub faults_on_program_threads: bool,
    pub window_faults: u64,
    pub window_fault_time: Duration,
    /// Bytes the window fetched (demand and read-ahead), and those of them that continued a
    /// stream.
    pub window_fetched: u64,
    pub window_streamed: u64,
    /// Bytes the window wrote back to the memory servers (evicting dirty units).
    pub window_written: u64,
    pub decisions: Vec<Decision>,
    /// Decisions not kept (the log was full).
    pub dropped: u64,
    /// Faults of the measured loop since it started (or since its last early decision).
    pub loop_faults: usize,
}

impl Measure {
    /// `program_cpu`: the program's CPU time now ([`Measure::close_window`]).
    pub fn new(
        tuner: TunerConfig,
        auto: bool,
        window: Duration,
        faults_on_program_threads: bool,
        program_cpu: Duration,
    ) -> Self {
        Measure {
            tuner,
            auto,
            window,
            active: None,
            loops: HashMap::new(),
            window_state: WindowTuner::new(&tuner),
            window_start: Instant::now(),
            window_cpu: program_cpu,
            faults_on_program_threads,
            window_faults: 0,
            window_fault_time: Duration::ZERO,
            window_fetched: 0,
            window_streamed: 0,
            window_written: 0,
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
        // A trial window is shorter, in time and in faults: a size that turns out slower costs
        // less of the program's time (`tune/window.rs`, "Cost"). A floor of the home window's
        // faults held HPC Challenge's trials at 512 KiB (4 MiB local) for 0.16–0.18 s, 64 faults
        // of 35 MB, in a run of 0.7 s.
        let (length, faults) = if self.window_state.trying() {
            (self.window / TRIAL_WINDOW_DIVISOR, MIN_WINDOW_FAULTS / TRIAL_WINDOW_DIVISOR as u64)
        } else {
            (self.window, MIN_WINDOW_FAULTS)
        };
        self.auto
            && self.active.is_none()
            && self.window_faults >= faults
            && now.duration_since(self.window_start) >= length
    }

    /// `bytes` requested from the memory servers; `streamed`: they continue a stream.
    pub fn fetched(&mut self, bytes: usize, streamed: bool) {
        self.window_fetched += bytes as u64;
        if streamed {
            self.window_streamed += bytes as u64;
        }
    }

    /// `bytes` written back to the memory servers.
    pub fn written(&mut self, bytes: usize) {
        self.window_written += bytes as u64;
    }

    /// Close the window: decide from what it touched and its cost; returns the new set count.
    /// `program_cpu`: the program's CPU time now, all its threads, the runtime's own thread not
    /// counted.
    pub fn close_window(&mut self, touched: &Touched, now: Instant, program_cpu: Duration) -> u32 {
        let mut d = self.window_state.on_window(&self.tuner, touched, self.window_cost(now, program_cpu), WINDOW_ID);
        d.window = Some(WindowSeen {
            seconds: now.duration_since(self.window_start).as_secs_f64(),
            faults: self.window_faults,
            fetched_bytes: self.window_fetched,
        });
        self.log(d);
        self.reset_window(now, program_cpu);
        self.window_state.set()
    }

    /// The window now closing: wall seconds per second of the program's work, and per GB
    /// streamed if it was a stream.
    fn window_cost(&self, now: Instant, program_cpu: Duration) -> Cost {
        let wall = now.duration_since(self.window_start).as_secs_f64();
        let mut work = program_cpu.saturating_sub(self.window_cpu);
        if self.faults_on_program_threads {
            work = work.saturating_sub(self.window_fault_time);
        }
        // A program that hardly ran (it sleeps, or waits for input) says little: bounded.
        let per_cpu = wall / work.as_secs_f64().max(wall * 1e-3).max(1e-9);
        Cost::of_window(wall, per_cpu, self.window_fetched, self.window_streamed, self.window_written)
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

    pub fn reset_window(&mut self, now: Instant, program_cpu: Duration) {
        self.window_start = now;
        self.window_cpu = program_cpu;
        self.window_faults = 0;
        self.window_fault_time = Duration::ZERO;
        self.window_fetched = 0;
        self.window_streamed = 0;
        self.window_written = 0;
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
        let mut m = Measure::new(t, true, Duration::from_millis(10), false, Duration::from_secs(1));
        let start = m.window_start;
        for _ in 0..MIN_WINDOW_FAULTS - 1 {
            assert!(!m.fault(Duration::from_micros(5), start + Duration::from_millis(20)));
        }
        assert!(m.fault(Duration::from_micros(5), start + Duration::from_millis(20)));
        // The window tuner starts in the middle (set 4 of 1..8), measures the program's start
        // and then its home, and with touched units that do not fit looks down first, by a
        // jump (to set 1).
        assert_eq!(m.window_state.set(), 4);
        let mut touched = Touched::default();
        touched.units[..4].copy_from_slice(&[40, 40, 40, 100]);
        let ms = Duration::from_millis;
        assert_eq!(m.close_window(&touched, start + ms(20), ms(1005)), 4);
        assert_eq!(m.close_window(&touched, start + ms(40), ms(1010)), 1);
        // The trial window closes after a quarter of a window and a quarter of the faults.
        for _ in 0..MIN_WINDOW_FAULTS {
            assert!(!m.fault(Duration::from_micros(5), start + ms(42)));
        }
        assert!(m.fault(Duration::from_micros(5), start + ms(43)));
        m.reset_window(start + ms(40), ms(1010));
        for _ in 0..MIN_WINDOW_FAULTS / TRIAL_WINDOW_DIVISOR as u64 - 1 {
            assert!(!m.fault(Duration::from_micros(5), start + ms(50)));
        }
        assert!(m.fault(Duration::from_micros(5), start + ms(50)));
        assert_eq!(m.decisions.len(), 2);
        assert_eq!(m.decisions[0].loop_id, WINDOW_ID);
        // Each window's decision says how long it was and what it saw.
        let seen = m.decisions[0].window.expect("a window's decision");
        assert_eq!((seen.faults, seen.fetched_bytes), (MIN_WINDOW_FAULTS, 0));
        assert!((seen.seconds - 0.020).abs() < 1e-9, "{seen:?}");
        m.reset_window(start + ms(40), ms(1010));
        // Cost: wall per CPU second of the program: 20 ms for 5 ms of work.
        assert!((m.decisions[0].loop_time - 4.0).abs() < 1e-9, "{:?}", m.decisions[0]);
        assert_eq!(m.window_faults, 0);
        // Under SIGBUS the faults' own time is taken out of the program's: 20 ms of CPU of
        // which 10 ms served faults.
        let mut m = Measure::new(t, true, ms(10), true, Duration::ZERO);
        let start = m.window_start;
        for _ in 0..MIN_WINDOW_FAULTS {
            m.fault(Duration::from_micros(10_000 / MIN_WINDOW_FAULTS), start + ms(20));
        }
        m.close_window(&touched, start + ms(20), ms(20));
        assert!((m.decisions[0].loop_time - 2.0).abs() < 0.01, "{:?}", m.decisions[0]);
        // A window in which the program hardly ran has a bounded cost.
        m.close_window(&touched, start + ms(40), ms(20));
        assert!((m.decisions[1].loop_time - 1000.0).abs() < 1e-6, "{:?}", m.decisions[1]);
        // While a loop is measured, windows never close.
        m.active = Some((3, start));
        for _ in 0..2 * MIN_WINDOW_FAULTS {
            assert!(!m.fault(Duration::ZERO, start + Duration::from_secs(1)));
        }
    }

    #[test]
    fn a_window_that_streamed_is_measured_by_its_bytes_and_looks_up_first() {
        let t = TunerConfig { base_page: 4096, local_mem: 64 * 4096, min_set: 1, max_set: 8 };
        let ms = Duration::from_millis;
        let mut m = Measure::new(t, true, ms(10), false, Duration::ZERO);
        let start = m.window_start;
        // What the windows touch does not fit: without a stream the first look is down.
        let mut touched = Touched::default();
        touched.units[..4].copy_from_slice(&[40, 40, 40, 100]);
        assert_eq!(m.close_window(&touched, start + ms(20), ms(5)), 4);
        // 90% of 1 MB continued a stream: the first look up, by the longest jump (to 8, where
        // the range ends).
        m.fetched(900_000, true);
        m.fetched(100_000, false);
        m.written(100_000);
        assert_eq!(m.close_window(&touched, start + ms(40), ms(10)), 8);
        // The decision logs the CPU measure: 20 ms for 5 ms of work; and the stream measure,
        // 20 ms for 900 kB streamed and 100 kB written back: 20 s per GB.
        assert!((m.decisions[1].loop_time - 4.0).abs() < 1e-9, "{:?}", m.decisions[1]);
        assert!((m.decisions[1].seconds_per_streamed_gb.expect("a stream") - 20.0).abs() < 1e-9);
        assert_eq!(m.decisions[1].window.map(|w| w.fetched_bytes), Some(1_000_000));
        // The next window counts afresh.
        assert_eq!((m.window_fetched, m.window_streamed, m.window_written), (0, 0, 0));
    }
}
