//! The page-size tuner of an unmodified program (`pagewise run --page-size auto`): windows of
//! time instead of `dlm_start`/`dlm_end` loops. Pure: the runtime passes in each window's cost
//! (`measure.rs`) and what it touched.
//!
//! # What a window measures
//! A window has no fixed amount of work, so its wall time alone says nothing. Its cost is its
//! wall time per second of the *program's own* CPU time (the process's CPU clock less the
//! runtime's: its handler thread, or the faults served on the program's threads): how many
//! seconds the program needs for a second of its work at this size. The program's CPU time is
//! exact (the scheduler's clock, not tick samples) and paging does not inflate it, so the cost
//! grows with everything paging costs — the handler's time, the wake-ups and context switches
//! around each fault, a CPU left idle while a reply is on its way.
//!
//! The share of the window spent in the handler, used before, misses exactly those costs: GNU
//! sort at 25% local memory spent 61–85% of every window in faults at every size from 32 KiB
//! to 128 KiB (sizes whose run times differ 1.6×), so the tuner could not tell them apart and
//! wandered (issue 22: auto 1.61× the best fixed size). Its cost per window is 20–90.
//!
//! # Why not the loop rule
//! The loop rule (`tune.rs`) shrinks the unit until what a loop touches fits in local memory.
//! A window is not a loop: a program that sweeps arrays larger than local memory touches more
//! than fits at *every* size, so the rule drove it to the smallest unit — where a sweep is
//! slowest — and locked it there. What fits says little about what is fast; the program's own
//! time does.
//!
//! # The rule: paired trials, kept only if measured faster
//! The tuner holds a *home* size. A trial alternates single windows: home, trial, home, trial,
//! home. Each trial window is compared with the home windows on both sides of it: a program
//! drifting between phases moves both, so a drift is not mistaken for a better size, and two
//! pairs give two independent looks. A pair says faster only when the trial beat *each* home
//! window beside it, slower only when it lost to each: a phase that changes at the trial window
//! moves one of them alone. Against their geometric mean, one pair of numpy-stream (home 1.23 s
//! per GB, trial at 512 KiB 0.47, home 0.47) said "clearly faster"; the search then went on down
//! through 128 and 256 KiB and the run took 3.0–3.3 s where the runs that stayed at 1 MiB took
//! 1.9–2.0.
//! - One pair decides at once when it is clear ([`CLEARLY_BETTER`], [`CLEARLY_WORSE`]): large
//!   differences, the ones worth most, cost three windows.
//! - Otherwise the trial becomes home when both pairs say faster and the geometric mean of
//!   their ratios (each against the mean of its homes) by more than [`BETTER_BY`].
//!
//! Sizes are tried by jumps: the first look in each direction is [`FIRST_JUMP`] steps (×4), so
//! far sizes are reached in few trials and the differences measured are large. A jump that was
//! not faster is followed by a single step the same way, or, when it was clearly slower, by a
//! jump the other way at once (the cost is unimodal in the size, as far as these programs
//! show). A trial that won is followed at once by another jump the same way, a step longer (up
//! to [`MAX_JUMP`]): while it wins the search widens, so a home a phase of the program left far
//! from its best size gets there in a few trials. Python building a 1.5 M-entry dict and then
//! reading it in key order (290 MB, 64 MiB local) is fastest at 4 KiB; the window tuner,
//! having grown the unit to 256 KiB while the dict was being built, came back down one step per
//! win, through windows 2–12× slower, and ended 1.6× the fixed 4 KiB's time. When single steps
//! both ways have lost, the home is settled and trials thin out (the wait doubles up to
//! [`MAX_SETTLE_WINDOWS`]): a phase change later can still move it, at a small cost. A search
//! that reaches the end of the range turns around by a single step: a jump back would land on
//! the size home has just won against (a sweep that won at 1 MiB from 64 KiB tried 64 KiB next).
//!
//! Sizes whose units fit fewer than [`MIN_ROOM_UNITS`] times in local memory are never tried:
//! with four units, every program here thrashed (HPC Challenge, numpy and GNU sort at 4 MiB
//! with 1 MiB units: over their budget of 10 s, against 0.7, 0.5 and 6 s at their best
//! sizes), and one trial window of 64 faults turned local memory over 16 times. With eight,
//! the worst was 1.6× the best size (HPC Challenge at 512 KiB), still a measure; a sweep at
//! 15 MiB is fastest with 1 MiB units, 15 of them.
//!
//! Which way to look first comes from the first measured window: up from a stream (below);
//! else, if the units it touched fit in local memory at the home size, reuse is kept and a
//! larger unit may fetch more per fault — look up; if not, look down first. The start is the
//! middle of the range (log scale). (Counted per fault, continuing a stream is no guide:
//! numpy's sweeps, fastest at 1 MiB, continued one in 23% of their faults, HPC Challenge,
//! fastest at 64 KiB, in 54%. Counted in bytes, read-ahead included, it is the measure below.)
//!
//! # Sweeps: a second measure
//! When paging dominates a window, the program's CPU time is mostly the kernel's work on its
//! own faults (entering, sleeping, waking): wall time per CPU second then becomes the time of
//! one fault over its kernel cost, whatever the number of faults, and the smallest unit looks
//! cheapest. For a program with reuse that happens to be right (GNU sort at 2 of its 13 MiB:
//! its work is 0.05 s of 0.53 s of CPU time, and 4 KiB its fastest size); for a sweep it is
//! wrong (numpy widening a 16 MB file at 15 MiB local: fastest at 1 MiB, 0.66 s, where the tuner
//! settled at 4 KiB and took 1.6–1.9 s). No estimate of the faults' kernel time is close enough
//! to take it out: sort's own work is 1% of its CPU time.
//!
//! A sweep has a measure of its own: the bytes it moves. Where enough of a window's fetched
//! bytes ([`STREAM_SHARE`]) continued a stream (a fault on the unit after the last one, or on
//! read-ahead), the program moves through what is fetched, and its cost is wall time per byte
//! streamed in or written back. Written bytes count because a sweep's phases differ in them: a
//! widening copy writes 8 bytes for each one it reads, a sum writes none. Per byte streamed
//! alone, numpy-stream's home windows in a row cost 0.9–3.2 s per GB; counting what they wrote
//! back, 0.7–1.5. A trial that was a stream is compared by that measure with the home windows
//! beside it that were streams too; otherwise by the CPU measure. Each pair's ratio is
//! unitless, so the two may mix across pairs. Random fetches never count as a stream: sort's
//! windows streamed 0–10% of their bytes and keep the CPU measure; numpy's sweeps 72–98%, and
//! numpy's FFT, matrix multiply and sort 48–55% (several arrays at once, some read backwards),
//! fastest at 1 MiB too (0.62 s at 18 MiB local, 0.72 at 64 KiB, 1.1 at 16 KiB): at a share of
//! 60% the CPU measure sent them down.
//!
//! The burden of proof is the other way round for a larger unit on a sweep: it fetches the
//! same bytes in fewer faults, so a trial judged by bytes streamed is kept unless clearly
//! slower ([`CLEARLY_WORSE`]; if it evicts what the program still needs, its fetches stop
//! continuing streams and it is judged by CPU time). A sweep's cost per byte moves with its
//! phases: numpy-stream's windows at 64 KiB cost 0.49–1.15 s per GB in one run, where a
//! first look at 1 MiB measured 1.13× and 1.28× in its two pairs and the run stayed at 64 KiB
//! (a size 1.4× slower than 1 MiB on this program). With a margin of 6% `auto` took 1.13× the
//! best fixed size on numpy-stream at 151 MiB, with this one 1.10× (medians of 8). For the
//! same reason a pair judged by bytes streamed never turns the search around by itself: one
//! dear look at 1 MiB sent it back down (1.2–1.5× the best size); a second pair is taken. And
//! the first look goes up, by the longest jump, when the window before it was a stream: the
//! largest units are where a sweep gains most. When the program's start already streamed,
//! that look is taken at once, without a home window measured first: the start's cost is
//! start-up, so the trial is judged by the window after it alone. A quick sweep spends
//! its first windows at the start size (numpy-stream at 79 MiB: 1.4× slower at 64 KiB than at
//! 1 MiB, in a program of a second); a window sooner at 1 MiB took the quick numpy-stream from
//! 1.21× the best fixed size to 1.08×, and numpy's FFT, multiply and sort from 1.20× to 1.07×
//! (medians of 10).
//!
//! # Cost
//! A trial is at most two windows at another size, each a quarter of a home window
//! ([`TRIAL_WINDOW_DIVISOR`]): programs of a second or less (HPC Challenge at 5% local memory,
//! numpy at 25%) have little to gain from another size and lost 20–28% of their time to full
//! length trials. A trial window needs a quarter of a home window's faults, too: at the home's
//! floor HPC Challenge's trials at 512 KiB (4 MiB local) lasted 0.16–0.18 s, 64 faults of
//! 35 MB, in a run of 0.7 s; with 16, 0.14 s of 11 MB, and `auto` went from 1.06× the fixed 64 KiB
//! to 0.96× (the median of 8 pairs' ratios). Once settled, one trial per [`MAX_SETTLE_WINDOWS`]
//! windows. Home only ever moves to a size measured faster, or, on a sweep, to a larger one not
//! measured clearly slower.

use super::{Decision, Reason, Touched, TunerConfig};

/// Mean paired ratio (trial / home) a trial must beat by this much to become home.
pub const BETTER_BY: f64 = 0.06;
/// One pair this much faster (ratio below) decides for the trial at once.
pub const CLEARLY_BETTER: f64 = 0.75;
/// One pair this much slower (ratio above) decides against it at once.
pub const CLEARLY_WORSE: f64 = 1.25;
/// The first look in a direction jumps this many steps (powers of two).
pub const FIRST_JUMP: u32 = 2;
/// The longest jump: each trial that wins makes the next jump the same way a step longer.
pub const MAX_JUMP: u32 = 4;
/// A trial window is this many times shorter than a window at home, and needs this many times
/// fewer faults (`measure::MIN_WINDOW_FAULTS`): a slower size costs the program less of its
/// time, and the paired comparison is of rates, which do not depend on the windows' lengths.
pub const TRIAL_WINDOW_DIVISOR: u32 = 4;
/// The longest wait at home between trials once settled.
pub const MAX_SETTLE_WINDOWS: u32 = 32;
/// A window is a stream when at least this share of the bytes it fetched continued a stream
/// (GNU sort's random fetches: 0–10%; numpy's work on several arrays at once: 48–55%).
pub const STREAM_SHARE: f64 = 0.4;
/// The largest size tried leaves room for this many units in local memory.
pub const MIN_ROOM_UNITS: usize = 8;

/// What one window cost at the size in force.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cost {
    /// Wall seconds per second of the program's own CPU time.
    pub per_cpu: f64,
    /// Wall seconds per GB streamed in or written back, when the window was a stream
    /// ([`STREAM_SHARE`]).
    pub per_streamed_gb: Option<f64>,
}

impl Cost {
    /// No measure: the program's start, whose cost is start-up, not the size.
    const UNMEASURED: Cost = Cost { per_cpu: f64::NAN, per_streamed_gb: None };

    /// A window of `wall` seconds with `cost_per_cpu` (wall per CPU second) that fetched
    /// `fetched` bytes, `streamed` of them continuing a stream, and wrote `written` back.
    pub fn of_window(wall: f64, cost_per_cpu: f64, fetched: u64, streamed: u64, written: u64) -> Cost {
        let stream = fetched > 0 && streamed as f64 >= STREAM_SHARE * fetched as f64;
        Cost { per_cpu: cost_per_cpu, per_streamed_gb: stream.then(|| wall / ((streamed + written) as f64 / 1e9)) }
    }

    /// The trial `self` against the home windows around it. By the stream measure when the
    /// trial was a stream and a home window beside it was (against that one alone if only one
    /// was: the CPU measure is no guide to a sweep), else by the CPU one; against the home after
    /// alone when the one before has no measure. Square roots only: the runtime needs no libm
    /// (one library less in every process).
    fn ratio(&self, before: &Cost, after: &Cost) -> Ratio {
        let (t, b, a, judged) = match (self.per_streamed_gb, before.per_streamed_gb, after.per_streamed_gb) {
            // No measure before (the program's start): the window after alone.
            (Some(t), _, Some(home)) if !before.valid() => (t, home, home, Judged::ByStream),
            _ if !before.valid() => (self.per_cpu, after.per_cpu, after.per_cpu, Judged::ByCpu),
            (Some(t), Some(b), Some(a)) => (t, b, a, Judged::ByStream),
            (Some(t), Some(home), None) | (Some(t), None, Some(home)) => (t, home, home, Judged::ByStream),
            _ => (self.per_cpu, before.per_cpu, after.per_cpu, Judged::ByCpu),
        };
        let (by_before, by_after) = (t / b, t / a);
        Ratio {
            // As the product of roots, which stays finite for costs up to f64::MAX.
            mean: t / (b.sqrt() * a.sqrt()),
            lo: by_before.min(by_after),
            hi: by_before.max(by_after),
            judged,
        }
    }

    /// Whether the window measured anything (no program time, a clock that failed: not).
    fn valid(&self) -> bool {
        let ok = |c: f64| c.is_finite() && c > 0.0;
        ok(self.per_cpu) && self.per_streamed_gb.is_none_or(ok)
    }
}

/// One pair: the trial window against the home windows before and after it.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Ratio {
    /// Over the geometric mean of the two (a steady drift between phases moves both).
    mean: f64,
    /// Over the dearer and the cheaper of the two: faster than both, slower than both (a
    /// phase that begins at the trial window moves one home window only: the module doc).
    lo: f64,
    hi: f64,
    judged: Judged,
}

/// Which measure compared a pair.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Judged {
    ByCpu,
    ByStream,
}

#[cfg(test)]
impl From<f64> for Cost {
    /// A cost by the CPU measure only (the tests' windows).
    fn from(per_cpu: f64) -> Cost {
        Cost { per_cpu, per_streamed_gb: None }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    /// At home, `left` windows before the next trial.
    Home { left: u32 },
    /// A trial window at `set`, after a home window of cost `before`.
    Trial { set: u32, before: Cost, pairs: Pairs },
    /// The home window after a trial window at `set` of cost `trial`.
    Back { set: u32, before: Cost, trial: Cost, pairs: Pairs },
}

/// The pairs of a trial measured so far.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Pairs {
    count: u32,
    /// The product of their ratios (trial / home).
    product: f64,
    /// Whether each said faster than both home windows beside it.
    all_faster: bool,
    /// Whether each was judged by bytes streamed.
    all_streams: bool,
}

impl Pairs {
    const NONE: Pairs = Pairs { count: 0, product: 1.0, all_faster: true, all_streams: true };

    fn and(self, r: Ratio) -> Pairs {
        Pairs {
            count: self.count + 1,
            product: self.product * r.mean,
            all_faster: self.all_faster && r.hi < 1.0,
            all_streams: self.all_streams && r.judged == Judged::ByStream,
        }
    }

    /// The geometric mean of their ratios (square roots only: at most two pairs).
    fn mean(&self) -> f64 {
        debug_assert!((1..=2).contains(&self.count));
        if self.count == 1 {
            self.product
        } else {
            self.product.sqrt()
        }
    }
}

/// The state of the window tuner.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WindowTuner {
    /// The settled size (set count).
    pub home: u32,
    phase: Phase,
    /// Direction of the next trial: smaller (true) or larger.
    down: bool,
    /// Steps (log2) of the next trial's jump.
    jump: u32,
    /// Whether the first look's direction has been chosen.
    looked: bool,
    /// Directions that found nothing better at a single step, in a row (0, 1 or 2).
    misses: u32,
    /// Windows to wait at home before the next trial once settled.
    settle: u32,
    iterations: u32,
}

impl WindowTuner {
    /// Start in the middle of the candidate sizes (log scale), or at the largest with room.
    pub fn new(cfg: &TunerConfig) -> Self {
        let c: Vec<u32> = cfg.candidates().collect();
        let home = c[c.len() / 2].min(largest_with_room(cfg));
        WindowTuner {
            home,
            // The first window is the program's start: not a measure of the size.
            phase: Phase::Home { left: 2 },
            down: false,
            jump: FIRST_JUMP,
            looked: false,
            misses: 0,
            settle: 1,
            iterations: 0,
        }
    }

    /// Whether a trial window is running (another size than home in force).
    pub fn trying(&self) -> bool {
        matches!(self.phase, Phase::Trial { .. })
    }

    /// The set count in force now.
    pub fn set(&self) -> u32 {
        match self.phase {
            Phase::Trial { set, .. } => set,
            _ => self.home,
        }
    }

    /// A window closed: at the size in force it cost `cost` and touched `touched`. Returns the
    /// decision (its `new_size` is in force from now on).
    pub fn on_window(&mut self, cfg: &TunerConfig, touched: &Touched, cost: Cost, loop_id: u64) -> Decision {
        let cur = self.set();
        // A window with no measure says nothing: a pair whose trial or home after has none is
        // void, and the trial is made again; one whose home before has none is judged by the
        // home after alone.
        let (next, reason) = match self.phase {
            Phase::Home { left } if left > 1 && !self.looked && cost.per_streamed_gb.is_some() => {
                // The program's start streamed: up at once by the longest jump. Its cost
                // measures the start-up, not the size: the trial is compared with the window
                // after it alone.
                self.looked = true;
                self.down = false;
                self.jump = MAX_JUMP;
                self.start_trial(cfg, Cost::UNMEASURED)
            }
            Phase::Home { left } if left > 1 => {
                self.phase = Phase::Home { left: left - 1 };
                (self.home, Reason::Settled)
            }
            Phase::Home { .. } => {
                if !self.looked {
                    // First look: from a stream, up by the longest jump (a sweep gains most at
                    // the largest unit); else down if what the window touched does not fit.
                    self.looked = true;
                    let stream = cost.per_streamed_gb.is_some();
                    self.down = !stream && touched.at(self.home) > cfg.local_units(self.home);
                    if stream {
                        self.jump = MAX_JUMP;
                    }
                }
                self.start_trial(cfg, cost)
            }
            Phase::Trial { set, before, pairs } => {
                self.phase = Phase::Back { set, before, trial: cost, pairs };
                (self.home, Reason::Explore)
            }
            Phase::Back { .. } if !cost.valid() => {
                self.phase = Phase::Home { left: 1 };
                (self.home, Reason::Explore)
            }
            Phase::Back { set, trial, .. } if !trial.valid() => {
                self.phase = Phase::Trial { set, before: cost, pairs: Pairs::NONE };
                (set, Reason::Explore)
            }
            Phase::Back { set, before, trial, pairs } => {
                let r = trial.ratio(&before, &cost);
                let pairs = pairs.and(r);
                // At most two pairs: the second decides. A sweep at a larger unit fetches the
                // same bytes in fewer faults: judged by bytes streamed, it is kept unless
                // clearly slower.
                let second = pairs.count == 2;
                let faster = (second && pairs.all_faster && pairs.mean() < 1.0 - BETTER_BY)
                    || (pairs.all_streams && set > self.home && pairs.mean() < CLEARLY_WORSE);
                if (pairs.count == 1 && r.hi < CLEARLY_BETTER) || faster {
                    // Faster: it is home now; jump on the same way at once, further.
                    self.home = set;
                    self.jump = (self.jump + 1).min(MAX_JUMP);
                    self.misses = 0;
                    self.settle = 1;
                    self.phase = Phase::Home { left: 1 };
                    (set, Reason::Better)
                } else if pairs.count == 1 && (r.lo <= CLEARLY_WORSE || r.judged == Judged::ByStream) {
                    // Not clear yet: a second pair, this window its home before. A sweep's cost
                    // per byte moves with its phases (a widening copy writes 8 bytes for each
                    // one read, a sum reads them all): one pair never turns its search around.
                    self.phase = Phase::Trial { set, before: cost, pairs };
                    (set, Reason::Explore)
                } else {
                    self.lost(cfg, cost, r.lo > CLEARLY_WORSE)
                }
            }
        };
        let d = Decision {
            loop_id,
            iteration: self.iterations,
            working_set: touched.at(cur),
            local_units: cfg.local_units(cur),
            old_size: cur as usize * cfg.base_page,
            new_size: next as usize * cfg.base_page,
            loop_time: cost.per_cpu,
            seconds_per_streamed_gb: cost.per_streamed_gb,
            window: None,
            reason,
        };
        self.iterations += 1;
        d
    }

    /// Try the size a jump away (this window, of cost `home_cost`, is the trial's home before).
    fn start_trial(&mut self, cfg: &TunerConfig, home_cost: Cost) -> (u32, Reason) {
        match self.target(cfg) {
            Some(set) => {
                self.phase = Phase::Trial { set, before: home_cost, pairs: Pairs::NONE };
                (set, Reason::Explore)
            }
            None => {
                self.phase = Phase::Home { left: self.settle.max(1) };
                (self.home, Reason::Settled)
            }
        }
    }

    /// A trial lost (this home window cost `home_cost`): after a jump that was not clearly
    /// slower, a single step the same way; else the other direction, tried at once from this
    /// window. Both directions lost (or the other has no room): settled, trials thin out.
    fn lost(&mut self, cfg: &TunerConfig, home_cost: Cost, clearly: bool) -> (u32, Reason) {
        if self.jump > 1 && !clearly {
            self.jump -= 1;
        } else {
            self.misses += 1;
            self.down = !self.down;
            // The other way, with a jump unless settled once already.
            self.jump = if self.settle == 1 { FIRST_JUMP } else { 1 };
            if self.misses >= 2 || self.target_towards(cfg, self.down).is_none() {
                self.misses = 0;
                self.jump = 1;
                self.settle = (self.settle * 2).clamp(4, MAX_SETTLE_WINDOWS);
                self.phase = Phase::Home { left: self.settle };
                return (self.home, Reason::Worse);
            }
        }
        let (next, _) = self.start_trial(cfg, home_cost);
        (next, Reason::Worse)
    }

    /// The size to try: `jump` steps from home in the current direction, clamped to the range;
    /// a direction with no room turns around by a single step (a jump back would most often
    /// land on the size home just won against). `None` when there is only one size.
    fn target(&mut self, cfg: &TunerConfig) -> Option<u32> {
        if let Some(t) = self.target_towards(cfg, self.down) {
            return Some(t);
        }
        self.down = !self.down;
        self.jump = 1;
        self.target_towards(cfg, self.down)
    }

    /// `jump` steps from home down or up, clamped to the range; `None` at its end.
    fn target_towards(&self, cfg: &TunerConfig, down: bool) -> Option<u32> {
        let t = if down {
            (self.home >> self.jump).max(cfg.min_set)
        } else {
            self.home.saturating_mul(1 << self.jump).min(largest_with_room(cfg))
        };
        (t != self.home).then_some(t)
    }
}

/// The largest candidate size whose units fit [`MIN_ROOM_UNITS`] times in local memory (the
/// smallest candidate if none does).
fn largest_with_room(cfg: &TunerConfig) -> u32 {
    cfg.candidates().filter(|&s| cfg.local_units(s) >= MIN_ROOM_UNITS).last().unwrap_or(cfg.min_set)
}

#[cfg(test)]
mod tests;
