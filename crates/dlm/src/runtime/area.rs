//! Areas made and unmade: the program's view (anonymous, memfd-backed or SIGSEGV-staged), the
//! runtime's own mappings beside it (shadow, alias, private view), the userfaultfd
//! registration, and the regions on the servers.

use pagewise_kernel::mem::{madvise, memfd_create, Advice, MapOptions, Mapping};
use pagewise_kernel::uffd::RegisterMode;

use super::{Area, Dlm, Inner, MemfdView, State, INFLIGHT, NONE};
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
        let bytes = layout.pages * cfg.base_page;
        if layout.pages >= INFLIGHT as usize {
            return Err(DlmError::Config(format!("allocation of {len} bytes has too many pages")));
        }
        let (view, staging, alias): (Mapping, Option<MemfdView>, Option<MemfdView>) = if let Some(addr) = at {
            let opts = MapOptions { noreserve: true, ..Default::default() };
            // SAFETY: alloc_at's contract: the caller owns [addr, addr+len), and bytes == len
            // (len is whole largest units).
            let view = unsafe { Mapping::anonymous_at(addr, bytes, &opts) }?;
            madvise(view.addr(), bytes, Advice::NoHugePage)?;
            let uffd = self.inner.uffd.as_ref().expect("userfaultfd modes have a uffd");
            uffd.register(view.addr(), bytes, RegisterMode { missing: true, write_protect: true, minor: false })?;
            (view, None, None)
        } else if self.inner.mode == FaultMode::Sigsegv {
            let fd = memfd_create("pagewise-dlm", None)?;
            pagewise_kernel::mem::ftruncate(&fd, bytes as u64)?;
            let view =
                Mapping::of_fd(&fd, bytes, 0, &MapOptions { shared: true, no_access: true, ..Default::default() })?;
            let stage = Mapping::of_fd(&fd, bytes, 0, &MapOptions { shared: true, ..Default::default() })?;
            (view, Some((stage, fd)), None)
        } else if self.inner.memfd {
            let fd = memfd_create("pagewise-dlm", None)?;
            pagewise_kernel::mem::ftruncate(&fd, bytes as u64)?;
            let shared = MapOptions { shared: true, ..Default::default() };
            let view = Mapping::of_fd(&fd, bytes, 0, &shared)?;
            madvise(view.addr(), bytes, Advice::NoHugePage)?;
            let alias = Mapping::of_fd(&fd, bytes, 0, &shared)?;
            madvise(alias.addr(), bytes, Advice::NoHugePage)?;
            let uffd = self.inner.uffd.as_ref().expect("userfaultfd modes have a uffd");
            uffd.register(view.addr(), bytes, RegisterMode { missing: true, write_protect: true, minor: true })?;
            (view, None, Some((alias, fd)))
        } else {
            let view = Mapping::anonymous(bytes, &MapOptions { noreserve: true, ..Default::default() })?;
            madvise(view.addr(), bytes, Advice::NoHugePage)?;
            let uffd = self.inner.uffd.as_ref().expect("userfaultfd modes have a uffd");
            uffd.register(view.addr(), bytes, RegisterMode { missing: true, write_protect: true, minor: false })?;
            (view, None, None)
        };
        if cfg.dont_fork {
            madvise(view.addr(), bytes, Advice::DontFork)?;
            for (m, _) in staging.iter().chain(alias.iter()) {
                madvise(m.addr(), bytes, Advice::DontFork)?;
            }
        }
        let shadow = if self.inner.moving && staging.is_none() && alias.is_none() {
            let m = Mapping::anonymous(bytes, &MapOptions { noreserve: true, ..Default::default() })?;
            madvise(m.addr(), bytes, Advice::NoHugePage)?;
            // A fork's copy-on-write pages cannot be moved; the child has no use for them.
            madvise(m.addr(), bytes, Advice::DontFork)?;
            // UFFDIO_MOVE needs its destination registered; WP mode only, so that receiving
            // into a not yet populated part is an ordinary fault the kernel serves itself.
            let uffd = self.inner.uffd.as_ref().expect("moving implies a uffd");
            uffd.register(m.addr(), bytes, RegisterMode { missing: false, write_protect: true, minor: false })?;
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
            let rep = st.call(s, h, &payload).inspect_err(|_| {
                // Give back what was reserved on the servers before this one.
                for (i, &r) in regions.iter().enumerate().take(s) {
                    if r != 0 {
                        let mut f = Header::request(Opcode::Free, 0);
                        f.region = r;
                        let _ = st.call(i, f, &[]);
                    }
                }
            })?;
            regions[s] = rep.region;
        }
        let addr = view.addr();
        let area = Area {
            addr,
            len: bytes,
            layout,
            regions,
            slot: vec![NONE; layout.pages],
            home_written: vec![false; layout.pages],
            touched: vec![0u64; layout.pages.div_ceil(64)],
            last_end: usize::MAX,
            window: 0,
            _view: view,
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
        Ok(addr as *mut u8)
    }
}

impl Inner {
    pub(super) fn free_locked(&self, st: &mut State, addr: usize) -> Result<(), DlmError> {
        let idx = st
            .areas
            .iter()
            .position(|a| a.as_ref().is_some_and(|a| a.addr == addr))
            .ok_or_else(|| DlmError::Config(format!("{addr:#x} is not a DLM area")))?;
        self.drain_all(st);
        // Drop the area's clock entries.
        let pages = st.areas[idx].as_ref().map(|a| a.layout.pages).unwrap_or(0);
        for p in 0..pages {
            let s = st.areas[idx].as_ref().map(|a| a.slot[p]).unwrap_or(NONE);
            if s != NONE && s != INFLIGHT {
                if let Some(e) = st.clock.remove(s as usize) {
                    st.resident -= e.count as usize * self.cfg.base_page;
                    for q in e.first..e.first + e.count {
                        st.areas[idx].as_mut().expect("present").slot[q as usize] = NONE;
                    }
                }
            }
        }
        let area = st.areas[idx].take().expect("present");
        if let Some(sh) = &area.shadow {
            // Unmapped with the area below.
            st.frames.remove_within(sh.addr(), area.len, |_, _| {});
        }
        if let Some(u) = &self.uffd {
            let _ = u.unregister(area.addr, area.len);
        }
        for (s, &r) in area.regions.iter().enumerate() {
            if r != 0 {
                let mut h = Header::request(Opcode::Free, 0);
                h.region = r;
                st.call(s, h, &[])?;
            }
        }
        st.stats.areas -= 1;
        drop(area);
        Ok(())
    }
}
