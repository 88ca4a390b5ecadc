//! Making room: the CLOCK hand's victims evicted (written home when dirty, dropped or kept as
//! frames when clean), units armed to sample their reference bits, and the page-table changes
//! of both batched (`Run`). Module doc of `runtime.rs`: "Reference bits", "Dirty tracking".

use pagewise_kernel::mem::{madvise, mprotect, Advice, Protection};
use pagewise_kernel::uffd::Uffd;

use super::frames::Frames;
use super::install::{overlaps, CleanMove};
use super::journal::{self, Op};
use super::pinned::is_pinned_refusal;
use super::remote::{Pending, ReplyInto};
use super::{Area, Entry, Inner, State, MOVE_MIN, NONE};
use crate::config::FaultMode;
use crate::proto::{Header, Opcode};

impl Inner {
    /// Make room for `bytes` more under the local limit. Units the hand gives a second chance
    /// are armed (`arm`) on the way, as often as their return rate makes it pay
    /// (`sampling.rs`).
    pub(super) fn make_room(&self, st: &mut State, bytes: usize) {
        debug_assert!(!st.move_ins.gathering, "gathered move-ins are done before evicting");
        let mut run = Run::new(self.uffd.as_ref());
        // Units the kernel would not let go (`pinned.rs`) are put back; the hand goes on to
        // others. Refused again and again, more often than there are units to try, every
        // resident unit is pinned.
        let mut refusals = 0;
        while st.resident + bytes > self.cfg.local_mem {
            let State { clock, areas, stats, frames, borrowed, sampling, .. } = &mut *st;
            let b = self.cfg.base_page;
            let sample = self.cfg.sample_references;
            let victim = clock.victim(|e| {
                if !sample || e.armed {
                    return true;
                }
                if !sampling.second_chance() {
                    stats.second_chances_refused += 1;
                    return false;
                }
                let a = areas[e.area as usize].as_ref().expect("live area");
                if self.arm(a, e, b, &mut run, frames, borrowed) {
                    e.armed = true;
                    stats.second_chances += 1;
                    sampling.armed();
                }
                true
            });
            match victim {
                Some(v) => {
                    if !self.evict(st, v, &mut run) {
                        refusals += 1;
                    }
                }
                None => {
                    self.flush_run(st, &mut run);
                    // Only in-flight units hold the memory: install them, then they can go.
                    if !st.conns.iter().any(|c| !c.pending.is_empty()) {
                        crate::fatal(format_args!(
                            "pagewise dlm: internal error: {} bytes resident, none evictable",
                            st.resident
                        ));
                    }
                    self.drain_all(st);
                }
            }
            // Moves refused in the run put their units back: settle them now, and go on
            // until there is room after all.
            if run.has_refusals() || st.resident + bytes <= self.cfg.local_mem {
                let kept = st.stats.pinned_kept_bytes;
                self.flush_run(st, &mut run);
                refusals += usize::from(st.stats.pinned_kept_bytes > kept);
            }
            if refusals > 2 * st.clock.len() + 8 {
                crate::fatal(format_args!(
                    "pagewise dlm: the {} byte(s) of local memory in use are pages the kernel holds pinned \
                     (O_DIRECT I/O, io_uring's registered buffers, another process's process_vm_readv/writev), \
                     which cannot be evicted: give the program more local memory",
                    st.resident
                ));
            }
        }
        self.flush_run(st, &mut run);
    }

    /// Evict the unit in CLOCK slot `slot`. Its pages are dropped, or moved to the shadow to
    /// be kept, with the next [`Run::flush`] of `run` (consecutive victims of a stream: one
    /// system call for many units); the caller flushes `run` before anything can install
    /// pages into its ranges or take the kept frames. False when the kernel would not let the
    /// unit go (`pinned.rs`): it is resident still.
    #[must_use]
    pub(super) fn evict(&self, st: &mut State, slot: usize, run: &mut Run) -> bool {
        self.evict_unit(st, slot, run, true, true)
    }

    /// [`Inner::evict`] for the program's calls on a range (`forget`, `evict_range`): its
    /// pages are dropped, never moved, so the kernel cannot refuse; a pinned page keeps what
    /// was written through its pin to itself, as under the kernel's own MADV_DONTNEED.
    pub(super) fn evict_dropping(&self, st: &mut State, slot: usize, run: &mut Run) {
        let gone = self.evict_unit(st, slot, run, true, false);
        debug_assert!(gone, "a dropped unit is never refused");
    }

    /// Drop the unit in CLOCK slot `slot` without writing it home: the program dropped its
    /// data (`Dlm::discard`, `Dlm::unmap`). As [`Inner::evict`] otherwise.
    pub(super) fn discard_unit(&self, st: &mut State, slot: usize, run: &mut Run) {
        let gone = self.evict_unit(st, slot, run, false, false);
        debug_assert!(gone, "a discarded unit is dropped, never refused");
    }

    fn evict_unit(&self, st: &mut State, slot: usize, run: &mut Run, keep_data: bool, movable: bool) -> bool {
        let b = self.cfg.base_page;
        // A unit armed in this run, its move not yet made or refused: settled first, while
        // the unit is on the CLOCK, where a refusal finds it (`Inner::keep_refused`).
        let e = *st.clock.get(slot).expect("victim is live");
        if e.armed {
            let a = st.areas[e.area as usize].as_ref().expect("live area");
            if run.touches(a.addr + e.first as usize * b, e.count as usize * b) {
                self.flush_run(st, run);
            }
        }
        let e = st.clock.remove(slot).expect("victim is live");
        let ai = e.area as usize;
        let (first, count) = (e.first as usize, e.count as usize);
        let (start, len, layout) = {
            let a = st.areas[ai].as_ref().expect("live area");
            (a.addr + first * b, count * b, a.layout)
        };
        st.stats.evictions += 1;
        // Where the unit's frames go: kept in the shadow for a later reply (`keeps_frames`),
        // unless another unit's reply is being received into frames at its place. Only the
        // CLOCK's victims move (the kernel may refuse: `pinned.rs`); the program's calls on a
        // range drop.
        let shadow = {
            let a = st.areas[ai].as_ref().expect("live");
            a.shadow.as_ref().filter(|_| a.alias.is_none() && a.staging.is_none()).map(|m| m.addr() + first * b)
        };
        let to_shadow = movable
            && !e.armed
            && shadow.is_some_and(|sh| !overlaps(&st.borrowed, sh, len))
            && self.keeps_frames(st, len);
        // Writers are held back (module doc) before the data is read: always for a write-back,
        // and before a hashed unit is hashed again unless nobody can write it meanwhile — its
        // view unmapped (armed), or the program's one thread the one evicting.
        let must_hold = keep_data && (e.dirty || (e.clean_hash.is_some() && !e.armed && !self.program_stopped(st)));
        // A unit whose frames go to the shadow anyway goes there first: out of the program's
        // view, nobody writes it, and one move replaces a write-protect and a later move.
        let moved_first = to_shadow && must_hold;
        if keep_data && (e.dirty || e.clean_hash.is_some()) {
            // The unit's data is read below, an armed unit's from its place in the shadow: be
            // sure it is there.
            self.flush_run(st, run);
        }
        if moved_first {
            let sh = shadow.expect("to_shadow has a shadow");
            self.clear_place(st, sh, len, run);
            let uffd = self.uffd.as_ref().expect("shadow areas have a uffd");
            match uffd.move_pages_reporting(sh, start, len, false, true) {
                Ok(()) => journal::record(Op::ToShadow, sh, start, len),
                Err((moved, err)) if is_pinned_refusal(&err) => {
                    journal::record(Op::ToShadow, sh, start, moved);
                    self.keep_unit(st, e, start, sh, len, moved);
                    return false;
                }
                Err((moved, err)) => {
                    journal::record(Op::ToShadow, sh, start, moved);
                    if let Some(more) = self.move_over_strays(st, start + moved, sh + moved, len - moved, err) {
                        self.keep_unit(st, e, start, sh, len, moved + more);
                        return false;
                    }
                }
            }
        }
        // Read through the runtime's own view where there is one: the program's view of an
        // armed unit, or of one moved out first, is unmapped (it would fault).
        let own = {
            let a = st.areas[ai].as_ref().expect("live");
            match (&a.shadow, e.armed || moved_first) {
                (Some(sh), true) => sh.addr() + first * b,
                _ => a.alias.as_ref().or(a.staging.as_ref()).map_or(start, |(m, _)| m.addr() + first * b),
            }
        };
        let protect = |start: usize, len: usize| {
            let r = match &self.uffd {
                // DONTWAKE is refused when protecting (fs/userfaultfd.c: mode_wp && mode_dontwake).
                Some(u) => u.write_protect(start, len, true, true),
                None => mprotect(start, len, Protection::Read),
            };
            if let Err(err) = r {
                crate::fatal(format_args!("pagewise dlm: write-protecting {start:#x}+{len:#x} failed: {err}"));
            }
        };
        // An armed unit's view is unmapped already: an access faults and waits for the lock.
        let mut protected = moved_first || e.armed;
        let written = match e.clean_hash {
            _ if !keep_data => false,
            None => e.dirty,
            Some(h) => {
                if must_hold && !protected {
                    protect(start, len);
                    protected = true;
                }
                // SAFETY: [own, own+len) maps the unit's resident pages (the program's view, or
                // the shadow where an armed or moved-out unit's pages wait); nobody writes them
                // meanwhile.
                let written = unsafe { content_hash(self.hash_seed, own, len) } != h;
                if written {
                    st.stats.written_by_hash += 1;
                } else {
                    st.stats.clean_by_hash += 1;
                }
                written
            }
        };
        if written {
            if !protected {
                protect(start, len);
            }
            let (srv, spage) = layout.home(first);
            // Replies owed on this connection are taken first: a blocking send must never wait
            // on a server that is itself blocked sending us replies.
            while !st.conns[srv].pending.is_empty() {
                self.complete_one(st, srv);
            }
            let region = st.areas[ai].as_ref().expect("live").regions[srv];
            let mut h = Header::request(Opcode::Write, 0);
            h.region = region;
            h.page = spage as u64;
            h.set_count = count as u32;
            h.length = len as u32;
            // SAFETY: [own, own+len) maps the unit's resident pages, now write-protected in
            // the program's view or moved out of it; reading does not fault and nobody can
            // change them until they are dropped below.
            let data = unsafe { std::slice::from_raw_parts(own as *const u8, len) };
            let sent = st.send(srv, h, data, start, len);
            st.conns[srv].pending.push_back(Pending::Write { area: e.area, first, count, sent });
            st.stats.writebacks += 1;
            st.stats.writeback_bytes += len as u64;
            st.measure.written(len);
            let a = st.areas[ai].as_mut().expect("live");
            a.home_written[first..first + count].iter_mut().for_each(|w| *w = true);
        }
        let a = st.areas[ai].as_mut().expect("live");
        let mut kept = None;
        let r = match (&a.staging, &a.alias, shadow) {
            (Some((stage, _)), ..) => mprotect(start, len, Protection::None)
                .and_then(|_| madvise(stage.addr() + first * b, len, Advice::Remove)),
            // Punching the pages out of the memfd unmaps them from both views and frees them.
            (None, Some((alias, _)), _) => madvise(alias.addr() + first * b, len, Advice::Remove),
            // An armed unit's pages wait in the shadow already, as do a moved-out unit's.
            (None, None, Some(sh)) if e.armed || moved_first => {
                kept = Some(sh);
                Ok(())
            }
            // Frames a unit will be received into go to the shadow, to be reused.
            (None, None, Some(sh)) if to_shadow => {
                self.clear_place(st, sh, len, run);
                kept = Some(sh);
                run.move_to_shadow_later(start, sh, len);
                Ok(())
            }
            (None, None, _) => {
                run.drop_later(start, len);
                Ok(())
            }
        };
        if let Err(err) = r {
            crate::fatal(format_args!("pagewise dlm: dropping {start:#x}+{len:#x} failed: {err}"));
        }
        journal::record(Op::Evict, kept.unwrap_or(0), start, len);
        let a = st.areas[ai].as_mut().expect("live");
        a.slot[first..first + count].iter_mut().for_each(|s| *s = NONE);
        st.resident -= len;
        if let Some(sh) = kept {
            if !self.keep_frames(st, sh, len) {
                self.flush_run(st, run);
                free_frames(sh, len);
            }
        }
        true
    }

    /// Free the frames kept at `[place, place + len)`, a unit's place in the shadow that its
    /// pages are about to be moved to. A kept run reaching beyond the place and cut in two
    /// where no slot is left for its tail loses the tail too: freed once `run` has made its
    /// moves, since moves it holds may be bound there (a victim evicted earlier in this pass
    /// whose frames were kept).
    fn clear_place(&self, st: &mut State, place: usize, len: usize, run: &mut Run) {
        if let Some((addr, n)) = st.frames.remove_within(place, len, free_frames) {
            self.flush_run(st, run);
            free_frames(addr, n);
        }
    }

    /// Flush `run`, then settle the moves to the shadow it was refused (`Run::move_now`):
    /// pinned pages are kept (`Inner::keep_refused`), pages in the way moved over.
    pub(super) fn flush_run(&self, st: &mut State, run: &mut Run) {
        run.flush();
        for (view, shadow, len, err) in run.refused.iter_mut().filter_map(Option::take) {
            let moved =
                if is_pinned_refusal(&err) { Some(0) } else { self.move_over_strays(st, view, shadow, len, err) };
            if let Some(moved) = moved {
                self.keep_refused(st, view + moved, shadow + moved, len - moved);
            }
        }
    }

    /// Move the pages of `[view, view + len)` to `[shadow, shadow + len)`, places in the shadow
    /// the bookkeeping holds empty, after UFFDIO_MOVE refused with `err` because pages are
    /// there (EEXIST). Pages there that nothing of the runtime's accounts for — no reply is
    /// being received there, no move-in is gathered from there — are nobody's data while the
    /// pages to be moved are all in the view: every unit's data is in the program's view, in
    /// the shadow at its place (armed, accounted for by its CLOCK entry, never moved over), on
    /// its way, or at home. They are freed, with a note and the journal of those pages, and
    /// the move made. Anything else stops the program, as any failed move does. Some(bytes
    /// moved) when the kernel then refused a pinned page (`pinned.rs`): the caller keeps the
    /// rest.
    #[must_use]
    pub(super) fn move_over_strays(
        &self,
        st: &mut State,
        view: usize,
        shadow: usize,
        len: usize,
        err: pagewise_kernel::Error,
    ) -> Option<usize> {
        let b = self.cfg.base_page;
        let receiving = overlaps(&st.borrowed, shadow, len)
            || st.conns.iter().flat_map(|c| &c.pending).any(|p| {
                matches!(*p, Pending::Read { into: ReplyInto::Runtime(at), count, .. }
                    if at < shadow + len && shadow < at + count * b)
            });
        let ranges = [(view, len), (shadow, len)];
        if err.errno() != Some(libc::EEXIST) || receiving || st.move_ins.gathering {
            journal::fatal(
                &ranges,
                format_args!(
                    "pagewise dlm: moving {view:#x}+{len:#x} to the shadow failed: {err}{}",
                    if receiving { " (a reply is being received there)" } else { "" }
                ),
            );
        }
        // The pages to be moved must all be in the view. Where some are not, what is in the
        // shadow may be those very pages, moved there by a call the kernel refused after making
        // it (`Uffd::move_pages` takes wholly moved ranges as moved; this is what is left):
        // freeing them would lose the unit's data, and a dirty unit's write-back would then
        // carry zeros home. Stop instead.
        let in_view = present_count(view, len) * pagewise_kernel::mem::page_size();
        if in_view < len {
            journal::fatal(
                &ranges,
                format_args!(
                    "pagewise dlm: moving {view:#x}+{len:#x} to the shadow failed: {err}, and {} of its {} byte(s) \
                     are not in the program's view: the shadow may hold them (please report this)",
                    len - in_view,
                    len
                ),
            );
        }
        let strays = present_count(shadow, len);
        free_frames(shadow, len);
        st.stats.stray_shadow_bytes += (strays * pagewise_kernel::mem::page_size()) as u64;
        crate::note(format_args!(
            "pagewise dlm: {strays} page(s) no unit owns were in the shadow at {shadow:#x}+{len:#x}, where \
             {view:#x}+{len:#x} is moved: freed (please report this)"
        ));
        journal::report(&ranges);
        journal::record(Op::Strays, shadow, view, len);
        let uffd = self.uffd.as_ref().expect("shadow areas have a uffd");
        match uffd.move_pages_reporting(shadow, view, len, false, true) {
            Ok(()) => {
                journal::record(Op::ToShadow, shadow, view, len);
                None
            }
            Err((moved, err)) if is_pinned_refusal(&err) => {
                journal::record(Op::ToShadow, shadow, view, moved);
                Some(moved)
            }
            Err((_, err)) => journal::fatal(
                &ranges,
                format_args!("pagewise dlm: moving {view:#x}+{len:#x} to the shadow failed: {err}"),
            ),
        }
    }

    /// Whether an evicted unit of `len` bytes leaves its frames in the shadow for a later reply
    /// to be received into (`reply_target`): under SIGBUS with one program thread from
    /// `view_min` on (demand faults are received into the program's view), else from
    /// `Inner::move_min` on where clean units are moved in at all (`Inner::clean_move`).
    /// Otherwise the pages are dropped, many victims with one call: moving each to the shadow
    /// and freeing it there when it is not needed made the solver with 4 KiB units at 10% and
    /// 5% local memory 5-6× slower (`pagewise eval dlm-autotune`, whose solver shares its
    /// process with other threads, so every move flushed the other CPU's TLB too).
    pub(super) fn keeps_frames(&self, st: &mut State, len: usize) -> bool {
        self.cfg.move_install
            && if self.mode == FaultMode::Sigbus && len >= self.view_min() && len < MOVE_MIN {
                self.program_stopped(st)
            } else {
                len >= self.move_min(st) && self.clean_move(st) != CleanMove::Copied
            }
    }

    /// Keep the shadow frames `[addr, addr + len)` for the next fetch; false when the resident
    /// set plus the kept frames would exceed the local limit, or no run can be added: the
    /// caller frees them.
    #[must_use]
    pub(super) fn keep_frames(&self, st: &mut State, addr: usize, len: usize) -> bool {
        let kept = st.resident + st.frames.bytes() + len <= self.cfg.local_mem && st.frames.push(addr, len);
        if kept {
            journal::record(Op::Keep, addr, 0, len);
        }
        kept
    }

    /// Arm unit `e` of area `a` (module doc, "Reference bits"): unmap it from the program's
    /// view, keeping its data, so that its next access faults. Shadow areas: its pages are
    /// moved to its place in the shadow (with `run`). Memfd areas: its program-view range joins `run`
    /// (MADV_DONTNEED of a shared mapping drops the page-table entries only). SIGSEGV areas:
    /// PROT_NONE. Other anonymous areas cannot be armed (their only copy of the data is what
    /// would be dropped), nor can a shadow area's unit whose place holds frames borrowed by a
    /// reply in flight: false.
    pub(super) fn arm(
        &self,
        a: &Area,
        e: &Entry,
        b: usize,
        run: &mut Run,
        frames: &mut Frames,
        borrowed: &[(usize, usize)],
    ) -> bool {
        let (start, len) = (a.addr + e.first as usize * b, e.count as usize * b);
        if let Some(sh) = a.shadow.as_ref().map(|m| m.addr() + e.first as usize * b) {
            if overlaps(borrowed, sh, len) {
                return false;
            }
            // As `Inner::clear_place`: a spilled tail may be where a move of `run` goes.
            if let Some((addr, n)) = frames.remove_within(sh, len, free_frames) {
                run.flush();
                free_frames(addr, n);
            }
            run.move_to_shadow_later(start, sh, len);
            journal::record(Op::Arm, sh, start, len);
            return true;
        }
        arm_mapped(a, start, len, run)
    }
}

impl super::Dlm {
    /// For tests of `Inner::move_over_strays`: put a page that no unit owns in the shadow, at
    /// the place of the page holding `addr`, as a slip of the bookkeeping would. False (and
    /// nothing done) unless that place is empty by the bookkeeping: the page resident and
    /// not armed, in an area with a shadow, and no frames kept or reply received there.
    #[doc(hidden)]
    pub fn plant_stray_shadow_page(&self, addr: usize) -> bool {
        let st = self.inner.lock();
        let b = self.inner.cfg.base_page;
        let Some((a, _, sh)) = self.inner.unarmed_unit_at(&st, addr) else { return false };
        let place = sh + (addr - a.addr) / b * b;
        let mut held: Vec<(usize, usize)> = st.frames.runs().to_vec();
        held.extend_from_slice(&st.borrowed);
        if overlaps(&held, place, b) || present_count(place, b) > 0 {
            return false;
        }
        madvise(place, b, Advice::PopulateWrite).is_ok()
    }

    /// For tests of moves to the shadow: move the pages of the resident, unarmed unit holding
    /// `addr` to its place in the shadow behind the bookkeeping's back, as the kernel does when
    /// it refuses a move it has made (`Uffd::move_pages`). False (and nothing done) unless
    /// there is such a unit with an empty place.
    #[doc(hidden)]
    pub fn displace_unit_to_shadow(&self, addr: usize) -> bool {
        let st = self.inner.lock();
        let b = self.inner.cfg.base_page;
        let (Some((a, e, sh)), Some(uffd)) = (self.inner.unarmed_unit_at(&st, addr), self.inner.uffd.as_ref()) else {
            return false;
        };
        let (view, place, len) = (a.addr + e.first as usize * b, sh + e.first as usize * b, e.count as usize * b);
        present_count(place, len) == 0 && uffd.move_pages(place, view, len, false, false).is_ok()
    }
}

impl Inner {
    /// For the test hooks above: the area, entry and shadow address of the resident, unarmed
    /// unit holding `addr`, in an area with a shadow.
    fn unarmed_unit_at<'s>(&self, st: &'s State, addr: usize) -> Option<(&'s Area, Entry, usize)> {
        let a = st.areas.iter().flatten().find(|a| addr >= a.addr && addr < a.addr + a.view_len)?;
        let sh = a.shadow.as_ref()?.addr();
        let slot = a.slot[(addr - a.addr) / self.cfg.base_page];
        let e = *st.clock.get(slot as usize).filter(|e| super::is_resident(slot) && !e.armed)?;
        Some((a, e, sh))
    }
}

/// Free kept frames (MADV_DONTNEED on the shadow).
pub(super) fn free_frames(addr: usize, len: usize) {
    journal::record(Op::Free, addr, 0, len);
    if let Err(err) = madvise(addr, len, Advice::DontNeed) {
        crate::fatal(format_args!("pagewise dlm: freeing frames {addr:#x}+{len:#x} failed: {err}"));
    }
}

/// How many base pages of `[addr, addr + len)` are present (mincore(2)), counted without
/// allocating (this may run in a signal handler); 0 where it cannot be told.
pub(super) fn present_count(addr: usize, len: usize) -> usize {
    let page = pagewise_kernel::mem::page_size();
    let mut v = [0u8; 256];
    let mut count = 0;
    let mut off = 0;
    while off < len {
        let n = (len - off).min(v.len() * page);
        if pagewise_kernel::mem::mincore(addr + off, n, &mut v[..n.div_ceil(page)]).is_err() {
            return count;
        }
        count += v[..n.div_ceil(page)].iter().filter(|&&p| p & 1 != 0).count();
        off += n;
    }
    count
}

/// `Inner::arm` for areas without a shadow.
pub(super) fn arm_mapped(a: &Area, start: usize, len: usize, run: &mut Run) -> bool {
    if a.alias.is_some() {
        run.drop_later(start, len);
        true
    } else if a.staging.is_some() {
        if let Err(err) = mprotect(start, len, Protection::None) {
            crate::fatal(format_args!("pagewise dlm: arming {start:#x}+{len:#x} failed: {err}"));
        }
        true
    } else {
        false
    }
}

/// The hash a clean unit is remembered by (`Entry::clean_hash`): xxh3 keyed with the
/// runtime's random seed. A written unit keeps its hash with probability 2^-64.
///
/// # Safety
/// `[addr, addr + len)` must be mapped readable with its pages present: no load may fault
/// (this runs in the SIGBUS handler with the runtime's lock held).
pub(super) unsafe fn content_hash(seed: u64, addr: usize, len: usize) -> u64 {
    // SAFETY: the caller's range.
    let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
    twox_hash::XxHash3_64::oneshot_with_seed(seed, bytes)
}

/// Page-table changes of evicted and armed units not yet made, gathered while adjacent so that
/// a stream's units (evicted and armed in address order) cost one system call together —
/// and one TLB flush. That is what makes it pay: a move or write-protect of up to 33 pages
/// invalidates the TLB entry of each page, at about 0.3 µs a page on this VM; beyond that
/// the kernel flushes the whole TLB at once (x86 `tlb_single_page_flush_ceiling`).
///
/// Measured (UFFDIO_MOVE, 4 KiB pages): 32 pages 11.4 µs, 34 pages 4.9 µs, 256 pages 22 µs.
///
/// Whoever makes one [`Run::flush`]es it before anything reads or reuses the pages it moves
/// or drops (`make_room`, `evict`).
pub(super) struct Run<'u> {
    uffd: Option<&'u Uffd>,
    /// Program-view range to MADV_DONTNEED: evicted anonymous units (freed) and armed memfd
    /// units (unmapped, data kept).
    drop: (usize, usize),
    /// Program-view range `(view, shadow, len)` whose pages move to the same offsets of its
    /// area's shadow: evicted units whose frames are kept, and armed units.
    to_shadow: (usize, usize, usize),
    /// The rest of each move to the shadow the kernel refused (`view, shadow, len` and its
    /// error), settled by [`Inner::flush_run`], which has the bookkeeping to see why. A few
    /// at most: each is settled at the latest after the CLOCK hand's next step.
    refused: [Option<Refused>; REFUSED_MAX],
}

type Refused = (usize, usize, usize, pagewise_kernel::Error);

/// Refused moves a [`Run`] holds (it never allocates: the fault path may run in a signal
/// handler); one more stops the program.
const REFUSED_MAX: usize = 16;

impl<'u> Run<'u> {
    pub(super) fn new(uffd: Option<&'u Uffd>) -> Self {
        Run { uffd, drop: (0, 0), to_shadow: (0, 0, 0), refused: [const { None }; REFUSED_MAX] }
    }

    /// Whether a move of the view range `[start, start + len)` is gathered or was refused.
    pub(super) fn touches(&self, start: usize, len: usize) -> bool {
        let (v, _, l) = self.to_shadow;
        let meets = |at: usize, n: usize| at < start + len && start < at + n;
        (l > 0 && meets(v, l)) || self.refused.iter().flatten().any(|&(at, _, n, _)| meets(at, n))
    }

    /// Whether a move was refused since the last [`Inner::flush_run`].
    pub(super) fn has_refusals(&self) -> bool {
        self.refused.iter().any(Option::is_some)
    }

    /// MADV_DONTNEED `[start, start + len)` of a program's view (its next touch faults).
    pub(super) fn drop_later(&mut self, start: usize, len: usize) {
        let (s, l) = self.drop;
        if l > 0 && (s + l == start || start + len == s) {
            self.drop = (s.min(start), l + len);
        } else {
            self.drop_now();
            self.drop = (start, len);
        }
    }

    /// Move the pages of `[view, view + len)` of a program's view to `shadow`, the same
    /// offset of its area's shadow (its next touch faults; the pages wait there).
    pub(super) fn move_to_shadow_later(&mut self, view: usize, shadow: usize, len: usize) {
        let (v, sh, l) = self.to_shadow;
        // The hand may meet a stream's units in either address order.
        if l > 0 && v.wrapping_sub(sh) == view.wrapping_sub(shadow) && (v + l == view || view + len == v) {
            self.to_shadow = (v.min(view), sh.min(shadow), l + len);
        } else {
            self.move_now();
            self.to_shadow = (view, shadow, len);
        }
    }

    /// Make every change gathered (a refused move is left to [`Inner::flush_run`]).
    pub(super) fn flush(&mut self) {
        self.drop_now();
        self.move_now();
    }

    pub(super) fn drop_now(&mut self) {
        let (start, len) = std::mem::take(&mut self.drop);
        if len == 0 {
            return;
        }
        journal::record(Op::Drop, start, 0, len);
        if let Err(err) = madvise(start, len, Advice::DontNeed) {
            crate::fatal(format_args!("pagewise dlm: dropping {start:#x}+{len:#x} failed: {err}"));
        }
    }

    pub(super) fn move_now(&mut self) {
        let (view, shadow, len) = std::mem::take(&mut self.to_shadow);
        if len == 0 {
            return;
        }
        let uffd = self.uffd.expect("shadow areas have a uffd");
        match uffd.move_pages_reporting(shadow, view, len, false, true) {
            Ok(()) => journal::record(Op::ToShadow, shadow, view, len),
            Err((moved, err)) => {
                journal::record(Op::ToShadow, shadow, view, moved);
                let Some(free) = self.refused.iter_mut().find(|r| r.is_none()) else {
                    journal::fatal(
                        &[(view, len), (shadow, len)],
                        format_args!("pagewise dlm: moving {view:#x}+{len:#x} to the shadow failed: {err}"),
                    );
                };
                *free = Some((view + moved, shadow + moved, len - moved, err));
            }
        }
    }
}

impl Drop for Run<'_> {
    fn drop(&mut self) {
        debug_assert!(self.drop.1 == 0 && self.to_shadow.2 == 0 && !self.has_refusals(), "a Run was dropped unflushed");
    }
}
