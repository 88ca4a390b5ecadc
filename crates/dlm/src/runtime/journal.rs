//! The runtime's journal: the last changes it made to where units' pages are — moved between
//! the program's view and the shadow, copied in, dropped, freed, kept as frames, borrowed,
//! received into — in a ring, so that an internal error ("installing … failed", pages found
//! in the shadow where none should be) is reported with the history of the pages concerned.
//! Where the bookkeeping slipped shows then, not only where it was caught.
//!
//! Recording is four relaxed stores and an atomic add; every change is made holding the
//! runtime's lock, which orders them. Nothing is allocated, here or when reporting: the fault
//! path may run in a signal handler.

use std::sync::atomic::{AtomicUsize, Ordering};

/// What happened to `[to, to + len)` (and `[from, from + len)`, when there is a source).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub(super) enum Op {
    /// A unit was armed: its view range `from` queued to move to its shadow place `to`.
    Arm = 1,
    /// A unit left: evicted or dropped (`from`: its view range; `to`: its shadow place
    /// where its frames go, 0 where they do not).
    Evict,
    /// Pages moved from the view `from` to the shadow `to` (UFFDIO_MOVE).
    ToShadow,
    /// Pages of the view `to` dropped (MADV_DONTNEED).
    Drop,
    /// Pages moved from the shadow `from` into the view `to` (UFFDIO_MOVE).
    MoveIn,
    /// Pages copied into the view `to` from `from` (UFFDIO_COPY).
    CopyIn,
    /// Kept frames moved within a shadow, from `from` to `to`.
    Gather,
    /// Fresh pages made at `to` in a shadow.
    Populate,
    /// Frames at `to` freed (MADV_DONTNEED on a shadow).
    Free,
    /// Frames at `to` kept for a later fetch.
    Keep,
    /// Kept frames at `to` borrowed by a reply (received there, see `Receive`).
    Borrow,
    /// Kept frames at `to`, a unit's own place, taken for it where they lie.
    TakeInPlace,
    /// A reply for the view range `from` received into `to`.
    Receive,
    /// Pages at `to` that no unit owned, freed before the view `from` moved there.
    Strays,
    /// An armed unit at view `to` referenced: mapped again from `from`.
    MapAgain,
    /// A move of the view `from` to the shadow `to` refused because pages were pinned: the
    /// units there kept resident (`pinned.rs`).
    Pinned,
}

impl Op {
    const ALL: [Op; 16] = [
        Op::Arm,
        Op::Evict,
        Op::ToShadow,
        Op::Drop,
        Op::MoveIn,
        Op::CopyIn,
        Op::Gather,
        Op::Populate,
        Op::Free,
        Op::Keep,
        Op::Borrow,
        Op::TakeInPlace,
        Op::Receive,
        Op::Strays,
        Op::MapAgain,
        Op::Pinned,
    ];

    fn name(self) -> &'static str {
        match self {
            Op::Arm => "arm",
            Op::Evict => "evict",
            Op::ToShadow => "move to shadow",
            Op::Drop => "drop",
            Op::MoveIn => "move in",
            Op::CopyIn => "copy in",
            Op::Gather => "gather frames",
            Op::Populate => "populate",
            Op::Free => "free frames",
            Op::Keep => "keep frames",
            Op::Borrow => "borrow frames",
            Op::TakeInPlace => "take frames in place",
            Op::Receive => "receive",
            Op::Strays => "free strays",
            Op::MapAgain => "map again",
            Op::Pinned => "kept, pinned",
        }
    }
}

/// One recorded change (0 in `op`: never written).
struct Slot {
    op: AtomicUsize,
    to: AtomicUsize,
    from: AtomicUsize,
    len: AtomicUsize,
}

impl Slot {
    const fn new() -> Slot {
        Slot { op: AtomicUsize::new(0), to: AtomicUsize::new(0), from: AtomicUsize::new(0), len: AtomicUsize::new(0) }
    }
}

/// A ring of the last `N` changes.
pub(super) struct Ring<const N: usize> {
    slots: [Slot; N],
    next: AtomicUsize,
}

/// A change as read back: its sequence number, what, where.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Event {
    pub(super) seq: usize,
    pub(super) op: Op,
    pub(super) to: usize,
    pub(super) from: usize,
    pub(super) len: usize,
}

impl Event {
    fn touches(&self, ranges: &[(usize, usize)]) -> bool {
        let hit = |at: usize| at != 0 && ranges.iter().any(|&(a, l)| at < a + l && a < at + self.len);
        hit(self.to) || hit(self.from)
    }
}

impl<const N: usize> Ring<N> {
    pub(super) const fn new() -> Self {
        Ring { slots: [const { Slot::new() }; N], next: AtomicUsize::new(0) }
    }

    pub(super) fn record(&self, op: Op, to: usize, from: usize, len: usize) {
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        let s = &self.slots[seq % N];
        s.to.store(to, Ordering::Relaxed);
        s.from.store(from, Ordering::Relaxed);
        s.len.store(len, Ordering::Relaxed);
        s.op.store(op as usize, Ordering::Relaxed);
    }

    /// The newest `out.len()` events (at most) touching any of `ranges`, oldest first, in
    /// `out`; returns how many.
    pub(super) fn touching(&self, ranges: &[(usize, usize)], out: &mut [Event]) -> usize {
        let next = self.next.load(Ordering::Relaxed);
        let mut found = 0;
        let mut seq = next;
        while seq > next.saturating_sub(N) && found < out.len() {
            seq -= 1;
            let s = &self.slots[seq % N];
            let Some(op) = Op::ALL.iter().copied().find(|&o| o as usize == s.op.load(Ordering::Relaxed)) else {
                continue;
            };
            let e = Event {
                seq,
                op,
                to: s.to.load(Ordering::Relaxed),
                from: s.from.load(Ordering::Relaxed),
                len: s.len.load(Ordering::Relaxed),
            };
            if e.touches(ranges) {
                out[found] = e;
                found += 1;
            }
        }
        out[..found].reverse();
        found
    }
}

/// Changes kept: about the last few hundred faults' worth.
const LEN: usize = 4096;
/// Events printed with an internal error at most.
const SHOWN: usize = 48;

static JOURNAL: Ring<LEN> = Ring::new();

/// Record a change (module doc).
pub(super) fn record(op: Op, to: usize, from: usize, len: usize) {
    JOURNAL.record(op, to, from, len);
}

/// Print the last changes touching any of `ranges` to stderr, oldest first: the history an
/// internal error is reported with.
pub(super) fn report(ranges: &[(usize, usize)]) {
    let mut events = [Event { seq: 0, op: Op::Arm, to: 0, from: 0, len: 0 }; SHOWN];
    let n = JOURNAL.touching(ranges, &mut events);
    crate::note(format_args!("pagewise dlm: the last {n} change(s) to those pages, oldest first:"));
    for e in &events[..n] {
        crate::note(format_args!("  #{} {} {:#x}+{:#x}{}", e.seq, e.op.name(), e.to, e.len, Fromwards(e.from)));
    }
}

/// " from 0x…" where there is a source.
struct Fromwards(usize);

impl std::fmt::Display for Fromwards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0 != 0 {
            write!(f, " from {:#x}", self.0)
        } else {
            Ok(())
        }
    }
}

/// Stop the program on an internal error, with the history of `ranges`.
pub(super) fn fatal(ranges: &[(usize, usize)], args: std::fmt::Arguments<'_>) -> ! {
    crate::note(args);
    report(ranges);
    std::process::abort()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none() -> Event {
        Event { seq: 0, op: Op::Arm, to: 0, from: 0, len: 0 }
    }

    #[test]
    fn events_touching_a_range_come_back_oldest_first() {
        let ring = Ring::<8>::new();
        ring.record(Op::Keep, 0x9000, 0, 0x1000);
        ring.record(Op::MoveIn, 0x1000, 0x9000, 0x1000);
        ring.record(Op::Drop, 0x5000, 0, 0x1000);
        ring.record(Op::ToShadow, 0x9000, 0x1000, 0x2000);
        let mut out = [none(); 4];
        let n = ring.touching(&[(0x9800, 0x100)], &mut out);
        let ops: Vec<(usize, Op)> = out[..n].iter().map(|e| (e.seq, e.op)).collect();
        assert_eq!(ops, [(0, Op::Keep), (1, Op::MoveIn), (3, Op::ToShadow)]);
        assert_eq!(ring.touching(&[(0x2000, 0x1000)], &mut out), 1, "the move's second page");
        assert_eq!(ring.touching(&[(0x3000, 0x1000)], &mut out), 0, "an address 0 is no source");
    }

    #[test]
    fn the_ring_keeps_the_newest_and_the_caller_bounds_how_many() {
        let ring = Ring::<4>::new();
        for i in 0..10 {
            ring.record(Op::Free, 0x1000, 0, 0x1000 + i);
        }
        let mut out = [none(); 8];
        let n = ring.touching(&[(0x1000, 1)], &mut out);
        assert_eq!(out[..n].iter().map(|e| e.seq).collect::<Vec<_>>(), [6, 7, 8, 9]);
        let mut two = [none(); 2];
        assert_eq!(ring.touching(&[(0x1000, 1)], &mut two), 2);
        assert_eq!((two[0].seq, two[1].seq), (8, 9), "the newest, oldest first");
    }
}
