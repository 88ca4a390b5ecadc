//! Units the kernel will not let go: pages it holds pinned cannot be moved, and UFFDIO_MOVE
//! refuses them with EBUSY (mm/userfaultfd.c: a folio that may be DMA-pinned, or one no longer
//! the process's alone). Pins come from another process's process_vm_readv/writev — Open
//! MPI's shared-memory transport copies between ranks on one host that way (CMA) — from
//! O_DIRECT I/O in flight, and from io_uring's registered buffers, which stay pinned until
//! unregistered.
//!
//! Such a unit stays resident, and the CLOCK hand goes on to another. Moving it anyway is not
//! possible, and dropping it would be wrong: a pinned page may be written through its pin
//! after the runtime read it (another rank's process_vm_writev into a receive buffer), and the
//! write would land in a page the program no longer maps. Waiting for the pin to go is not
//! possible either: a process_vm_readv holds some pages pinned while it waits for a fault on
//! the next one, which this very thread serves.
//!
//! A refused unit is kept dirty (written back again when it goes, so that nothing written
//! through a pin is lost) and open for writing: a dirty unit with write-protected pages would
//! fault for ever.

use std::sync::atomic::{AtomicBool, Ordering};

use pagewise_kernel::mem::{madvise, page_size, Advice};

use super::evict::{free_frames, present_count};
use super::journal::{self, Op};
use super::{is_live, is_resident, Entry, Inner, State, NONE};

impl Inner {
    /// The kernel refused (EBUSY) to move `[view, view + len)` of a program's view to
    /// `[shadow, shadow + len)`, the same offsets of its area's shadow, in a `Run` whose
    /// units' bookkeeping was made: evicted units (their data at home: written back, or clean)
    /// and armed ones. Everything from `view` on is still in the view; what went before the
    /// refusal stays moved, except the part of a base page or of an armed unit that `view`
    /// cuts, which is moved back. The evicted units' pages become resident units of one base
    /// page each; the armed units are resident as they were, their second chance taken back.
    pub(super) fn keep_refused(&self, st: &mut State, view: usize, shadow: usize, len: usize) {
        let b = self.cfg.base_page;
        let uffd = self.uffd.as_ref().expect("shadow areas have a uffd");
        // Areas may lie inside one another's span (`fault.rs`): the range is the one it is
        // live in.
        let ai = st
            .areas
            .iter()
            .position(|a| {
                a.as_ref()
                    .is_some_and(|a| view >= a.addr && view < a.addr + a.len && is_live(a.slot[(view - a.addr) / b]))
            })
            .expect("a refused move is of an area's view");
        let a_addr = st.areas[ai].as_ref().expect("live").addr;
        let (p0, p1) = ((view - a_addr) / b, (view + len - a_addr).div_ceil(b));
        let bring_back = |from_page: usize| {
            let (at, n) = (a_addr + from_page * b, view - (a_addr + from_page * b));
            let sh = shadow - n;
            if let Err(err) = uffd.move_pages(at, sh, n, true, false) {
                journal::fatal(
                    &[(at, n), (sh, n)],
                    format_args!("pagewise dlm: moving {at:#x}+{n:#x} back from the shadow failed: {err}"),
                );
            }
            journal::record(Op::MoveIn, at, sh, n);
        };
        let mut p = p0;
        while p < p1 {
            let slot = st.areas[ai].as_ref().expect("live").slot[p];
            if is_resident(slot) {
                let e = st.clock.get_mut(slot as usize).expect("live slot");
                debug_assert!(e.armed, "a resident unit in a refused move is an armed one");
                let (first, count) = (e.first as usize, e.count as usize);
                e.armed = false;
                if first * b + a_addr < view {
                    // Its head went to the shadow; moved back, those pages are writable.
                    bring_back(first);
                    let was_protected = !e.dirty && e.clean_hash.is_none();
                    e.dirty = true;
                    e.clean_hash = None;
                    if was_protected {
                        self.unprotect(a_addr + first * b, count * b);
                    }
                }
                st.clock.touch(slot as usize);
                st.stats.pinned_kept_bytes += (count * b) as u64;
                p = first + count;
            } else if slot == NONE {
                if p == p0 && a_addr + p * b < view {
                    bring_back(p);
                }
                // A page not wholly in the view would fault as a resident one, for ever: it
                // stays evicted (its data is at home), what is there of it dropped.
                if present_count(a_addr + p * b, b) * page_size() < b {
                    if let Err(err) = madvise(a_addr + p * b, b, Advice::DontNeed) {
                        crate::fatal(format_args!("pagewise dlm: dropping {:#x}+{b:#x} failed: {err}", a_addr + p * b));
                    }
                    p += 1;
                    continue;
                }
                let entry =
                    Entry { area: ai as u32, first: p as u32, count: 1, dirty: true, clean_hash: None, armed: false };
                let Some(s) = st.clock.insert(entry) else {
                    crate::fatal(format_args!("pagewise dlm: internal error: clock full"));
                };
                st.areas[ai].as_mut().expect("live").slot[p] = s as u32;
                st.resident += b;
                st.stats.pinned_kept_bytes += b as u64;
                self.unprotect(a_addr + p * b, b);
                p += 1;
            } else {
                journal::fatal(
                    &[(view, len)],
                    format_args!(
                        "pagewise dlm: internal error: page {p} of a refused move is neither evicted nor armed"
                    ),
                );
            }
        }
        // Frames kept at the evicted units' places hold nothing now.
        let place = shadow - (view - (a_addr + p0 * b));
        if let Some((addr, n)) = st.frames.remove_within(place, (p1 - p0) * b, free_frames) {
            free_frames(addr, n);
        }
        journal::record(Op::Pinned, shadow, view, len);
        tell_once();
    }

    /// The kernel refused (EBUSY) to move the unit `e` at `[start, start + len)` to its place
    /// in the shadow `sh` after `moved` bytes, as it was being evicted (`Inner::evict_unit`,
    /// taken off the CLOCK already): move those back and put the unit back, resident and
    /// referenced. A unit moved first is dirty or hashed, so open for writing: as it was.
    pub(super) fn keep_unit(&self, st: &mut State, mut e: Entry, start: usize, sh: usize, len: usize, moved: usize) {
        let uffd = self.uffd.as_ref().expect("shadow areas have a uffd");
        if moved > 0 {
            if let Err(err) = uffd.move_pages(start, sh, moved, true, false) {
                journal::fatal(
                    &[(start, len), (sh, len)],
                    format_args!("pagewise dlm: moving {start:#x}+{moved:#x} back from the shadow failed: {err}"),
                );
            }
            journal::record(Op::MoveIn, start, sh, moved);
            if !e.dirty && e.clean_hash.is_none() {
                e.dirty = true;
                self.unprotect(start, len);
            }
        }
        let Some(slot) = st.clock.insert(e) else {
            crate::fatal(format_args!("pagewise dlm: internal error: clock full"));
        };
        let (first, count) = (e.first as usize, e.count as usize);
        st.areas[e.area as usize].as_mut().expect("live").slot[first..first + count]
            .iter_mut()
            .for_each(|s| *s = slot as u32);
        st.stats.evictions -= 1;
        st.stats.pinned_kept_bytes += len as u64;
        journal::record(Op::Pinned, sh, start, len);
        tell_once();
    }
}

/// Say once per process that pinned pages stay: they may hold local memory past its limit.
fn tell_once() {
    static TOLD: AtomicBool = AtomicBool::new(false);
    if !TOLD.swap(true, Ordering::Relaxed) {
        crate::note(format_args!(
            "pagewise dlm: pages the kernel holds pinned (another process's process_vm_readv/writev, O_DIRECT \
             I/O, io_uring's registered buffers) cannot be evicted: they stay resident while pinned, past the \
             local limit if need be"
        ));
    }
}

/// Whether a failed UFFDIO_MOVE was refused because a page is pinned (or shared).
pub(super) fn is_pinned_refusal(err: &pagewise_kernel::Error) -> bool {
    err.errno() == Some(libc::EBUSY)
}
