//! The runtime's bookkeeping checked against itself and against the page tables
//! (`Dlm::audit`, for tests): pages and CLOCK entries agree, every page present in a shadow
//! is accounted for, and every unit's pages are where its entry says.

use super::evict::present_count;
use super::install::overlaps;
use super::remote::{Pending, ReplyInto};
use super::{is_live, is_resident, Inner, State, INFLIGHT, NONE};

impl Inner {
    /// Part of `Dlm::audit`: the resident byte count equals the pages resident or in flight,
    /// and every resident page belongs to a live CLOCK entry covering it, which every live
    /// entry has.
    pub(super) fn audit_slots(&self, st: &State) -> Result<(), String> {
        let b = self.cfg.base_page;
        let mut pages = 0usize;
        let mut entries = std::collections::HashSet::new();
        for (ai, a) in st.areas.iter().enumerate() {
            let Some(a) = a else { continue };
            for (p, &s) in a.slot.iter().enumerate() {
                if s == NONE || !is_live(s) {
                    continue;
                }
                pages += 1;
                if s == INFLIGHT {
                    continue;
                }
                let e = st.clock.get(s as usize).ok_or(format!("page {p} of area {ai} names dead slot {s}"))?;
                if e.area as usize != ai || p < e.first as usize || p >= (e.first + e.count) as usize {
                    return Err(format!("page {p} of area {ai}: slot {s} covers {e:?}"));
                }
                entries.insert(s);
            }
        }
        if pages * b != st.resident {
            return Err(format!("resident {} bytes, pages say {}", st.resident, pages * b));
        }
        if entries.len() != st.clock.len() {
            return Err(format!("{} live CLOCK entries, pages reference {}", st.clock.len(), entries.len()));
        }
        Ok(())
    }

    /// Part of `Dlm::audit`: every page present in a shadow is accounted for — kept frames, a
    /// reply being received (borrowed frames, or a unit's own place), or an armed unit's
    /// data. A page that is none of these is one a later move to its place would be refused
    /// for (`Inner::move_over_strays`).
    pub(super) fn audit_shadows(&self, st: &State) -> Result<(), String> {
        let b = self.cfg.base_page;
        let mut held: Vec<(usize, usize)> = st.frames.runs().to_vec();
        held.extend_from_slice(&st.borrowed);
        for p in st.conns.iter().flat_map(|c| &c.pending) {
            if let Pending::Read { into: ReplyInto::Runtime(at), count, .. } = *p {
                held.push((at, count * b));
            }
        }
        for e in st.clock.iter().filter(|e| e.armed) {
            if let Some(sh) = st.areas[e.area as usize].as_ref().and_then(|a| a.shadow.as_ref()) {
                held.push((sh.addr() + e.first as usize * b, e.count as usize * b));
            }
        }
        let page = pagewise_kernel::mem::page_size();
        for (ai, a) in st.areas.iter().enumerate() {
            let Some(sh) = a.as_ref().and_then(|a| a.shadow.as_ref()) else { continue };
            let len = a.as_ref().expect("some").len;
            let mut present = vec![0u8; len.div_ceil(page)];
            pagewise_kernel::mem::mincore(sh.addr(), len, &mut present).map_err(|e| e.to_string())?;
            for (i, _) in present.iter().enumerate().filter(|(_, &p)| p & 1 != 0) {
                let at = sh.addr() + i * page;
                if !overlaps(&held, at, page) {
                    return Err(format!(
                        "area {ai}: a page is in the shadow at {at:#x} (page {}) that no unit owns",
                        i * page / b
                    ));
                }
            }
        }
        Ok(())
    }

    /// Part of `Dlm::audit`: every unit of an area with a shadow is where its entry says —
    /// an armed unit's pages out of the program's view, any other's all in it, and no page of
    /// the view present that no unit holds (one mincore(2) of each view). Holds where no `Run`
    /// is pending (between calls).
    pub(super) fn audit_views(&self, st: &State) -> Result<(), String> {
        let b = self.cfg.base_page;
        let page = pagewise_kernel::mem::page_size();
        for a in st.areas.iter().flatten().filter(|a| a.shadow.is_some()) {
            let mut present = vec![0u8; a.view_len.div_ceil(page)];
            if pagewise_kernel::mem::mincore(a.addr, a.view_len, &mut present).is_err() {
                // Part of the view unmapped by the program (its pages GONE): page by page.
                for (i, v) in present.iter_mut().enumerate() {
                    let mut one = [0u8];
                    *v = match pagewise_kernel::mem::mincore(a.addr + i * page, page, &mut one) {
                        Ok(()) => one[0],
                        Err(_) => 2,
                    };
                }
            }
            for (i, &bit) in present.iter().enumerate() {
                let p = i * page / b;
                let s = a.slot[p];
                let expected = match s {
                    INFLIGHT => continue,
                    _ if !is_live(s) || bit == 2 => continue,
                    s if is_resident(s) => !st.clock.get(s as usize).is_some_and(|e| e.armed),
                    _ => false,
                };
                if (bit & 1 != 0) != expected {
                    let at = a.addr + i * page;
                    let sh = a.shadow.as_ref().expect("filtered").addr() + (at - a.addr);
                    return Err(format!(
                        "page {at:#x} of the program's view is {} but its slot says {} (shadow {sh:#x}: {})",
                        if bit & 1 != 0 { "present" } else { "absent" },
                        if expected { "resident" } else { "not there" },
                        present_count(sh, page)
                    ));
                }
            }
        }
        Ok(())
    }
}
