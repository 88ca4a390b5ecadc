//! Areas made and unmade: the program's view (anonymous, memfd-backed or SIGSEGV-staged), the
//! runtime's own mappings beside it (shadow, alias, private view), the userfaultfd
//! registration, and the regions on the servers.

use pagewise_kernel::mem::{
    madvise, memfd_create, mprotect, munmap, Advice, MapOptions, Mapping, Protection, HUGE_PMD,
};
use pagewise_kernel::uffd::RegisterMode;

use super::{is_live, is_resident, Access, Area, Dlm, Inner, MemfdView, State, DETACHED, GONE, NONE};
use crate::config::FaultMode;
use crate::layout::Layout;
use crate::proto::{Header, Opcode};
use crate::DlmError;

impl Dlm {
    pub(super) fn alloc_inner(&self, len: usize, at: Option<usize>) -> Result<*mut u8, DlmError> {
        if len == 0 {
            return Err(DlmError::Config("zero-length allocation".into()));
        }
        let cfg = &self.inner.cfg;
        let mut st = self.inner.lock();
        self.inner.drain_all(&mut st);
        let layout = Layout::new(len, cfg.base_page, cfg.max_set as usize, st.conns.len());
        // The servers hold whole blocks (`layout.rs`); the program's view is what it asked
        // for, in whole base pages, and the pages beyond it are GONE from the start: a
        // program that unmaps what it mapped leaves nothing of the area behind.
        let bytes = len.div_ceil(cfg.base_page) * cfg.base_page;
        let full = layout.pages * cfg.base_page;
        if layout.pages >= DETACHED as usize {
            return Err(DlmError::Config(format!("allocation of {len} bytes has too many pages")));
        }
        // Everything that talks to the servers or maps the runtime's own memory comes before
        // the view: at a fixed address (`alloc_at`) the view replaces memory the caller writes
        // back only afterwards (a program's static data under `--bss`, which libc reads).
        let anonymous = at.is_some() || (self.inner.mode != FaultMode::Sigsegv && !self.inner.memfd);
        let shadow = if self.inner.moving && anonymous {
            // One page more, kept inaccessible, so that no other area's shadow lies right after
            // this one. Kept frames, page moves and move-ins are joined when adjacent
            // (`Frames::push`, `Run`, `MoveIns`); joined across two shadows they would name two
            // mappings, which one UFFDIO_MOVE refuses (EINVAL).
            let guard = pagewise_kernel::mem::page_size();
            let m = Mapping::anonymous(full + guard, &MapOptions { noreserve: true, ..Default::default() })?;
            mprotect(m.addr() + full, guard, Protection::None)?;
            madvise(m.addr(), full, Advice::NoHugePage)?;
            // A fork's copy-on-write pages cannot be moved; the child has no use for them.
            madvise(m.addr(), full, Advice::DontFork)?;
            // UFFDIO_MOVE needs its destination registered; WP mode only, so that receiving
            // into a not yet populated part is an ordinary fault the kernel serves itself.
            let uffd = self.inner.uffd.as_ref().expect("moving implies a uffd");
            uffd.register(m.addr(), full, RegisterMode { missing: false, write_protect: true, minor: false })?;
            Some(m)
        } else {
            None
        };
        let mut regions = vec![0u32; st.conns.len()];
        for s in 0..st.conns.len() {
            let pages = layout.region_pages(s);
            if pages == 0 {
                continue;
            }
            let mut h = Header::request(Opcode::Alloc, 0);
            h.page = pages as u64;
            h.length = 4;
            let payload = (cfg.base_page as u32).to_le_bytes();
            let rep = match st.call(s, h, &payload) {
                Ok(rep) => rep,
                Err(e) => {
                    // Give back what was reserved on the servers before this one.
                    self.inner.free_regions(&mut st, &regions);
                    return Err(e);
                }
            };
            regions[s] = rep.region;
        }
        let (view, staging, alias) = match self.make_view(at, bytes, full) {
            Ok(v) => v,
            Err(e) => {
                self.inner.free_regions(&mut st, &regions);
                return Err(e);
            }
        };
        // From here the area owns the view: `free_locked` unmaps what is left of it.
        let (addr, _) = view.into_raw();
        let addr = addr as usize;
        let mut slot = vec![NONE; layout.pages];
        slot[bytes / cfg.base_page..].iter_mut().for_each(|s| *s = GONE);
        let area = Area {
            addr,
            len: full,
            layout,
            regions,
            slot,
            home_written: vec![false; layout.pages],
            touched: vec![0u64; layout.pages.div_ceil(64)],
            last_end: usize::MAX,
            window: 0,
            view_len: bytes,
            access: Access::Normal,
            staging,
            alias,
            shadow,
        };
        // A freed slot is reused: free_locked drained every reply and CLOCK entry naming it.
        match st.areas.iter().position(|a| a.is_none()) {
            Some(i) => st.areas[i] = Some(area),
            None => st.areas.push(Some(area)),
        }
        st.stats.areas += 1;
        crate::signals::publish(addr, bytes);
        Ok(addr as *mut u8)
    }

    /// The program's view of a new area of `bytes` (the layout's `full` bytes behind it): at
    /// `at`, replacing what is there, or where the kernel places it; with the memfd views of
    /// the zero-copy and SIGSEGV modes. Registered with the userfaultfd, not inherited by
    /// fork when so configured.
    fn make_view(
        &self,
        at: Option<usize>,
        bytes: usize,
        full: usize,
    ) -> Result<(Mapping, Option<MemfdView>, Option<MemfdView>), DlmError> {
        let cfg = &self.inner.cfg;
        let (view, staging, alias): (Mapping, Option<MemfdView>, Option<MemfdView>) = if let Some(addr) = at {
            let opts = MapOptions { noreserve: true, ..Default::default() };
            // SAFETY: alloc_at's contract: the caller owns [addr, addr+len), and bytes == len
            // (len is whole base pages).
            let view = unsafe { Mapping::anonymous_at(addr, bytes, &opts) }?;
            madvise(view.addr(), bytes, Advice::NoHugePage)?;
            let uffd = self.inner.uffd.as_ref().expect("userfaultfd modes have a uffd");
            uffd.register(view.addr(), bytes, RegisterMode { missing: true, write_protect: true, minor: false })?;
            (view, None, None)
        } else if self.inner.mode == FaultMode::Sigsegv {
            let fd = memfd_create("pagewise-dlm", None)?;
            pagewise_kernel::mem::ftruncate(&fd, full as u64)?;
            let view =
                Mapping::of_fd(&fd, bytes, 0, &MapOptions { shared: true, no_access: true, ..Default::default() })?;
            let stage = Mapping::of_fd(&fd, full, 0, &MapOptions { shared: true, ..Default::default() })?;
            (view, Some((stage, fd)), None)
        } else if self.inner.memfd {
            let fd = memfd_create("pagewise-dlm", None)?;
            pagewise_kernel::mem::ftruncate(&fd, full as u64)?;
            let shared = MapOptions { shared: true, ..Default::default() };
            let view = Mapping::of_fd(&fd, bytes, 0, &shared)?;
            madvise(view.addr(), bytes, Advice::NoHugePage)?;
            let alias = Mapping::of_fd(&fd, full, 0, &shared)?;
            madvise(alias.addr(), full, Advice::NoHugePage)?;
            let uffd = self.inner.uffd.as_ref().expect("userfaultfd modes have a uffd");
            uffd.register(view.addr(), bytes, RegisterMode { missing: true, write_protect: true, minor: true })?;
            (view, None, Some((alias, fd)))
        } else {
            // Aligned like the kernel aligns large anonymous mappings (for THP), so that an
            // allocator asking for an aligned chunk gets it without trimming.
            let align = (bytes >= HUGE_PMD).then_some(HUGE_PMD);
            let view = Mapping::anonymous(bytes, &MapOptions { noreserve: true, align, ..Default::default() })?;
            madvise(view.addr(), bytes, Advice::NoHugePage)?;
            let uffd = self.inner.uffd.as_ref().expect("userfaultfd modes have a uffd");
            uffd.register(view.addr(), bytes, RegisterMode { missing: true, write_protect: true, minor: false })?;
            (view, None, None)
        };
        if cfg.dont_fork {
            madvise(view.addr(), bytes, Advice::DontFork)?;
            for (m, _) in staging.iter().chain(alias.iter()) {
                madvise(m.addr(), full, Advice::DontFork)?;
            }
        }
        Ok((view, staging, alias))
    }
}

impl Inner {
    pub(super) fn free_locked(&self, st: &mut State, addr: usize) -> Result<(), DlmError> {
        // Two areas may start at `addr`: one made where the program had unmapped the head of
        // another, whose tail it still uses. The one freed is the one whose first page is still
        // DLM's (else whose first page the program took out of DLM, `Dlm::detach`), never the
        // older one: freeing that would unmap the tail under the program.
        let starts_here = |first_page: fn(u32) -> bool| {
            st.areas.iter().position(|a| a.as_ref().is_some_and(|a| a.addr == addr && first_page(a.slot[0])))
        };
        let idx = starts_here(is_live)
            .or_else(|| starts_here(|s| s != GONE))
            .ok_or_else(|| DlmError::Config(format!("{addr:#x} is not a DLM area")))?;
        self.drain_all(st);
        // Drop the area's clock entries.
        let pages = st.areas[idx].as_ref().map(|a| a.layout.pages).unwrap_or(0);
        for p in 0..pages {
            let s = st.areas[idx].as_ref().map(|a| a.slot[p]).unwrap_or(NONE);
            if is_resident(s) {
                if let Some(e) = st.clock.remove(s as usize) {
                    st.resident -= e.count as usize * self.cfg.base_page;
                    for q in e.first..e.first + e.count {
                        st.areas[idx].as_mut().expect("present").slot[q as usize] = NONE;
                    }
                }
            }
        }
        let area = st.areas[idx].take().expect("present");
        // What is left of the program's view: the program may have unmapped parts of it
        // (`Dlm::unmap`) and mapped other things there, or taken parts over (`Dlm::detach`).
        for (first, count) in live_runs(&area.slot, 0, area.view_len / self.cfg.base_page) {
            let (start, len) = (area.addr + first * self.cfg.base_page, count * self.cfg.base_page);
            if let Some(u) = &self.uffd {
                let _ = u.unregister(start, len);
            }
            // SAFETY: a live run of the view, which the area owns (`alloc_inner`); nothing
            // else uses it once the program freed the area.
            if let Err(e) = unsafe { munmap(start, len) } {
                eprintln!("pagewise dlm: unmapping {start:#x}+{len:#x} of a freed area failed: {e}");
            }
        }
        self.release_area(st, area)
    }

    /// Free the regions `regions` (0: none on that server) on the servers, best effort: for
    /// an area that could not be made.
    fn free_regions(&self, st: &mut State, regions: &[u32]) {
        for (s, &r) in regions.iter().enumerate() {
            if r != 0 {
                let mut f = Header::request(Opcode::Free, 0);
                f.region = r;
                let _ = st.call(s, f, &[]);
            }
        }
    }

    /// Give back what an area holds besides its view: its kept frames (the shadow goes with
    /// `area`) and its regions on the servers.
    pub(super) fn release_area(&self, st: &mut State, area: Area) -> Result<(), DlmError> {
        crate::signals::withdraw(area.addr);
        // The FREEs below are synchronous: the replies owed before them are taken first.
        self.drain_all(st);
        if let Some(sh) = &area.shadow {
            // Unmapped with the area below.
            // Runs never reach past a shadow (its guard page): nothing spills.
            let _ = st.frames.remove_within(sh.addr(), area.len, |_, _| {});
        }
        st.stats.areas -= 1;
        for (s, &r) in area.regions.iter().enumerate() {
            if r != 0 {
                let mut h = Header::request(Opcode::Free, 0);
                h.region = r;
                st.call(s, h, &[])?;
            }
        }
        drop(area);
        Ok(())
    }
}

/// The maximal runs `(first page, count)` of pages in `[from, to)` that DLM still serves
/// (neither GONE nor DETACHED).
pub(super) fn live_runs(slot: &[u32], from: usize, to: usize) -> Vec<(usize, usize)> {
    let mut runs = Vec::new();
    let mut p = from;
    while p < to {
        if !is_live(slot[p]) {
            p += 1;
            continue;
        }
        let start = p;
        while p < to && is_live(slot[p]) {
            p += 1;
        }
        runs.push((start, p - start));
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_runs_skip_gone_and_detached_pages() {
        let slot = [NONE, 3, GONE, GONE, NONE, DETACHED, 7, 7, GONE];
        assert_eq!(live_runs(&slot, 0, slot.len()), vec![(0, 2), (4, 1), (6, 2)]);
        assert_eq!(live_runs(&slot, 1, 7), vec![(1, 1), (4, 1), (6, 1)]);
        assert_eq!(live_runs(&slot, 2, 4), vec![]);
    }
}
