//! The page-size tuner: a pure policy over what one measured loop (or window) fetched and how
//! long it took. No I/O, no clock: the runtime passes both in (`measure.rs`).
//!
//! # The rule (seed 003, improved)
//! At the end of a measured loop, the runtime knows, for every base page, whether the loop
//! faulted on it. From that it counts, for each candidate unit size, how many units of that
//! size the loop touched; units of size s that fit locally are `local_mem / s`.
//! - **Fits: keep.** The loop's touched units at the current size fit: the size stays.
//! - **Does not fit: shrink in one step** to the largest smaller size whose touched units fit
//!   (the seed's one-shot rule estimates from the current count alone; the per-page record
//!   gives each size its own count), bounded below by the minimum size.
//! - **Slower after a change: go back and stay.** From the second end on, a change is judged
//!   by the loop's next time: if it is slower than the loop before the change (beyond a small
//!   tolerance for noise), the loop goes back to the fastest larger size it has run a whole
//!   loop at — not merely the last one: steps each slower by less than the tolerance add up
//!   (the solver at 50% went 64 → 32 → 16 KiB, 16 KiB was clearly slower and the loop was
//!   pinned at 32 KiB, 1.18× the time of 64 KiB) — and the loop's size is pinned. Not when
//!   the shrink made the loop fit and the larger size would not: that size would thrash, and
//!   the slowdown has another cause. Windows of an unmodified program ([`LoopState::windows`])
//!   never go back to a size that does not fit what the window touched: two windows are often
//!   different phases of the program, so their times say little about the sizes, and a window
//!   of a new phase once pinned a program to a thrashing 128 KiB for good (dlm-vs-swap). A loop
//!   that fits at no size (a sweep over more than local memory) is judged by its time alone —
//!   the seed's BT at 50% is fastest at 64 KiB, which no size fits.
//! - **Thrashing now: shrink now** ([`decide_early`]). A loop that faulted more than twice its
//!   local units since it started is refetching what it evicted; waiting for its end at a far
//!   too large size can take orders of magnitude longer than the loop should (seed: BT at 5%,
//!   128 KB), so the same shrink rule is applied mid-loop. Only shrinks, so settling holds.
//!
//! # Why it settles
//! Without a revert the size only shrinks, and there are `log2(max / min)` smaller sizes; a
//! revert pins the size for good. So a loop changes size at most `log2(max / min) + 1` times
//! and never oscillates (`tests::settles_without_oscillation` checks this over arbitrary
//! measurement sequences). The price: a loop whose working set grows later keeps a pinned size.

use serde::Serialize;

pub mod window;
pub use window::WindowTuner;

/// Candidate set counts: powers of two, so at most 32.
pub const MAX_CANDIDATES: usize = 32;

/// A change that made the loop slower by more than this fraction is undone.
pub const SLOWER_TOLERANCE: f64 = 0.05;

/// The fixed parameters of the policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TunerConfig {
    /// Base page B in bytes.
    pub base_page: usize,
    /// Local memory limit in bytes.
    pub local_mem: usize,
    /// Smallest and largest set counts (powers of two, min ≤ max).
    pub min_set: u32,
    pub max_set: u32,
}

impl TunerConfig {
    /// Units of `set` base pages that fit in local memory.
    pub fn local_units(&self, set: u32) -> usize {
        self.local_mem / (self.base_page * set as usize)
    }

    /// The candidate set counts, smallest first.
    pub fn candidates(&self) -> impl Iterator<Item = u32> {
        let (min, max) = (self.min_set, self.max_set);
        (0..32u32).map(|k| 1u32 << k).filter(move |&s| s >= min && s <= max)
    }
}

/// What one loop iteration (or window) touched: for each candidate set count, the number of
/// distinct units of that size it faulted on. Fixed size, so it can be built on a fault path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Touched {
    /// `units[k]`: units of set count `1 << k`.
    pub units: [usize; MAX_CANDIDATES],
}

impl Touched {
    pub fn at(&self, set: u32) -> usize {
        self.units[set.trailing_zeros() as usize]
    }

    /// Count, for each power-of-two set count up to `max_set`, the distinct aligned units that
    /// hold at least one marked page of `marked` (bit p: base page p).
    pub fn add_bitmap(&mut self, marked: &[u64], pages: usize, max_set: u32) {
        let mut set = 1u32;
        while set <= max_set {
            let s = set as usize;
            let mut n = 0usize;
            let mut first = 0usize;
            while first < pages {
                let end = (first + s).min(pages);
                if any_marked(marked, first, end) {
                    n += 1;
                }
                first = end;
            }
            self.units[set.trailing_zeros() as usize] += n;
            set *= 2;
        }
    }
}

/// Whether any bit in [from, to) of `bits` is set.
fn any_marked(bits: &[u64], from: usize, to: usize) -> bool {
    let mut p = from;
    while p < to {
        let (w, b) = (p / 64, p % 64);
        if b == 0 && to - p >= 64 {
            if bits[w] != 0 {
                return true;
            }
            p += 64;
        } else {
            if bits[w] >> b & 1 != 0 {
                return true;
            }
            p += 1;
        }
    }
    false
}

/// Why the size is what it is after a decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// The touched units fit at the current size.
    Fits,
    /// They did not: shrunk to the largest size whose touched units fit.
    Shrink,
    /// They did not fit even at the smallest size: shrunk to it (or stayed there).
    Floor,
    /// The last change made the loop slower: back to the fastest larger size measured, pinned.
    Revert,
    /// Pinned by an earlier revert.
    Pinned,
    /// Windows (`window.rs`): trying a neighbouring size, or back home after trying it.
    Explore,
    /// Windows: the size tried was faster; it is home now.
    Better,
    /// Windows: the size tried was not faster; back home.
    Worse,
    /// Windows: staying home until the next trial.
    Settled,
}

/// One decision, as the seed's per-iteration table shows it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Decision {
    /// The loop id (`u64::MAX`: a tuning window of a program without start/end).
    pub loop_id: u64,
    /// The loop's iteration (0-based count of its ends).
    pub iteration: u32,
    /// Distinct units of the old size the loop faulted on (the seed's "working set").
    pub working_set: usize,
    /// Units of the old size that fit locally.
    pub local_units: usize,
    /// Unit sizes in bytes.
    pub old_size: usize,
    pub new_size: usize,
    /// The loop's time in seconds (windows: the window's wall seconds per second of the
    /// program's CPU time, `tune/window.rs`).
    pub loop_time: f64,
    /// Windows that were a stream: wall seconds per GB streamed in or written back, the
    /// measure a sweep is judged by (`tune/window.rs`, "Sweeps"); `None` otherwise.
    pub seconds_per_streamed_gb: Option<f64>,
    /// Windows: how long the window was and what it moved (set by the runtime, which clocks
    /// it); `None` for loops.
    pub window: Option<WindowSeen>,
    pub reason: Reason,
}

/// What one tuning window saw.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct WindowSeen {
    /// Wall seconds.
    pub seconds: f64,
    pub faults: u64,
    /// Bytes fetched or zero-filled (demand and read-ahead).
    pub fetched_bytes: u64,
}

/// One loop's history: its size and what the last change was.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoopState {
    /// The set count the loop runs at.
    pub set: u32,
    pub iterations: u32,
    /// The last decision changed the size, after a loop of this time.
    changed_after: Option<f64>,
    /// The last whole loop's time at each set count (`times[k]`: set count `1 << k`; 0: none).
    times: [f64; MAX_CANDIDATES],
    /// The running loop changed size midway (`decide_early`): its time is no size's.
    mixed: bool,
    pinned: bool,
    /// Tuning windows of an unmodified program, not a loop: a revert needs the larger size to fit.
    windows: bool,
}

impl LoopState {
    pub fn new(set: u32) -> Self {
        LoopState {
            set,
            iterations: 0,
            changed_after: None,
            times: [0.0; MAX_CANDIDATES],
            mixed: false,
            pinned: false,
            windows: false,
        }
    }

    /// The state of the tuning windows of a program without `dlm_start`/`dlm_end`.
    pub fn windows(set: u32) -> Self {
        LoopState { windows: true, ..Self::new(set) }
    }

    pub fn pinned(&self) -> bool {
        self.pinned
    }
}

/// Decide the loop's next set count from what it touched and its time; updates `state`.
pub fn decide(cfg: &TunerConfig, state: &mut LoopState, touched: &Touched, time: f64, loop_id: u64) -> Decision {
    let cur = state.set;
    if !std::mem::take(&mut state.mixed) {
        state.times[cur.trailing_zeros() as usize] = time;
    }
    let fits = |s: u32| touched.at(s) <= cfg.local_units(s);
    let (new, reason) = if let Some(before) = state.changed_after.filter(|_| !state.pinned) {
        let thrashes_if_back = |to: u32| !fits(to) && (fits(cur) || state.windows);
        let back = if time > before * (1.0 + SLOWER_TOLERANCE) {
            fastest_larger(state, cur, |to| !thrashes_if_back(to))
        } else {
            None
        };
        match back {
            Some(to) => (to, Reason::Revert),
            None => shrink_rule(cfg, cur, &fits),
        }
    } else if state.pinned {
        (cur, Reason::Pinned)
    } else {
        shrink_rule(cfg, cur, &fits)
    };
    if reason == Reason::Revert {
        state.pinned = true;
    }
    state.changed_after = (new != cur && reason != Reason::Revert).then_some(time);
    let d = Decision {
        loop_id,
        iteration: state.iterations,
        working_set: touched.at(cur),
        local_units: cfg.local_units(cur),
        old_size: cur as usize * cfg.base_page,
        new_size: new as usize * cfg.base_page,
        loop_time: time,
        seconds_per_streamed_gb: None,
        window: None,
        reason,
    };
    state.set = new;
    state.iterations += 1;
    d
}

/// A decision in the middle of a loop that is visibly thrashing (it faulted more than twice
/// its local units since it started, so it refetches what it evicted): shrink now by the same
/// rule instead of waiting for `dlm_end`, which at a far too large size may be hours away
/// (the seed's 128 KB at 5%). Only shrinks, never on a pinned loop, and forgets the last
/// change (a partial loop's time says nothing to compare). `None`: nothing to do.
pub fn decide_early(
    cfg: &TunerConfig,
    state: &mut LoopState,
    touched: &Touched,
    time: f64,
    loop_id: u64,
) -> Option<Decision> {
    let cur = state.set;
    if state.pinned || touched.at(cur) <= cfg.local_units(cur) {
        return None;
    }
    let (new, reason) = shrink_rule(cfg, cur, &|s| touched.at(s) <= cfg.local_units(s));
    if new == cur {
        return None;
    }
    state.set = new;
    state.changed_after = None;
    state.mixed = true;
    Some(Decision {
        loop_id,
        iteration: state.iterations,
        working_set: touched.at(cur),
        local_units: cfg.local_units(cur),
        old_size: cur as usize * cfg.base_page,
        new_size: new as usize * cfg.base_page,
        loop_time: time,
        seconds_per_streamed_gb: None,
        window: None,
        reason,
    })
}

/// Of the set counts larger than `cur` that a whole loop ran at and `allowed` accepts, the one
/// whose last loop was fastest.
fn fastest_larger(state: &LoopState, cur: u32, allowed: impl Fn(u32) -> bool) -> Option<u32> {
    (cur.trailing_zeros() + 1..MAX_CANDIDATES as u32)
        .filter(|&k| state.times[k as usize] > 0.0 && allowed(1 << k))
        .min_by(|&a, &b| state.times[a as usize].total_cmp(&state.times[b as usize]))
        .map(|k| 1 << k)
}

fn shrink_rule(cfg: &TunerConfig, cur: u32, fits: &impl Fn(u32) -> bool) -> (u32, Reason) {
    if fits(cur) {
        return (cur, Reason::Fits);
    }
    match cfg.candidates().filter(|&s| s < cur && fits(s)).max() {
        Some(s) => (s, Reason::Shrink),
        None => (cfg.min_set.min(cur), Reason::Floor),
    }
}

fn kib(b: usize) -> String {
    if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{}MB", b >> 20)
    } else {
        format!("{}KB", b >> 10)
    }
}

/// The seed's per-iteration table: iteration, working set, local pages, old → new page size,
/// loop time.
pub fn format_table(decisions: &[Decision]) -> String {
    let mut s = String::from("| loop | it | working set | local pages | page size | loop time | why |\n");
    s.push_str("|---|---|---|---|---|---|---|\n");
    for d in decisions {
        let id = if d.loop_id == u64::MAX { "window".to_string() } else { d.loop_id.to_string() };
        let time = if d.loop_id == u64::MAX {
            match d.seconds_per_streamed_gb {
                Some(gb) => format!("{:.1} s per CPU s, {gb:.2} s per GB streamed", d.loop_time),
                None => format!("{:.1} s per CPU s", d.loop_time),
            }
        } else {
            format!("{:.3} s", d.loop_time)
        };
        s.push_str(&format!(
            "| {id} | {} | {} | {} | {} → {} | {time} | {:?} |\n",
            d.iteration,
            d.working_set,
            d.local_units,
            kib(d.old_size),
            kib(d.new_size),
            d.reason
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cfg() -> TunerConfig {
        // The seed's 50% case: 16 KiB base, 128 KiB largest unit, 152 MiB local.
        TunerConfig { base_page: 16 << 10, local_mem: 1216 * (128 << 10), min_set: 1, max_set: 8 }
    }

    fn sparse(units: usize) -> Touched {
        // Every touched unit of any size holds one touched base page far from the others.
        let mut t = Touched::default();
        for k in 0..4 {
            t.units[k] = units;
        }
        t
    }

    #[test]
    fn keeps_a_fitting_size_and_shrinks_one_step_to_what_fits() {
        let c = cfg();
        let mut st = LoopState::new(8);
        let d = decide(&c, &mut st, &sparse(1000), 10.0, 0);
        assert_eq!((d.reason, d.new_size, d.local_units), (Reason::Fits, 128 << 10, 1216));
        // The seed's iteration 0: 1280 touched vs 1216 local → 64 KiB (2432 local units).
        let d = decide(&c, &mut st, &sparse(1280), 10.0, 0);
        assert_eq!((d.reason, d.new_size, d.working_set), (Reason::Shrink, 64 << 10, 1280));
        assert_eq!(st.set, 4);
    }

    #[test]
    fn per_size_counts_pick_the_largest_fitting_size() {
        let c = cfg();
        // Dense access: halving the unit doubles the units touched, so only 16 KiB fits.
        let mut t = Touched::default();
        t.units[3] = 1300;
        t.units[2] = 2600;
        t.units[1] = 5200;
        t.units[0] = 9000;
        let mut st = LoopState::new(8);
        let d = decide(&c, &mut st, &t, 1.0, 7);
        assert_eq!((d.reason, d.new_size), (Reason::Shrink, 16 << 10));
        // Nothing fits: the floor.
        t.units[0] = 99_999;
        let mut st = LoopState::new(8);
        assert_eq!(decide(&c, &mut st, &t, 1.0, 7).reason, Reason::Floor);
        assert_eq!(st.set, 1);
    }

    #[test]
    fn a_slower_loop_after_a_change_reverts_and_pins() {
        let c = cfg();
        let mut st = LoopState::new(8);
        decide(&c, &mut st, &sparse(1280), 10.0, 0); // 128 → 64
        let d = decide(&c, &mut st, &sparse(1200), 12.0, 0); // slower, and 128 KiB fits: back
        assert_eq!((d.reason, d.old_size, d.new_size), (Reason::Revert, 64 << 10, 128 << 10));
        let d = decide(&c, &mut st, &sparse(5000), 50.0, 0);
        assert_eq!((d.reason, d.new_size), (Reason::Pinned, 128 << 10));
    }

    #[test]
    fn a_revert_goes_back_to_the_fastest_size_measured_not_the_last() {
        // The solver at 50%: each step within the tolerance of the last, until 16 KiB is
        // clearly slower: back to 64 KiB, the fastest, not to 32 KiB.
        let c = cfg();
        let mut st = LoopState::new(8);
        decide(&c, &mut st, &sparse(1280), 3.2, 0); // 128 → 64
        decide(&c, &mut st, &sparse(2500), 3.0, 0); // 64 → 32
        decide(&c, &mut st, &sparse(5000), 3.1, 0); // 32 → 16: 3% slower, within the tolerance
        let d = decide(&c, &mut st, &sparse(10_000), 5.0, 0);
        assert_eq!((d.reason, d.old_size, d.new_size), (Reason::Revert, 16 << 10, 64 << 10));
        assert!(st.pinned());
    }

    #[test]
    fn a_loop_that_changed_size_midway_measures_no_size() {
        let c = cfg();
        let mut st = LoopState::new(8);
        decide_early(&c, &mut st, &sparse(1280), 0.5, 0).expect("thrashing: 128 → 64 midway");
        decide(&c, &mut st, &sparse(2500), 1.0, 0); // 64 → 32 after a loop of both sizes

        // Much slower, but no larger size has run a whole loop: nothing to go back to.
        let d = decide(&c, &mut st, &sparse(5000), 9.0, 0);
        assert_eq!((d.reason, d.new_size), (Reason::Shrink, 16 << 10));
    }

    #[test]
    fn no_revert_of_windows_to_a_size_that_would_thrash() {
        // A program's windows: after 128 → 64 the next window is slower (a new phase), and
        // what it touched fits neither at 64 nor at 128 KiB: going back would thrash for good.
        let c = cfg();
        let mut st = LoopState::windows(8);
        decide(&c, &mut st, &sparse(1280), 0.2, u64::MAX); // 128 → 64
        let d = decide(&c, &mut st, &sparse(4000), 0.6, u64::MAX);
        assert_eq!((d.reason, d.old_size, d.new_size), (Reason::Shrink, 64 << 10, 32 << 10));
        assert!(!st.pinned());
    }

    #[test]
    fn a_loop_that_fits_nowhere_is_judged_by_its_time() {
        // The same record for a loop: no size fits, so the slower loop time decides.
        let c = cfg();
        let mut st = LoopState::new(8);
        decide(&c, &mut st, &sparse(1280), 0.2, 0); // 128 → 64
        let d = decide(&c, &mut st, &sparse(4000), 0.6, 0);
        assert_eq!((d.reason, d.new_size), (Reason::Revert, 128 << 10));
    }

    #[test]
    fn a_loop_that_fits_after_a_shrink_does_not_go_back_to_thrash() {
        let c = cfg();
        let mut st = LoopState::new(8);
        decide(&c, &mut st, &sparse(1280), 0.2, 0); // 128 → 64, which fits
        let d = decide(&c, &mut st, &sparse(2000), 0.6, 0); // slower, 64 still fits, 128 not
        assert_eq!((d.reason, d.new_size), (Reason::Fits, 64 << 10));
    }

    #[test]
    fn bitmap_counts_units_of_every_size() {
        // Pages 0, 1, 9 and 70 of 80.
        let mut bits = vec![0u64; 2];
        for p in [0usize, 1, 9, 70] {
            bits[p / 64] |= 1 << (p % 64);
        }
        let mut t = Touched::default();
        t.add_bitmap(&bits, 80, 64);
        assert_eq!(t.at(1), 4);
        assert_eq!(t.at(2), 3);
        assert_eq!(t.at(8), 3);
        assert_eq!(t.at(16), 2);
        assert_eq!(t.at(64), 2);
    }

    #[test]
    fn the_table_has_a_row_per_decision() {
        let c = cfg();
        let mut st = LoopState::new(8);
        let ds = [decide(&c, &mut st, &sparse(1280), 14.5, 0), decide(&c, &mut st, &sparse(2510), 1.0, 0)];
        let t = format_table(&ds);
        assert!(t.contains("| 0 | 0 | 1280 | 1216 | 128KB → 64KB | 14.500 s | Shrink |"), "{t}");
        assert!(t.contains("| 0 | 1 | 2510 | 2432 | 64KB → 32KB |"), "{t}");
        // A window's row gives its cost per CPU second, and per GB when it was a stream.
        let window = Decision { loop_id: u64::MAX, loop_time: 6.04, seconds_per_streamed_gb: Some(0.5), ..ds[0] };
        let t = format_table(&[window, Decision { seconds_per_streamed_gb: None, ..window }]);
        assert!(
            t.contains("| window | 0 | 1280 | 1216 | 128KB → 64KB | 6.0 s per CPU s, 0.50 s per GB streamed |"),
            "{t}"
        );
        assert!(t.contains("| 6.0 s per CPU s | Shrink |"), "{t}");
    }

    fn touched_strategy() -> impl Strategy<Value = Touched> {
        proptest::collection::vec(0usize..20_000, 8).prop_map(|v| {
            let mut t = Touched::default();
            t.units[..8].copy_from_slice(&v);
            t
        })
    }

    #[test]
    fn a_thrashing_loop_shrinks_early_and_only_down() {
        let c = cfg();
        let mut st = LoopState::new(8);
        assert!(decide_early(&c, &mut st, &sparse(100), 1.0, 0).is_none(), "fits: nothing");
        let d = decide_early(&c, &mut st, &sparse(1280), 1.0, 0).unwrap();
        assert_eq!((d.reason, d.new_size, st.set), (Reason::Shrink, 64 << 10, 4));
        // The next end judges the new size on its own (no revert against a partial time).
        let d = decide(&c, &mut st, &sparse(100), 99.0, 0);
        assert_eq!(d.reason, Reason::Fits);
    }

    proptest! {
        /// Any sequence of measurements: the size stays within bounds, changes at most
        /// log2(max/min) + 1 times, never returns to a size it left except by the one revert
        /// (to a size a whole loop ran at), and a shrink lands on a size whose touched units fit
        /// (or on the floor).
        #[test]
        fn settles_without_oscillation(
            min_k in 0u32..3, max_k in 3u32..8, local in 1usize..4000,
            steps in proptest::collection::vec((touched_strategy(), 0.1f64..100.0), 1..60),
        ) {
            let c = TunerConfig { base_page: 4096, local_mem: local * 4096, min_set: 1 << min_k, max_set: 1 << max_k };
            let mut st = LoopState::new(c.max_set);
            let mut changes = 0u32;
            let mut sizes = vec![st.set];
            let mut measured = std::collections::BTreeSet::new();
            for (t, time) in &steps {
                let old = st.set;
                measured.insert(old);
                let d = decide(&c, &mut st, t, *time, 1);
                prop_assert!(st.set >= c.min_set && st.set <= c.max_set);
                if st.set != old {
                    changes += 1;
                    sizes.push(st.set);
                }
                match d.reason {
                    Reason::Shrink => {
                        prop_assert!(st.set < old);
                        prop_assert!(t.at(st.set) <= c.local_units(st.set));
                    }
                    Reason::Floor => prop_assert_eq!(st.set, c.min_set),
                    Reason::Revert => {
                        prop_assert!(st.set > old);
                        prop_assert!(measured.contains(&st.set), "back to {} never measured", st.set);
                    }
                    Reason::Fits | Reason::Pinned => prop_assert_eq!(st.set, old),
                    r @ (Reason::Explore | Reason::Better | Reason::Worse | Reason::Settled) => {
                        prop_assert!(false, "a window's reason {:?} for a loop", r)
                    }
                }
            }
            prop_assert!(changes <= max_k - min_k + 1, "{} changes: {:?}", changes, sizes);
            // Sizes fall monotonically, then rise at most once (the revert) and stay.
            let rises = sizes.windows(2).filter(|w| w[1] > w[0]).count();
            prop_assert!(rises <= 1);
            if let Some(i) = sizes.windows(2).position(|w| w[1] > w[0]) {
                prop_assert_eq!(i + 2, sizes.len(), "a change after the revert: {:?}", sizes);
            }
        }
    }
}
