use super::*;
use proptest::prelude::*;

fn cfg() -> TunerConfig {
    // pagewise run: 4 KiB base, 4 KiB .. 1 MiB, 32 MiB local.
    TunerConfig { base_page: 4096, local_mem: 32 << 20, min_set: 1, max_set: 256 }
}

/// Touched units that do not fit at any size (a program touching more than local memory).
fn too_much() -> Touched {
    let mut t = Touched::default();
    t.units.iter_mut().for_each(|u| *u = usize::MAX / 2);
    t
}

/// Run `windows` windows of a program whose window cost at set count s in window w is
/// `cost(s, w)`; the sizes in force, window by window.
fn run_with<C: Into<Cost>>(
    touched: &Touched,
    mut cost: impl FnMut(u32, usize) -> C,
    windows: usize,
) -> (WindowTuner, Vec<u32>) {
    let c = cfg();
    let mut t = WindowTuner::new(&c);
    let mut sets = Vec::new();
    for w in 0..windows {
        let s = t.set();
        sets.push(s);
        let d = t.on_window(&c, touched, cost(s, w).into(), u64::MAX);
        assert_eq!(d.new_size, t.set() as usize * 4096);
        assert_eq!(d.old_size, s as usize * 4096);
    }
    (t, sets)
}

fn run(cost: impl Fn(u32) -> f64, windows: usize) -> (WindowTuner, Vec<u32>) {
    run_with(&Touched::default(), |s, _| cost(s), windows)
}

fn log2(s: u32) -> f64 {
    (s as f64).log2()
}

#[test]
fn starts_in_the_middle_of_the_range_and_measures_it_before_trying_another() {
    let (t, sets) = run(|_| 2.0, 2);
    assert_eq!(t.home, 16);
    assert_eq!(sets, [16, 16], "the first window is the program's start, the second the home's measure");
}

#[test]
fn a_sweep_climbs_to_the_largest_unit() {
    // Larger units fetch more per fault: the cost falls with the size.
    let (t, _) = run(|s| 1.0 + 8.0 / (1.0 + log2(s)), 60);
    assert_eq!(t.home, 256);
}

#[test]
fn random_access_jumps_down_to_the_smallest_unit_in_few_windows() {
    // Every fault fetches one useful page: the cost grows with the size (GNU sort at 25%).
    let (t, sets) = run_with(&too_much(), |s, _| 20.0 + 10.0 * log2(s), 40);
    assert_eq!(t.home, 1);
    // Untouched units do not fit: the first look is down, by a jump (16 → 4), and the
    // smallest size is home within a dozen windows.
    assert_eq!(sets[2], 4);
    let reached = sets.iter().position(|&s| s == 1).expect("tried");
    assert!(reached <= 8, "first at 4 KiB in window {reached}: {sets:?}");
    assert!(sets[12..].iter().filter(|&&s| s == 1).count() >= 20, "{sets:?}");
}

#[test]
fn after_a_phase_change_wins_widen_the_search_back_to_a_far_best_size() {
    // Python building a large dict (new memory: larger units are faster), then reading it in
    // key order (random: every halving of the unit is faster by a third, not clearly).
    let build = 120;
    let cost = |s: u32, w: usize| if w < build { 1.0 + 8.0 / (1.0 + log2(s)) } else { 4.0 * 1.4f64.powf(log2(s)) };
    let (t, sets) = run_with(&too_much(), cost, build + 60);
    assert_eq!(sets[build - 1], 256, "the build phase climbed to the largest unit: {sets:?}");
    assert_eq!(t.home, 1, "{sets:?}");
    let home_at = |w: usize| sets[w..].iter().position(|&s| s == 1).map(|i| w + i);
    let reached = home_at(build).expect("tried");
    assert!(reached - build <= 20, "4 KiB first tried {} windows after the change: {sets:?}", reached - build);
}

#[test]
fn a_clearly_slower_jump_turns_the_search_around_at_once() {
    // Untouched units do not fit, so the first look is down; but the program sweeps (numpy at
    // 25%): smaller units are far slower, larger ones faster.
    let (t, sets) = run_with(&too_much(), |s, _| 1.0 + 8.0 / (1.0 + log2(s)), 12);
    assert_eq!(&sets[..5], [16, 16, 4, 16, 64], "home, home, trial down, home, trial up");
    assert!(t.home >= 64, "{sets:?}");
}

/// A sweep whose faults cost the program kernel time: by the CPU measure the smallest unit
/// looks cheapest (the cost becomes one fault's time over its kernel cost), while each byte
/// streamed costs less the larger the unit (numpy widening a file at 5%: 4 KiB 2.5× 1 MiB).
fn sweep(s: u32, streams: bool) -> Cost {
    let per_cpu = 2.0 + 0.5 * log2(s);
    let per_gb = 1.0 + 8.0 / (1.0 + log2(s));
    Cost { per_cpu, per_streamed_gb: streams.then_some(per_gb) }
}

#[test]
fn a_sweep_is_compared_by_bytes_streamed_and_climbs_from_the_first_look() {
    // What the windows touch does not fit, which alone would send the first look down; the
    // windows are streams, so it goes up, by the longest jump (16 → 256), right after the
    // program's start.
    let (t, sets) = run_with(&too_much(), |s, _| sweep(s, true), 40);
    assert_eq!(sets[1], 256, "the first trial is the longest jump up: {sets:?}");
    assert_eq!(t.home, 256, "{sets:?}");
}

#[test]
fn a_start_that_streamed_is_followed_by_a_trial_judged_by_the_window_after_it() {
    // The start's cost is start-up (20× the rest here), so it is no home before: against the
    // window after alone, a trial measured the same per byte is kept at once...
    let start = |w: usize, c: Cost| if w == 0 { Cost { per_cpu: 40.0, per_streamed_gb: Some(20.0) } } else { c };
    let (t, sets) = run_with(&too_much(), |_, w| start(w, Cost { per_cpu: 2.0, per_streamed_gb: Some(1.0) }), 4);
    assert_eq!((&sets[..3], t.home), (&[16, 256, 16][..], 256), "{sets:?}");
    // ...and a trial that did not stream is judged by CPU time against that window alone,
    // not made again: twice as dear, the search turns down at once.
    let no_stream_up = |s: u32, w: usize| {
        let cpu = if s > 16 { 4.0 } else { 2.0 };
        start(w, Cost { per_cpu: cpu, per_streamed_gb: (s == 16).then_some(1.0) })
    };
    let (_, sets) = run_with(&too_much(), no_stream_up, 4);
    assert_eq!(sets, [16, 256, 16, 4], "{sets:?}");
    // A start that did not stream: the home is measured first (the first trial in window 2)...
    let (_, sets) = run_with(&too_much(), |s, _| sweep(s, false), 3);
    assert_eq!(sets, [16, 16, 4], "{sets:?}");
    // ...and when that window streamed, the trial is compared with it too: 1.4 against 2.0
    // before and 1.0 after is 0.99, kept (against the window after alone, 1.4, it would not be).
    let costs = [None, Some(2.0), Some(1.4), Some(1.0), Some(1.0)];
    let (t, sets) = run_with(&too_much(), |_, w| Cost { per_cpu: 2.0, per_streamed_gb: costs[w] }, 4);
    assert_eq!((&sets[..], t.home), (&[16, 16, 256, 16][..], 256), "{sets:?}");
}

#[test]
fn windows_that_are_not_streams_keep_the_cpu_measure() {
    // The same program with its fetches random: compared by CPU time, down to the smallest.
    let (t, sets) = run_with(&too_much(), |s, _| sweep(s, false), 40);
    assert_eq!(t.home, 1, "{sets:?}");
}

#[test]
fn one_dear_pair_never_turns_a_sweeps_search_around() {
    // The first trial up lands in a phase that costs twice as much per byte (a widening copy
    // after a plain read): by itself the pair is clearly worse, so a second one is taken; the
    // two together come out about even (1.45 and 0.73), and a larger unit measured no slower
    // on a sweep is kept.
    let dear_first_trial = |s: u32, w: usize| {
        let c = sweep(s, true);
        let phase = if w == 1 { 2.0 } else { 1.0 };
        Cost { per_streamed_gb: c.per_streamed_gb.map(|gb| gb * phase), ..c }
    };
    let (t, sets) = run_with(&too_much(), dear_first_trial, 40);
    assert_eq!(&sets[..6], [16, 256, 16, 256, 16, 256], "{sets:?}");
    assert_eq!(t.home, 256, "{sets:?}");
    // By the CPU measure the same pair turns the search around at once.
    let (_, sets) = run_with(&Touched::default(), |_, w| if w == 2 { 4.0 } else { 2.0 }, 6);
    assert_eq!(&sets[..5], [16, 16, 64, 16, 4], "{sets:?}");
}

#[test]
fn a_larger_unit_on_a_sweep_is_kept_unless_clearly_slower() {
    // Every size costs the same per byte: by bytes streamed, the first look up (16 → 256) is
    // kept after its first pair; by the CPU measure, the first look up (16 → 64) is not.
    let flat = |streams: bool| move |_: u32, _: usize| Cost { per_cpu: 2.0, per_streamed_gb: streams.then_some(1.0) };
    let (t, sets) = run_with(&too_much(), flat(true), 5);
    assert_eq!((sets, t.home), (vec![16, 256, 16, 256, 128], 256));
    let (t, sets) = run_with(&Touched::default(), flat(false), 7);
    assert_eq!((sets[2], t.home), (64, 16), "{sets:?}");
    // Slower per byte but not clearly (a sweep's phases move it more than that), it is kept;
    // clearly slower, it is not.
    let dearer_up =
        |by: f64| move |s: u32, _: usize| Cost { per_cpu: 2.0, per_streamed_gb: Some(if s > 16 { by } else { 1.0 }) };
    let (t, sets) = run_with(&too_much(), dearer_up(1.2), 3);
    assert_eq!((sets, t.home), (vec![16, 256, 16], 256));
    let (_, sets) = run_with(&too_much(), dearer_up(1.3), 6);
    assert_eq!(&sets[..5], [16, 256, 16, 256, 16], "{sets:?}");
    assert_ne!(sets[5], 256, "{sets:?}");
    // A smaller unit measured the same per byte is not kept: the rule is for larger ones.
    let mut t = WindowTuner::new(&cfg());
    t.down = true;
    t.looked = true;
    let c = cfg();
    let same = Cost { per_cpu: 2.0, per_streamed_gb: Some(1.0) };
    let sets: Vec<u32> = (0..7)
        .map(|_| {
            let s = t.set();
            t.on_window(&c, &too_much(), same, u64::MAX);
            s
        })
        .collect();
    assert_eq!(&sets[..6], [16, 16, 4, 16, 4, 16], "{sets:?}");
    assert_eq!(t.home, 16, "{sets:?}");
}

#[test]
fn sizes_without_room_for_eight_units_are_never_tried() {
    // 2 MiB of local memory: 256 KiB is the largest size with room for 8 units. A sweep's
    // first look jumps up to it, not to 1 MiB, and never goes further.
    let c = TunerConfig { local_mem: 2 << 20, ..cfg() };
    assert_eq!(largest_with_room(&c), 64);
    let mut t = WindowTuner::new(&c);
    let mut sets = Vec::new();
    for _ in 0..40 {
        sets.push(t.set());
        t.on_window(&c, &too_much(), sweep(t.set(), true), u64::MAX);
    }
    assert_eq!(sets[1], 64, "{sets:?}");
    assert_eq!(sets.iter().max(), Some(&64), "{sets:?}");
    // Less than 8 units of the smallest size: start there, and it is the only size tried.
    let tiny = TunerConfig { local_mem: 16 << 10, ..cfg() };
    assert_eq!((largest_with_room(&tiny), WindowTuner::new(&tiny).home), (1, 1));
}

#[test]
fn at_the_end_of_the_range_the_search_turns_around_by_a_single_step() {
    // The first look up from a sweep wins at the largest unit; the next look is one step
    // down, not a jump back to the size just beaten.
    let (_, sets) = run_with(&too_much(), |s, _| sweep(s, true), 8);
    assert_eq!(&sets[1..5], [256, 16, 256, 128], "{sets:?}");
}

#[test]
fn a_stream_trial_is_compared_with_the_home_windows_beside_it_that_were_streams() {
    let stream = |gb: f64| Cost { per_cpu: 10.0, per_streamed_gb: Some(gb) };
    let cpu_only = |c: f64| Cost { per_cpu: c, per_streamed_gb: None };
    let is = |r: Ratio, want: f64, judged: Judged| (r.mean - want).abs() < 1e-12 && r.judged == judged;
    // All three streams: the geometric mean of both homes.
    assert!(is(stream(1.0).ratio(&stream(4.0), &stream(1.0)), 0.5, Judged::ByStream));
    // Faster than both, slower than both: against each home alone.
    let r = stream(1.0).ratio(&stream(4.0), &stream(1.0));
    assert_eq!((r.lo, r.hi), (0.25, 1.0));
    // One home a stream: that one alone, either side.
    assert!(is(stream(1.0).ratio(&stream(4.0), &cpu_only(1.0)), 0.25, Judged::ByStream));
    assert!(is(stream(1.0).ratio(&cpu_only(1.0), &stream(2.0)), 0.5, Judged::ByStream));
    // The program's start before it (no measure): the home after alone.
    let r = stream(1.0).ratio(&Cost::UNMEASURED, &stream(2.0));
    assert!(is(r, 0.5, Judged::ByStream) && (r.lo, r.hi) == (0.5, 0.5), "{r:?}");
    // The trial not a stream, or neither home: the CPU measure.
    assert!(is(cpu_only(20.0).ratio(&stream(4.0), &stream(4.0)), 2.0, Judged::ByCpu));
    assert!(is(stream(1.0).ratio(&cpu_only(5.0), &cpu_only(20.0)), 1.0, Judged::ByCpu));
}

#[test]
fn a_window_is_a_stream_when_enough_of_what_it_fetched_continued_one() {
    let share = |fetched: u64, streamed: u64| Cost::of_window(0.1, 3.0, fetched, streamed, 0).per_streamed_gb;
    // 0.1 s for 100 MB streamed: 1 s per GB; and for 60 MB streamed in and 40 MB written back.
    assert_eq!(share(100_000_000, 100_000_000), Some(1.0));
    assert_eq!(Cost::of_window(0.1, 3.0, 70_000_000, 60_000_000, 40_000_000).per_streamed_gb, Some(1.0));
    // Written bytes do not make a stream: what was fetched does.
    assert!(Cost::of_window(0.1, 3.0, 100_000_000, 0, 1_000_000_000).per_streamed_gb.is_none());
    let at = (STREAM_SHARE * 1e6) as u64;
    assert!(share(1_000_000, at).is_some());
    assert!(share(1_000_000, at - 1).is_none());
    // Nothing fetched: nothing to say about streams.
    assert!(share(0, 0).is_none());
    assert_eq!(Cost::of_window(0.1, 3.0, 0, 0, 0).per_cpu, 3.0);
    // A window that streamed but whose stream measure is not finite measured nothing.
    assert!(!Cost { per_cpu: 3.0, per_streamed_gb: Some(f64::INFINITY) }.valid());
}

#[test]
fn settles_on_a_best_size_in_between_and_trials_thin_out() {
    // Best at 32 (128 KiB): the cost grows by 15% per step away from it.
    let cost = |s: u32| 1.15f64.powf((log2(s) - 5.0).abs());
    let (t, sets) = run(cost, 400);
    assert_eq!(t.home, 32);
    // Once settled, each look costs at most two windows in each direction.
    let late_trials = sets[300..].iter().filter(|&&s| s != 32).count();
    assert!(late_trials <= (100 / MAX_SETTLE_WINDOWS as usize + 1) * 4, "{late_trials}");
}

#[test]
fn a_program_slowing_down_by_phases_is_not_taken_for_a_better_size() {
    // The same cost at every size, but each window 20% dearer or cheaper than the last, in
    // long phases: the home windows on both sides of each trial move with it.
    let drift = |w: usize| {
        let into = (w % 40) as i32;
        1.2f64.powi(if (w / 40).is_multiple_of(2) { into } else { 40 - into })
    };
    let (t, _) = run_with(&too_much(), |_, w| drift(w), 200);
    assert_eq!(t.home, 16, "no size was faster, only the program's phases changed");
}

#[test]
fn one_size_only_never_explores() {
    let c = TunerConfig { min_set: 8, max_set: 8, ..cfg() };
    let mut t = WindowTuner::new(&c);
    for _ in 0..10 {
        let d = t.on_window(&c, &Touched::default(), 0.5.into(), u64::MAX);
        assert_eq!(d.new_size, 8 * 4096);
    }
}

#[test]
fn a_window_without_a_measure_never_moves_home() {
    // Whatever comes between them, windows with no measure (NaN, infinite, zero, negative)
    // never make a trial look faster: only measured pairs decide.
    let c = cfg();
    for bad in [f64::NAN, f64::INFINITY, 0.0, -1.0] {
        let mut t = WindowTuner::new(&c);
        for w in 0..200 {
            // Good windows cost the same at every size; every third window has no measure.
            let cost = if w % 3 == 0 { bad } else { 2.0 };
            let d = t.on_window(&c, &too_much(), cost.into(), u64::MAX);
            assert_ne!(d.reason, Reason::Better, "{bad} in window {w}");
        }
        assert_eq!(t.home, 16);
    }
}

proptest! {
    /// Whatever the measurements: the size stays in range; home only moves to the size just
    /// tried, at most the longest jump away, and says so; a trial is one window at a time.
    #[test]
    fn moves_are_measured_jumps_within_range(
        costs in proptest::collection::vec((0.01f64..100.0, proptest::option::of(0.01f64..100.0)), 1..300),
    ) {
        let c = cfg();
        let mut t = WindowTuner::new(&c);
        let mut away = 0;
        let mut last_tried = None;
        for cost in costs {
            let home = t.home;
            let before = t.set();
            if before != home {
                last_tried = Some(before);
            }
            let (per_cpu, per_streamed_gb) = cost;
            let d = t.on_window(&c, &too_much(), Cost { per_cpu, per_streamed_gb }, u64::MAX);
            let s = t.set();
            prop_assert!(s >= c.min_set && s <= c.max_set);
            if t.home != home {
                prop_assert_eq!(d.reason, Reason::Better);
                prop_assert_eq!(Some(t.home), last_tried);
                let steps = (log2(t.home) - log2(home)).abs();
                prop_assert!(steps >= 1.0 && steps <= MAX_JUMP as f64);
            }
            away = if s != t.home { away + 1 } else { 0 };
            prop_assert!(away <= 1);
        }
    }

    /// With ±5% noise on a unimodal cost, the tuner ends within one step of the best size.
    #[test]
    fn finds_the_best_size_through_noise(best in 0u32..9, seed in 0u64..1000) {
        let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        let cost = move |s: u32, _| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let noise = ((x >> 33) as f64 / (1u64 << 31) as f64 - 0.5) * 0.1;
            1.2f64.powf((log2(s) - best as f64).abs()) * (1.0 + noise)
        };
        let (t, _) = run_with(&Touched::default(), cost, 300);
        let got = t.home.trailing_zeros() as i64;
        prop_assert!((got - best as i64).abs() <= 1, "home 2^{} best 2^{}", got, best);
    }
}

#[test]
fn a_phase_change_at_a_trial_window_is_not_credited_to_its_size() {
    // Every size costs the same; the program's cost halves or doubles between phases, so some
    // trial windows open a cheaper phase (home 2.0, trial 1.0, home 1.0: 0.71 by the mean of
    // the homes alone). Faster than one home window beside it is not faster: home never moves.
    for len in 1..=6 {
        let (t, sets) = run_with(&too_much(), |_, w| if (w / len) % 2 == 0 { 2.0 } else { 1.0 }, 120);
        assert_eq!(t.home, 16, "phases of {len} windows: {sets:?}");
    }
}
