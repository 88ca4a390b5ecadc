//! Calls on part of an area, each with the meaning Linux gives it on private anonymous memory:
//! what keeps an unmodified program and its allocator correct on DLM memory (preload/shim.c
//! forwards the program's `madvise`, `munmap`, `mprotect`, `mremap` and `MAP_FIXED` here).
//!
//! - [`Dlm::discard`] — `MADV_DONTNEED` / `MADV_FREE`: the range reads as zeros from now on.
//!   Its local pages are dropped without a write-back and its homes forget it (DISCARD), so an
//!   allocator that purges free memory gives the servers' memory back too.
//! - [`Dlm::unmap`] — a partial `munmap`: the range is unmapped and forgotten (its pages GONE);
//!   the area goes once nothing of it is left.
//! - [`Dlm::detach`] — the range leaves DLM with its data: it becomes ordinary private
//!   anonymous memory at the same address. For what DLM cannot honour in place: a range made
//!   read-only or inaccessible (`mprotect`): UFFDIO_MOVE and UFFDIO_COPY need the view
//!   writable, and the kernel then enforces the protection on plain memory as it always does.
//! - [`Dlm::prefetch`] — `MADV_WILLNEED`; [`Dlm::set_access`] — `MADV_SEQUENTIAL` /
//!   `MADV_RANDOM` / `MADV_NORMAL`, which steer read-ahead as they steer the kernel's.
//!
//! A page that is GONE or DETACHED is no longer DLM's: nothing here or in the fault path
//! touches its address again, since the program (or the kernel, placing a new mapping) may
//! use it for anything.

use pagewise_kernel::mem::{madvise, move_mapping, munmap, Advice, MapOptions, Mapping};

use super::area::live_runs;
use super::evict::Run;
use super::remote::Pending;
use super::{is_live, is_resident, Access, Dlm, Inner, State, DETACHED, GONE, NONE};
use crate::proto::{Header, Opcode};
use crate::DlmError;

impl Dlm {
    /// `[addr, addr + len)` reads as zeros from now on (`MADV_DONTNEED`, `MADV_FREE`): local
    /// pages are dropped without a write-back and the homes' copies forgotten. Bytes of a base
    /// page only partly inside the range are zeroed in place.
    pub fn discard(&self, addr: usize, len: usize) -> Result<(), DlmError> {
        let b = self.inner.cfg.base_page;
        let end = end_of(addr, len)?;
        let mut edges = Vec::new();
        {
            let mut st = self.inner.lock();
            self.inner.check_owner()?;
            self.inner.drain_all(&mut st);
            for (ai, p0, p1) in overlapping(&st, b, addr, end, Round::In) {
                let base = st.areas[ai].as_ref().expect("live").addr;
                let (from, to) = (addr.max(base), end.min(base + st.areas[ai].as_ref().expect("live").len));
                if p0 < p1 {
                    self.inner.forget(&mut st, ai, p0, p1);
                    edges.extend([(from, base + p0 * b), (base + p1 * b, to)]);
                } else {
                    edges.push((from, to));
                }
            }
            // The partial base pages at the ends, where they are DLM's: zeroed below, once
            // the lock is free to serve their faults.
            edges.retain(|&(from, to)| from < to && self.inner.is_ours(&st, from));
        }
        for (from, to) in edges {
            // SAFETY: the bytes lie in a live page of an area, ordinary read-write memory to
            // the program; the caller gave up their content.
            unsafe { std::ptr::write_bytes(from as *mut u8, 0, to - from) };
        }
        Ok(())
    }

    /// Unmap `[addr, addr + len)` (whole base pages), as a `munmap` of part of an area does:
    /// its local pages and the homes' copies are dropped, the view's range unmapped, and an
    /// area of which nothing is left is freed.
    pub fn unmap(&self, addr: usize, len: usize) -> Result<(), DlmError> {
        self.unmap_range(addr, len, false)
    }

    /// As [`Dlm::unmap`], but the range stays mapped (as plain memory, its pages dropped) for
    /// the caller to map something over it at once (`MAP_FIXED`): no other thread's mmap can
    /// take the range in between.
    pub fn forget(&self, addr: usize, len: usize) -> Result<(), DlmError> {
        self.unmap_range(addr, len, true)
    }

    fn unmap_range(&self, addr: usize, len: usize, leave_mapped: bool) -> Result<(), DlmError> {
        let b = self.inner.cfg.base_page;
        let end = end_of(addr, len)?;
        let mut st = self.inner.lock();
        self.inner.check_owner()?;
        let areas = overlapping(&st, b, addr, end, Round::Out);
        if areas != overlapping(&st, b, addr, end, Round::In) {
            return Err(DlmError::Config(format!("unmap of {addr:#x}+{len:#x}: not whole base pages of {b} bytes")));
        }
        self.inner.drain_all(&mut st);
        for (ai, p0, p1) in areas {
            self.inner.forget(&mut st, ai, p0, p1);
            let a = st.areas[ai].as_mut().expect("live");
            for (first, count) in live_runs(&a.slot, p0, p1) {
                let (start, n) = (a.addr + first * b, count * b);
                if leave_mapped {
                    if let Some(u) = &self.inner.uffd {
                        u.unregister(start, n)?;
                    }
                } else {
                    // SAFETY: a live run of the area's view, which the area owns; the program
                    // unmaps it and will not touch it again. Its userfaultfd registration
                    // goes with it.
                    unsafe { munmap(start, n) }?;
                }
                a.slot[first..first + count].iter_mut().for_each(|s| *s = GONE);
            }
            self.inner.punch_backing(&st, ai, p0, p1)?;
            self.inner.free_if_empty(&mut st, ai)?;
        }
        Ok(())
    }

    /// Take `[addr, addr + len)`, rounded out to whole base pages, out of DLM with its data:
    /// from now on it is ordinary private anonymous memory at the same address. Every unit
    /// touching it goes home first; the range is then rebuilt from the homes in a fresh
    /// mapping and moved over the view in one step, so a thread touching it meanwhile sees
    /// the old mapping or the new one, never a gap (`move_mapping`).
    pub fn detach(&self, addr: usize, len: usize) -> Result<(), DlmError> {
        let b = self.inner.cfg.base_page;
        let end = end_of(addr, len)?;
        let mut st = self.inner.lock();
        self.inner.check_owner()?;
        self.inner.drain_all(&mut st);
        for (ai, p0, p1) in overlapping(&st, b, addr, end, Round::Out) {
            self.inner.evict_range(&mut st, ai, p0, p1);
            // The write-backs just sent are answered before the synchronous READs below.
            self.inner.drain_all(&mut st);
            let runs = live_runs(&st.areas[ai].as_ref().expect("live").slot, p0, p1);
            for (first, count) in runs {
                let start = st.areas[ai].as_ref().expect("live").addr + first * b;
                let n = count * b;
                let copy = Mapping::anonymous(n, &MapOptions::default())?;
                self.inner.fetch_into(&mut st, ai, first, count, copy.addr())?;
                let (from, _) = copy.into_raw();
                // SAFETY: `from` is the fresh mapping just given up; the view's run is the
                // area's, handed over to the program as plain memory.
                if let Err(e) = unsafe { move_mapping(from as usize, start, n) } {
                    // SAFETY: still ours: the move did not happen.
                    let _ = unsafe { munmap(from as usize, n) };
                    return Err(e.into());
                }
                let a = st.areas[ai].as_mut().expect("live");
                a.slot[first..first + count].iter_mut().for_each(|s| *s = DETACHED);
                // A thread that faulted on the old view waits for the handler thread; it
                // finds the page DETACHED and retries on the new mapping.
                if let Some(u) = &self.inner.uffd {
                    let _ = u.wake(start, n);
                }
            }
            self.inner.forget_at_home(&mut st, ai, p0, p1);
            self.inner.punch_backing(&st, ai, p0, p1)?;
            self.inner.free_if_empty(&mut st, ai)?;
        }
        Ok(())
    }

    /// Fetch the units of `[addr, addr + len)` ahead of use (`MADV_WILLNEED`), as read-ahead:
    /// their requests leave now, their replies are installed as the program reaches them.
    /// At most a quarter of the local limit is requested, like read-ahead.
    pub fn prefetch(&self, addr: usize, len: usize) -> Result<(), DlmError> {
        let b = self.inner.cfg.base_page;
        let end = end_of(addr, len)?;
        let mut st = self.inner.lock();
        self.inner.check_owner()?;
        let set = st.set_count as usize;
        let mut budget = self.inner.cfg.local_mem / 4;
        let mut group = None;
        for (ai, p0, p1) in overlapping(&st, b, addr, end, Round::Out) {
            let layout = st.areas[ai].as_ref().expect("live").layout;
            let mut p = p0;
            while p < p1 && budget >= set * b {
                let (first, count) = layout.unit(p, set);
                if st.areas[ai].as_ref().expect("live").slot[first..first + count].contains(&NONE) {
                    self.inner.request_ahead(&mut st, ai, first, count, &mut group);
                    budget -= set * b;
                }
                p = first + count;
            }
        }
        self.inner.request_group(&mut st, &mut group);
        for s in 0..st.conns.len() {
            st.flush(s, addr, len);
        }
        Ok(())
    }

    /// Which base pages of `[addr, addr + len)` may hold data (`out[i]` = 1 for the i-th page
    /// from `addr`) and which read as zeros for sure (0: neither in memory nor ever written
    /// home), as mincore(2) reports its pages: what a copy for a child made by fork need not
    /// carry (preload/fork.c). Pages that are not DLM's count as data. `addr` is base-page
    /// aligned and `out` has a byte for each base page the range touches.
    pub fn holds_data(&self, addr: usize, len: usize, out: &mut [u8]) -> Result<(), DlmError> {
        let b = self.inner.cfg.base_page;
        let end = end_of(addr, len)?;
        if !addr.is_multiple_of(b) || out.len() < len.div_ceil(b) {
            return Err(DlmError::Config(format!(
                "holds_data: {addr:#x} is not base-page aligned or {} bytes are too few for {len:#x}",
                out.len()
            )));
        }
        out.fill(1);
        let st = self.inner.lock();
        self.inner.check_owner()?;
        for (ai, p0, p1) in overlapping(&st, b, addr, end, Round::In) {
            let a = st.areas[ai].as_ref().expect("live");
            for p in p0..p1 {
                if a.slot[p] == NONE && !a.home_written[p] {
                    out[(a.addr + p * b - addr) / b] = 0;
                }
            }
        }
        Ok(())
    }

    /// How the program will access the areas overlapping `[addr, addr + len)`
    /// (`MADV_SEQUENTIAL`, `MADV_RANDOM`, `MADV_NORMAL`): steers their read-ahead.
    pub fn set_access(&self, addr: usize, len: usize, access: Access) -> Result<(), DlmError> {
        let b = self.inner.cfg.base_page;
        let end = end_of(addr, len)?;
        let mut st = self.inner.lock();
        self.inner.check_owner()?;
        for (ai, _, _) in overlapping(&st, b, addr, end, Round::Out) {
            let a = st.areas[ai].as_mut().expect("live");
            a.access = access;
            a.window = 0;
        }
        Ok(())
    }
}

impl Inner {
    /// The runtime belongs to the process that started it: a child made by fork(2) must not
    /// send on its parent's connections or change its parent's areas (it has none of them:
    /// they are not inherited, `Config::dont_fork`).
    pub(super) fn check_owner(&self) -> Result<(), DlmError> {
        if std::process::id() == self.owner {
            Ok(())
        } else {
            Err(DlmError::NotOwner)
        }
    }

    /// Whether `addr` is in a live page of an area.
    fn is_ours(&self, st: &State, addr: usize) -> bool {
        let b = self.cfg.base_page;
        st.areas
            .iter()
            .flatten()
            .any(|a| addr >= a.addr && addr < a.addr + a.len && is_live(a.slot[(addr - a.addr) / b]))
    }

    /// Drop the pages `[p0, p1)` of area `ai` and their homes' copies: units wholly inside are
    /// dropped as they are, units reaching outside are evicted (written home when dirty: their
    /// other pages keep their data).
    fn forget(&self, st: &mut State, ai: usize, p0: usize, p1: usize) {
        self.for_units(st, ai, p0, p1, |inner, st, slot, inside, run| {
            if inside {
                inner.discard_unit(st, slot, run);
            } else {
                inner.evict_dropping(st, slot, run);
            }
        });
        self.forget_at_home(st, ai, p0, p1);
    }

    /// Evict every unit touching pages `[p0, p1)` of area `ai` (written home when dirty).
    fn evict_range(&self, st: &mut State, ai: usize, p0: usize, p1: usize) {
        self.for_units(st, ai, p0, p1, |inner, st, slot, _, run| inner.evict_dropping(st, slot, run));
    }

    /// Call `f(self, st, clock slot, wholly inside [p0, p1), run)` for each resident unit
    /// touching pages `[p0, p1)` of area `ai`; the run is flushed at the end.
    fn for_units(
        &self,
        st: &mut State,
        ai: usize,
        p0: usize,
        p1: usize,
        mut f: impl FnMut(&Inner, &mut State, usize, bool, &mut Run),
    ) {
        debug_assert!(st.conns.iter().all(|c| c.pending.is_empty()), "drained first: nothing in flight");
        let mut run = Run::new(self.uffd.as_ref());
        let mut p = p0;
        while p < p1 {
            let s = st.areas[ai].as_ref().expect("live").slot[p];
            if !is_resident(s) {
                p += 1;
                continue;
            }
            let e = *st.clock.get(s as usize).expect("live slot");
            let (first, count) = (e.first as usize, e.count as usize);
            f(self, st, s as usize, first >= p0 && first + count <= p1, &mut run);
            p = first + count;
        }
        self.flush_run(st, &mut run);
    }

    /// Tell the homes of pages `[p0, p1)` of area `ai` to forget what was written back there
    /// (DISCARD, one per block touched; replies are taken with the next ones owed), and
    /// remember that those pages read as zeros.
    pub(super) fn forget_at_home(&self, st: &mut State, ai: usize, p0: usize, p1: usize) {
        let b = self.cfg.base_page;
        let (layout, addr) = {
            let a = st.areas[ai].as_ref().expect("live");
            (a.layout, a.addr)
        };
        let mut p = p0;
        while p < p1 {
            let q = ((p / layout.max_set + 1) * layout.max_set).min(p1);
            let a = st.areas[ai].as_ref().expect("live");
            if a.home_written[p..q].contains(&true) {
                let (srv, spage) = layout.home(p);
                let mut h = Header::request(Opcode::Discard, 0);
                h.region = a.regions[srv];
                h.page = spage as u64;
                h.set_count = (q - p) as u32;
                let sent = st.send(srv, h, &[], addr + p * b, (q - p) * b);
                st.conns[srv].pending.push_back(Pending::Discard { area: ai as u32, first: p, count: q - p, sent });
                st.stats.discarded_bytes += ((q - p) * b) as u64;
            }
            p = q;
        }
        let a = st.areas[ai].as_mut().expect("live");
        a.home_written[p0..p1].iter_mut().for_each(|w| *w = false);
    }

    /// Pages `[first, first + count)` of area `ai` as the homes hold them, into `dst` (pages
    /// never written back are left as they are: zeros in a fresh mapping). Nothing may be
    /// owed on any connection (`drain_all`).
    fn fetch_into(&self, st: &mut State, ai: usize, first: usize, count: usize, dst: usize) -> Result<(), DlmError> {
        let b = self.cfg.base_page;
        let layout = st.areas[ai].as_ref().expect("live").layout;
        let mut p = first;
        while p < first + count {
            let q = ((p / layout.max_set + 1) * layout.max_set).min(first + count);
            let a = st.areas[ai].as_ref().expect("live");
            if a.home_written[p..q].contains(&true) {
                let (srv, spage) = layout.home(p);
                let mut h = Header::request(Opcode::Read, 0);
                h.region = a.regions[srv];
                h.page = spage as u64;
                h.set_count = (q - p) as u32;
                let rep = st.call_raw(srv, h, &[])?;
                let n = (q - p) * b;
                if rep.length as usize != n {
                    return Err(
                        st.lost(srv, std::io::Error::other(format!("READ reply of {} bytes, not {n}", rep.length)))
                    );
                }
                // SAFETY: `dst` is a fresh private mapping of count*b bytes owned by the
                // caller; [p - first, q - first) pages lie inside it.
                let into = unsafe { std::slice::from_raw_parts_mut((dst + (p - first) * b) as *mut u8, n) };
                st.conns[srv].t.recv_payload(into).map_err(|e| st.lost(srv, e))?;
            }
            p = q;
        }
        Ok(())
    }

    /// Free the memfd pages behind pages `[p0, p1)` of area `ai` (zero-copy and SIGSEGV
    /// areas: the view left, the page cache would keep them).
    fn punch_backing(&self, st: &State, ai: usize, p0: usize, p1: usize) -> Result<(), DlmError> {
        let b = self.cfg.base_page;
        let a = st.areas[ai].as_ref().expect("live");
        if let Some((m, _)) = a.alias.as_ref().or(a.staging.as_ref()) {
            if p1 > p0 {
                madvise(m.addr() + p0 * b, (p1 - p0) * b, Advice::Remove)?;
            }
        }
        Ok(())
    }

    /// Free area `ai` once none of its pages is DLM's any more (its view is gone already).
    fn free_if_empty(&self, st: &mut State, ai: usize) -> Result<(), DlmError> {
        if st.areas[ai].as_ref().expect("live").slot.iter().any(|&s| is_live(s)) {
            return Ok(());
        }
        let area = st.areas[ai].take().expect("live");
        self.release_area(st, area)
    }
}

/// `addr + len`, or an error when it wraps.
fn end_of(addr: usize, len: usize) -> Result<usize, DlmError> {
    addr.checked_add(len).ok_or_else(|| DlmError::Config(format!("range {addr:#x}+{len:#x} wraps around")))
}

/// Which pages of an area a byte range names: those it covers whole, or those it touches.
#[derive(Clone, Copy)]
enum Round {
    In,
    Out,
}

/// The areas overlapping `[lo, hi)`, with the page range of each the bytes name (`round`;
/// pages are counted from each area's start): `(area index, first page, end page)`.
fn overlapping(st: &State, b: usize, lo: usize, hi: usize, round: Round) -> Vec<(usize, usize, usize)> {
    st.areas
        .iter()
        .enumerate()
        .filter_map(|(i, a)| {
            let a = a.as_ref()?;
            let (from, to) = (lo.max(a.addr) - a.addr, hi.min(a.addr + a.len).checked_sub(a.addr)?);
            (from < to).then(|| match round {
                Round::In => (i, from.div_ceil(b), to / b),
                Round::Out => (i, from / b, to.div_ceil(b)),
            })
        })
        .collect()
}
