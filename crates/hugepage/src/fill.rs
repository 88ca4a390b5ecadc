//! First-touch hugepages ahead of a dense fill (`pagewise hps run`): the rule, pure.
//!
//! A program nobody tuned for HPS often writes a large allocation front to back (GNU sort
//! reads 64 MiB of input into its buffer in about 80 ms) and then uses all of it. HPS's
//! tracker promotes such regions only after it has seen them used — each one first faulted in
//! 4 KiB at a time, then observed, then copied into a hugepage by MADV_COLLAPSE — which THP
//! `always` skips by giving the hugepage at the first touch. A region written densely holds
//! as much memory in one hugepage as in 512 small pages, so giving it a hugepage at once
//! bloats nothing; the risk is a region predicted dense that the program then writes sparsely.
//!
//! The rule follows fill *fronts*. A region some of whose pages are in memory is partial; once
//! at least [`DENSE_PAGES`] of its 512 are, it is dense. A dense region next to another dense
//! one is a front moving away from that neighbour (a dense region alone starts a front towards
//! its one partial neighbour, if it has exactly one). The empty regions ahead of the front are
//! advised (MADV_HUGEPAGE on a huge-capable tmpfs: the first touch of each allocates a
//! hugepage), each probed just before; the window ends at one that is not empty, except that
//! the region right ahead may be the one being written as the check runs (checks lag behind a
//! fast front), and the window then starts after it. The window doubles with each dense region
//! behind the front (1, 2, 4, up to [`MAX_WINDOW`] regions), as read-ahead does, so a front
//! the checks lag behind is caught up with in a few checks.
//!
//! What can go wrong, and the bound on it. An advised region the program never touches costs
//! nothing. One it writes sparsely gets a whole hugepage: the last region of every front,
//! where the program stops writing (as under THP always, whose last hugepage of a range is no
//! fuller), and at most [`MAX_WINDOW`] regions a front if the program skips about. An advised
//! region already partly written when the advice came stays on small pages (tmpfs allocates a
//! hugepage only into an empty 2 MiB range); once it stops changing short of dense it is
//! un-advised, so khugepaged does not later fill its holes. One that the program fills densely
//! all the same, in small pages, is reported [`Advice::Filled`]: the mechanism checks whether it
//! got its hugepage and, if not, hands it back to the tracker, which collapses it if it is hot
//! (left out of tracking, a hot region filled that way would stay on small pages for good).
//!
//! Checking costs: a region is probed by its first and last pages (two mincore(2) calls of
//! one page) while empty, at most `probe_budget` regions a check, and counted (mincore of its
//! 512 pages) only while partial or advised.
//!
//! A hugepage at first touch is worth it only while it costs less than the 512 small pages it
//! replaces, and on a VM whose host takes back free memory (`pagewise_kernel::page_reporting`)
//! that changes within seconds: populating a 2 MiB region took 0.25 ms from memory freed a
//! moment before and 5 ms from memory the host had taken back, against about 0.8 ms for 512
//! small pages, which the kernel takes from blocks too small to have been handed back. GNU
//! sort of 64 MiB with first-touch hugepages ran 0.91× as long as plain in the first case and
//! 1.31× in the second. So the mechanism populates the first region of each window itself,
//! timed (work the program would otherwise do, done off its thread), and advises the rest
//! only while that cost less than [`DEAR_NS`] ([`Price`]); otherwise it
//! [`FillFronts::decline`]s the rest and the program fills it in small pages.

/// Pages of a region's 512 in memory from which it counts as dense (7/8).
pub const DENSE_PAGES: u32 = 448;
/// Most regions advised ahead of one front.
pub const MAX_WINDOW: usize = 8;
/// Pages per region.
const REGION_PAGES: u32 = 512;
/// Checks in a row a partly written region may stay unchanged before it counts as sparse (and,
/// if advised, is un-advised).
const STALL_CHECKS: u8 = 2;
/// A sparse region is counted again every this many checks.
const SPARSE_EVERY: u64 = 8;

/// Whether `pagewise hps run` gives hugepages at first touch ahead of dense fills.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FirstTouch {
    /// Never: regions are filled in small pages and collapsed if hot. The default: on this VM
    /// kind hugepages at first touch are mostly dear, and a server's fill (memcached's slabs)
    /// takes whole hugepages it does not fill (docs/hps.md).
    #[default]
    Off,
    /// While hugepages are cheap ([`Price`]).
    Priced,
    /// Always, whatever they cost.
    Always,
}

impl FirstTouch {
    /// `never`, `auto` or `always` (as `pagewise hps run --first-touch` takes them).
    pub fn parse(s: &str) -> Option<FirstTouch> {
        match s {
            "never" => Some(FirstTouch::Off),
            "auto" => Some(FirstTouch::Priced),
            "always" => Some(FirstTouch::Always),
            _ => None,
        }
    }
}

/// A hugepage costs more than this to populate (CPU ns): dearer than the small pages it
/// replaces (about 0.8 ms for 512 of them here).
pub const DEAR_NS: u64 = 1_000_000;
/// Once found dear, hugepages are taken for dear this long (ns) before anything is measured
/// again.
pub const DEAR_FOR_NS: u64 = 1_000_000_000;

/// What a hugepage at first touch cost when last measured. A cheap price holds for one window
/// only — memory the host has not taken back runs out as it is used, and the next hugepage
/// may cost 20× the last — so every window measures on its first region; a dear one holds for
/// [`DEAR_FOR_NS`], and the windows meanwhile are declined without a measurement.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Price {
    /// When the last dear price was measured.
    dear_at: Option<u64>,
}

impl Price {
    /// A measurement taken at `now_ns`: populating one region took `cost_ns` (CPU).
    pub fn record(&mut self, now_ns: u64, cost_ns: u64) {
        self.dear_at = (cost_ns > DEAR_NS).then_some(now_ns);
    }

    /// Whether hugepages count as dear at `now_ns` (no measurement needed: decline).
    pub fn dear(&self, now_ns: u64) -> bool {
        self.dear_at.is_some_and(|at| now_ns.saturating_sub(at) < DEAR_FOR_NS)
    }
}

/// What the rule asks of memory.
pub trait Residency {
    /// Whether page `page` (0..512) of region `region` is in memory.
    fn page(&mut self, region: usize, page: u32) -> bool;
    /// Pages of region `region` in memory, 0..=512.
    fn count(&mut self, region: usize) -> u32;
}

/// What to do to the memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Advice {
    /// MADV_HUGEPAGE on `count` regions from `first`; HPS does not track them.
    Huge { first: usize, count: usize },
    /// MADV_NOHUGEPAGE on region `region`; HPS tracks it again.
    Small { region: usize },
    /// Region `region`, advised, is now dense: in a hugepage if its first touch got one, else
    /// in small pages, and then HPS tracks it again.
    Filled { region: usize },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Empty,
    /// Written in part; the count at the last check and the checks it has not changed for.
    Partial {
        count: u32,
        still: u8,
    },
    /// Partial, unchanged for [`STALL_CHECKS`] checks and not on a front: written sparsely or
    /// done with. Counted only every [`SPARSE_EVERY`] checks (every check would cost a mincore
    /// of 512 pages for nothing); partial again once it changes.
    Sparse {
        count: u32,
    },
    Dense,
    /// Advised; the count at the last check and the checks it has not changed for.
    Advised {
        count: u32,
        still: u8,
    },
    /// Advised and dense (a hugepage, or filled densely in small pages), or un-advised:
    /// nothing more to do.
    Settled,
}

/// The rule's state for one arena of `regions` 2 MiB regions.
#[derive(Clone, Debug)]
pub struct FillFronts {
    state: Vec<State>,
    /// Next empty region to probe.
    cursor: usize,
    /// Checks so far.
    checks: u64,
}

impl FillFronts {
    pub fn new(regions: usize) -> FillFronts {
        FillFronts { state: vec![State::Empty; regions], cursor: 0, checks: 0 }
    }

    /// Whether a check can still change anything (some region is empty, partial or advised).
    pub fn active(&self) -> bool {
        self.state.iter().any(|s| !matches!(s, State::Dense | State::Settled))
    }

    /// One check: count partial and advised regions, probe empty ones while `probe_budget`
    /// lasts (each probe takes one), and say what to advise. Returns whether any region changed
    /// state (the caller checks sooner while something changes).
    pub fn check(&mut self, mem: &mut impl Residency, probe_budget: &mut usize, out: &mut Vec<Advice>) -> bool {
        let n = self.state.len();
        let mut changed = false;
        let mut dense_now = Vec::new();
        self.checks += 1;
        let recount_sparse = self.checks.is_multiple_of(SPARSE_EVERY);
        for r in 0..n {
            match self.state[r] {
                State::Sparse { count } if recount_sparse => {
                    let c = mem.count(r);
                    if c >= DENSE_PAGES {
                        dense_now.push(r);
                        changed = true;
                        self.state[r] = State::Dense;
                    } else if c != count {
                        changed = true;
                        self.state[r] = State::Partial { count: c, still: 0 };
                    }
                }
                State::Partial { count, still } => {
                    let c = mem.count(r);
                    self.state[r] = if c >= DENSE_PAGES {
                        dense_now.push(r);
                        changed = true;
                        State::Dense
                    } else if c != count {
                        changed = true;
                        State::Partial { count: c, still: 0 }
                    } else if still + 1 >= STALL_CHECKS && !self.on_a_front(r) {
                        State::Sparse { count: c }
                    } else {
                        State::Partial { count: c, still: still.saturating_add(1) }
                    };
                }
                State::Advised { count, still } => {
                    let c = mem.count(r);
                    self.state[r] = if c >= DENSE_PAGES {
                        // The front went through: it goes on from here.
                        changed = true;
                        dense_now.push(r);
                        out.push(Advice::Filled { region: r });
                        State::Settled
                    } else if c == count {
                        if c > 0 && still + 1 >= STALL_CHECKS {
                            out.push(Advice::Small { region: r });
                            changed = true;
                            State::Settled
                        } else {
                            State::Advised { count: c, still: still.saturating_add(u8::from(c > 0)) }
                        }
                    } else {
                        changed = true;
                        State::Advised { count: c, still: 0 }
                    };
                }
                State::Empty | State::Sparse { .. } | State::Dense | State::Settled => {}
            }
        }
        for k in 0..n {
            if *probe_budget == 0 {
                break;
            }
            let r = (self.cursor + k) % n;
            if self.state[r] != State::Empty {
                continue;
            }
            *probe_budget -= 1;
            self.cursor = (r + 1) % n;
            if mem.page(r, 0) || mem.page(r, REGION_PAGES - 1) {
                changed = true;
                let c = mem.count(r);
                if c >= DENSE_PAGES {
                    self.state[r] = State::Dense;
                    dense_now.push(r);
                } else {
                    self.state[r] = State::Partial { count: c, still: 0 };
                }
            }
        }
        for r in dense_now {
            self.advance(r, mem, out);
        }
        changed
    }

    /// The caller did not apply advice for regions `first..first + count` (hugepages were
    /// dear): those still advised are empty again, followed and advised anew as the front
    /// reaches them.
    pub fn decline(&mut self, first: usize, count: usize) {
        for s in self.state.iter_mut().skip(first).take(count) {
            if matches!(s, State::Advised { .. }) {
                *s = State::Empty;
            }
        }
    }

    /// Region `r` just became dense: advise ahead of the front it belongs to.
    fn advance(&mut self, r: usize, mem: &mut impl Residency, out: &mut Vec<Advice>) {
        let Some(dir) = self.direction(r) else { return };
        // Dense regions behind r on this front: the window doubles with each.
        let mut behind = 0u32;
        let mut at = r;
        while let Some(prev) = step(at, -dir, self.state.len()) {
            if !self.is_dense(prev) {
                break;
            }
            behind += 1;
            at = prev;
            if behind >= MAX_WINDOW.trailing_zeros() {
                break;
            }
        }
        let window = (1usize << behind).min(MAX_WINDOW);
        let mut first = None;
        let mut count = 0;
        let mut at = r;
        // The region right ahead may be the one being written now (the checks lag behind the
        // front): the window starts after it.
        let mut front_passed = false;
        while count < window {
            let Some(next) = step(at, dir, self.state.len()) else { break };
            let state = self.state[next];
            // Probed now: an empty region may have been written since it was last probed.
            let written = state == State::Empty && (mem.page(next, 0) || mem.page(next, REGION_PAGES - 1));
            if written {
                self.state[next] = State::Partial { count: 0, still: 0 };
            }
            match state {
                State::Advised { .. } => {
                    at = next;
                    continue;
                }
                _ if (matches!(state, State::Partial { .. }) || written) && !front_passed && first.is_none() => {
                    front_passed = true;
                    at = next;
                    continue;
                }
                State::Empty if !written => {}
                _ => break,
            }
            self.state[next] = State::Advised { count: 0, still: 0 };
            first = Some(first.map_or(next, |f: usize| f.min(next)));
            count += 1;
            at = next;
        }
        if let Some(first) = first {
            out.push(Advice::Huge { first, count });
        }
    }

    /// +1 or -1: the way the front through dense region `r` moves, if it can be told.
    fn direction(&self, r: usize) -> Option<isize> {
        let n = self.state.len();
        let at = |d: isize| step(r, d, n).map(|i| self.state[i]);
        let dense = |d: isize| step(r, d, n).is_some_and(|i| self.is_dense(i));
        match (dense(-1), dense(1)) {
            (true, false) => return Some(1),
            (false, true) => return Some(-1),
            (true, true) => return None,
            (false, false) => {}
        }
        let partial = |s: Option<State>| matches!(s, Some(State::Partial { .. }));
        match (partial(at(-1)), partial(at(1))) {
            (true, false) => Some(-1),
            (false, true) => Some(1),
            _ => None,
        }
    }

    /// Whether region `r` is next to a dense or advised region: where a front that paused
    /// would go on, so it is counted every check however long it stays unchanged.
    fn on_a_front(&self, r: usize) -> bool {
        [-1, 1]
            .into_iter()
            .filter_map(|d| step(r, d, self.state.len()))
            .any(|i| matches!(self.state[i], State::Dense | State::Settled | State::Advised { .. }))
    }

    fn is_dense(&self, r: usize) -> bool {
        matches!(self.state[r], State::Dense | State::Settled)
    }
}

fn step(r: usize, d: isize, n: usize) -> Option<usize> {
    let next = r as isize + d;
    (0..n as isize).contains(&next).then_some(next as usize)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Memory as a count of pages in each region, written from the start of the region
    /// (`ascending`) or from its end.
    struct Fake {
        pages: Vec<u32>,
        ascending: bool,
    }

    impl Residency for Fake {
        fn page(&mut self, region: usize, page: u32) -> bool {
            let p = self.pages[region];
            if self.ascending {
                page < p
            } else {
                page >= REGION_PAGES - p
            }
        }
        fn count(&mut self, region: usize) -> u32 {
            self.pages[region]
        }
    }

    /// Fill `regions` regions in order (`ascending` or from the last), `step_pages` pages
    /// between checks, each followed by `pauses` checks that see no change (the program busy
    /// elsewhere); an advised region still empty when the fill reaches it is written in one go
    /// (a hugepage at its first touch). Returns the advice given and the regions advised.
    fn fill(regions: usize, ascending: bool, step_pages: u32, pauses: usize) -> (Vec<Advice>, Vec<bool>) {
        let mut m = Fake { pages: vec![0; regions], ascending };
        let mut f = FillFronts::new(regions);
        let mut advised = vec![false; regions];
        let mut all = Vec::new();
        let order: Vec<usize> = if ascending { (0..regions).collect() } else { (0..regions).rev().collect() };
        let mut left = step_pages;
        for &r in &order {
            if advised[r] && m.pages[r] == 0 {
                m.pages[r] = REGION_PAGES;
                left = left.saturating_sub(1);
            }
            while m.pages[r] < REGION_PAGES {
                let take = left.min(REGION_PAGES - m.pages[r]);
                m.pages[r] += take;
                left -= take;
                if left == 0 {
                    let mut out = Vec::new();
                    for _ in 0..=pauses {
                        f.check(&mut m, &mut regions.clone(), &mut out);
                    }
                    for a in &out {
                        if let Advice::Huge { first, count } = *a {
                            advised[first..first + count].iter_mut().for_each(|x| *x = true);
                        }
                    }
                    all.extend(out);
                    left = step_pages;
                }
            }
        }
        (all, advised)
    }

    #[test]
    fn a_front_is_followed_with_a_doubling_window_in_either_direction() {
        for (ascending, pauses) in [(true, 0), (false, 0), (true, 3), (false, 3)] {
            let (advice, advised) = fill(64, ascending, 600, pauses);
            assert!(!advice.iter().any(|a| matches!(a, Advice::Small { .. })), "{advice:?}");
            // The first regions are seen filling; most of the rest get their hugepage first,
            // also when the fill pauses for several checks at a time.
            let got = advised.iter().filter(|&&a| a).count();
            assert!(got >= 48, "ascending {ascending}, pauses {pauses}: {got} of 64 advised: {advice:?}");
        }
    }

    #[test]
    fn a_declined_window_is_followed_and_offered_again_and_never_un_advised() {
        // A fill of 32 regions whose every window is declined (hugepages dear): the front is
        // followed all the way, windows keep coming as it moves, and no region stays advised.
        let mut m = Fake { pages: vec![0; 32], ascending: true };
        let mut f = FillFronts::new(32);
        let (mut windows, mut small) = (0, 0);
        for r in 0..32 {
            for step in 1..=4 {
                m.pages[r] = REGION_PAGES * step / 4;
                let mut out = Vec::new();
                f.check(&mut m, &mut 32, &mut out);
                for a in out {
                    match a {
                        Advice::Huge { first, count } => {
                            windows += 1;
                            f.decline(first, count);
                        }
                        Advice::Small { .. } => small += 1,
                        Advice::Filled { .. } => {}
                    }
                }
                assert!(!f.state.iter().any(|s| matches!(s, State::Advised { .. })));
            }
        }
        assert!(windows >= 28, "{windows} windows offered");
        assert_eq!(small, 0);
        assert!(!f.active());
    }

    #[test]
    fn a_dear_price_holds_for_a_while_and_a_cheap_one_for_one_window() {
        let mut p = Price::default();
        assert!(!p.dear(0));
        p.record(10, 250_000);
        assert!(!p.dear(10));
        p.record(20, 5_000_000);
        assert!(p.dear(20));
        assert!(p.dear(20 + DEAR_FOR_NS - 1));
        assert!(!p.dear(20 + DEAR_FOR_NS));
        p.record(30, DEAR_NS);
        assert!(!p.dear(31));
    }

    #[test]
    fn nothing_is_advised_without_a_front() {
        // Scattered dense regions with empty neighbours on both sides: no direction.
        let mut m = Fake { pages: vec![0; 16], ascending: true };
        for r in [2, 6, 10] {
            m.pages[r] = REGION_PAGES;
        }
        let mut f = FillFronts::new(16);
        let mut out = Vec::new();
        f.check(&mut m, &mut 16, &mut out);
        f.check(&mut m, &mut 16, &mut out);
        assert!(out.is_empty(), "{out:?}");
    }

    #[test]
    fn an_advised_region_written_sparsely_is_un_advised_once_it_stops_changing() {
        let mut m = Fake { pages: vec![0; 8], ascending: true };
        let mut f = FillFronts::new(8);
        let mut out = Vec::new();
        m.pages[0] = REGION_PAGES;
        m.pages[1] = 10;
        f.check(&mut m, &mut 8, &mut out);
        // Region 1 is the front being written: the window starts after it.
        assert_eq!(out, vec![Advice::Huge { first: 2, count: 1 }]);
        m.pages[1] = REGION_PAGES;
        f.check(&mut m, &mut 8, &mut out);
        // Two dense regions behind the front now: a window of two.
        assert_eq!(out, vec![Advice::Huge { first: 2, count: 1 }, Advice::Huge { first: 3, count: 2 }]);
        // Region 2 was written in small pages before the advice took effect, and stops at 40.
        m.pages[2] = 40;
        out.clear();
        for _ in 0..4 {
            f.check(&mut m, &mut 8, &mut out);
        }
        assert_eq!(out, vec![Advice::Small { region: 2 }]);
        // Regions 3 and 4, advised and never touched, cost nothing and stay advised.
        assert!(f.active());
    }

    #[test]
    fn each_advised_region_is_reported_filled_once_when_dense() {
        for ascending in [true, false] {
            let (advice, advised) = fill(32, ascending, 600, 0);
            let mut filled = [0u32; 32];
            for a in &advice {
                if let Advice::Filled { region } = *a {
                    assert!(advised[region], "region {region} reported filled, never advised: {advice:?}");
                    filled[region] += 1;
                }
            }
            assert!(filled.iter().all(|&n| n <= 1), "{advice:?}");
            // Every advised region the fill went through, but the last window's (no check
            // followed the fill's end).
            let (got, of) = (filled.iter().sum::<u32>() as usize, advised.iter().filter(|&&a| a).count());
            assert!(got + MAX_WINDOW >= of && got > 0, "{got} of {of} advised regions reported filled: {advice:?}");
        }
    }

    proptest! {
        /// Whatever memory looks like from check to check: every region is advised at most
        /// once and only while it is empty, un-advised or reported filled (once, never both)
        /// only after it was advised, filled only when dense, and each advice is a run of at
        /// most MAX_WINDOW regions inside the arena.
        #[test]
        fn advice_is_bounded_and_only_for_empty_regions(
            steps in proptest::collection::vec(proptest::collection::vec(0u32..=512, 12), 1..30),
            budget in 1usize..12,
        ) {
            let mut f = FillFronts::new(12);
            let mut advised = [false; 12];
            let mut small = [false; 12];
            let mut filled = [false; 12];
            for pages in steps {
                let mut m = Fake { pages: pages.clone(), ascending: true };
                let mut out = Vec::new();
                f.check(&mut m, &mut budget.clone(), &mut out);
                for a in out {
                    match a {
                        Advice::Huge { first, count } => {
                            prop_assert!((1..=MAX_WINDOW).contains(&count) && first + count <= 12);
                            for r in first..first + count {
                                prop_assert!(!advised[r], "region {} advised twice", r);
                                prop_assert_eq!(pages[r], 0, "region {} advised with pages in memory", r);
                                advised[r] = true;
                            }
                        }
                        Advice::Small { region } => {
                            prop_assert!(advised[region] && !small[region] && !filled[region]);
                            small[region] = true;
                        }
                        Advice::Filled { region } => {
                            prop_assert!(advised[region] && !small[region] && !filled[region]);
                            prop_assert!(pages[region] >= DENSE_PAGES);
                            filled[region] = true;
                        }
                    }
                }
            }
        }
    }
}
