//! Fixed homes: where each base page of an allocation lives. Pure arithmetic.
//!
//! An allocation of `pages` base pages is cut into blocks of `max_set` pages (the largest unit);
//! block b lives on server b mod n, as block b div n of that server's region. A unit of any
//! allowed set count is aligned to its own size and so lies inside one block: one home, one
//! contiguous range on that home, one message (the seed's "memory allotted in multiples of the
//! largest set count").

/// The striping of one allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Base pages in the allocation (a multiple of `max_set`).
    pub pages: usize,
    pub max_set: usize,
    pub servers: usize,
}

impl Layout {
    /// The layout of `len` bytes of base pages of `base` bytes.
    pub fn new(len: usize, base: usize, max_set: usize, servers: usize) -> Self {
        let block = base * max_set;
        let pages = len.div_ceil(block) * max_set;
        Layout { pages, max_set, servers }
    }

    /// (server, page index inside that server's region) of base page `page`.
    pub fn home(&self, page: usize) -> (usize, usize) {
        let block = page / self.max_set;
        (block % self.servers, (block / self.servers) * self.max_set + page % self.max_set)
    }

    /// Base pages of server `s`'s region.
    pub fn region_pages(&self, s: usize) -> usize {
        let blocks = self.pages / self.max_set;
        let mine = if s < blocks % self.servers { 1 } else { 0 } + blocks / self.servers;
        mine * self.max_set
    }

    /// Whether page `first + count` lies on the same home as pages `[first, first + count)`,
    /// just after them in that home's region: a READ of the run may take it too (read-ahead
    /// units gathered into one READ; within a block always, across blocks with one server).
    pub fn continues_on_home(&self, first: usize, count: usize) -> bool {
        let next = first + count;
        if count == 0 || next >= self.pages {
            return false;
        }
        let (s, sp) = self.home(first);
        self.home(next) == (s, sp + count)
    }

    /// The unit holding `page` at set count `set`: (first page, page count).
    pub fn unit(&self, page: usize, set: usize) -> (usize, usize) {
        let first = page & !(set - 1);
        (first, set.min(self.pages - first))
    }
}

/// The read-ahead window after a fault: doubled (from 2) while faults continue a sequential
/// run, up to `max` units; back to 0 on any other fault.
pub fn next_window(window: usize, sequential: bool, max: usize) -> usize {
    if sequential && max > 0 {
        (window * 2).max(2).min(max)
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Every page has exactly one home slot, inside its server's region, and a unit of
        /// any allowed set count maps to one server and contiguous server pages.
        #[test]
        fn homes_are_a_bijection_and_units_stay_whole(blocks in 1usize..40, servers in 1usize..5, shift in 0u32..4) {
            let max_set = 8;
            let l = Layout::new(blocks * max_set * 4096, 4096, max_set, servers);
            let mut seen = std::collections::HashSet::new();
            for p in 0..l.pages {
                let (s, sp) = l.home(p);
                prop_assert!(sp < l.region_pages(s));
                prop_assert!(seen.insert((s, sp)));
            }
            let total: usize = (0..servers).map(|s| l.region_pages(s)).sum();
            prop_assert_eq!(total, l.pages);
            let set = 1usize << shift;
            for p in 0..l.pages {
                let (first, count) = l.unit(p, set);
                prop_assert!(first <= p && p < first + count);
                let (s0, sp0) = l.home(first);
                for i in 0..count {
                    prop_assert_eq!(l.home(first + i), (s0, sp0 + i));
                }
            }
        }
    }

    proptest! {
        /// Units joined while each continues the run at its home (`continues_on_home`, as
        /// read-ahead groups them into one READ) are one contiguous range of one server's
        /// pages; with one server every run continues up to the allocation's end.
        #[test]
        fn runs_continued_on_their_home_stay_one_contiguous_range(
            blocks in 1usize..40,
            servers in 1usize..4,
            shift in 0u32..4,
            start in 0usize..320,
            units in 1usize..16,
        ) {
            let l = Layout::new(blocks * 8 * 4096, 4096, 8, servers);
            let set = 1usize << shift;
            prop_assume!(start < l.pages);
            let (first, mut count) = l.unit(start, set);
            for _ in 1..units {
                let joins = l.continues_on_home(first, count);
                if servers == 1 {
                    prop_assert_eq!(joins, first + count < l.pages);
                }
                if !joins {
                    break;
                }
                count += l.unit(first + count, set).1;
            }
            let (s, sp) = l.home(first);
            for i in 0..count {
                prop_assert_eq!(l.home(first + i), (s, sp + i));
            }
        }
    }

    #[test]
    fn runs_go_on_across_blocks_only_on_one_server() {
        let one = Layout::new(4 * 8 * 4096, 4096, 8, 1);
        assert!(one.continues_on_home(0, 8) && one.continues_on_home(8, 16));
        assert!(!one.continues_on_home(24, 8), "nothing after the last page");
        let two = Layout::new(4 * 8 * 4096, 4096, 8, 2);
        assert!(two.continues_on_home(0, 4), "inside block 0");
        assert!(!two.continues_on_home(0, 8), "block 1 lives on the other server");
        assert!(!two.continues_on_home(3, 0), "an empty run continues nothing");
    }

    #[test]
    fn window_grows_on_runs_and_resets() {
        assert_eq!(next_window(0, true, 32), 2);
        assert_eq!(next_window(16, true, 32), 32);
        assert_eq!(next_window(32, true, 32), 32);
        assert_eq!(next_window(8, false, 32), 0);
        assert_eq!(next_window(0, true, 1), 1);
        assert_eq!(next_window(4, true, 0), 0);
    }

    #[test]
    fn rounds_up_to_whole_blocks() {
        let l = Layout::new(1, 16384, 8, 2);
        assert_eq!(l.pages, 8);
        assert_eq!(l.region_pages(0), 8);
        assert_eq!(l.region_pages(1), 0);
    }
}
