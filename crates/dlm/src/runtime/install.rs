//! Bringing units in: requesting a unit's missing pages, deciding where its reply is received
//! (the program's view, the shadow, the memfd's alias or the buffer), and installing it —
//! copied, moved in from the shadow, or mapped — write-protected or hashed. Module doc of
//! `runtime.rs`: "Installing pages".

use pagewise_kernel::mem::{madvise, mprotect, Advice, Protection};

use super::evict::{content_hash, free_frames};
use super::journal::{self, Op};
use super::remote::{Pending, ReplyInto};
use super::{Entry, Inner, State, HASH_MAX, INFLIGHT, MOVE_MIN, NONE, VIEW_MIN};
use crate::config::FaultMode;
use crate::proto::{Header, Opcode};

impl Inner {
    /// Smallest unit whose demand fault's reply is received into the program's view: any
    /// when it is then hashed instead of write-protected (`HASH_MAX`), else `VIEW_MIN`.
    pub(super) fn view_min(&self) -> usize {
        if self.cfg.hash_clean {
            self.cfg.base_page
        } else {
            VIEW_MIN
        }
    }

    /// Smallest unit received into the shadow and moved in: `MOVE_MIN`, or any while the
    /// handler thread shares the program's one CPU, where a move's TLB flush stays on that
    /// CPU and costs less than the page a UFFDIO_COPY allocates, fills and later frees.
    pub(super) fn move_min(&self, st: &State) -> usize {
        if st.colocated {
            self.cfg.base_page
        } else {
            MOVE_MIN
        }
    }

    /// Where the reply for a wholly missing unit whose place in its area's shadow is `place`
    /// is received, decided before its request leaves (cheap: no page is touched):
    /// - the unit's own frames, still at its place: received there;
    /// - else one kept run of frames as large as the unit, *borrowed* where it lies (received
    ///   there and moved straight into the program's view: one move less than gathering it to
    ///   the place first — a stream's evicted units leave exactly such runs);
    /// - else the place, filled by [`Inner::fill_place`] while the request travels;
    /// - None when the place holds frames borrowed by another reply in flight and no run can be
    ///   borrowed: the reply is copied in (UFFDIO_COPY) instead.
    pub(super) fn receive_target(&self, st: &mut State, place: usize, len: usize) -> Option<ReceiveAt> {
        let place_free = !overlaps(&st.borrowed, place, len);
        if place_free && st.frames.take_in_place(place, len) {
            journal::record(Op::TakeInPlace, place, 0, len);
            return Some(ReceiveAt::Ready(place));
        }
        if st.borrowed.len() < st.borrowed.capacity() {
            // From the run's start: a read-ahead batch's units get adjacent frames in their
            // order, and arrived replies are moved in together (`install_arrived`).
            if let Some(addr) = st.frames.take_head(len) {
                st.borrowed.push((addr, len));
                st.stats.borrowed_receives += 1;
                journal::record(Op::Borrow, addr, 0, len);
                return Some(ReceiveAt::Ready(addr));
            }
        }
        place_free.then_some(ReceiveAt::Fill(place))
    }

    /// Fill `[dst, dst + len)`, a unit's place in its area's shadow, with kept frames (moved
    /// there) and fresh pages for the rest, so that the reply is received into pages that
    /// exist. Runs while the request travels.
    pub(super) fn fill_place(&self, st: &mut State, dst: usize, len: usize) {
        if let Some((addr, n)) = st.frames.remove_within(dst, len, free_frames) {
            free_frames(addr, n);
        }
        let uffd = self.uffd.as_ref().expect("shadow areas have a uffd");
        let mut off = 0;
        while off < len {
            let Some((src, n)) = st.frames.pop(len - off) else { break };
            journal::record(Op::Gather, dst + off, src, n);
            if let Err(err) = uffd.move_pages(dst + off, src, n, false, true) {
                journal::fatal(
                    &[(dst, len), (src, n)],
                    format_args!("pagewise dlm: reusing frames {src:#x}+{n:#x} failed: {err}"),
                );
            }
            off += n;
        }
        if off < len {
            journal::record(Op::Populate, dst + off, 0, len - off);
            if let Err(err) = madvise(dst + off, len - off, Advice::PopulateWrite) {
                crate::fatal(format_args!("pagewise dlm: allocating {:#x}+{:#x} failed: {err}", dst + off, len - off));
            }
        }
    }

    /// Whether the program cannot touch memory while the runtime holds its lock: its one thread
    /// is the one in the runtime, serving its own fault in a signal handler with every signal
    /// blocked (SIGBUS, SIGSEGV modes). Found once per holding of the lock: a program with
    /// one thread cannot start another while that thread is in here. Never under the handler
    /// thread: a program thread waiting on a userfaultfd fault sleeps interruptibly, so it
    /// runs its signal handlers meanwhile (fs/userfaultfd.c, TASK_INTERRUPTIBLE), and a
    /// handler may store to the very unit being installed.
    pub(super) fn program_stopped(&self, st: &mut State) -> bool {
        self.mode != FaultMode::HandlerThread
            && *st
                .sole_thread
                .get_or_insert_with(|| self.threads.as_ref().and_then(|t| t.get().ok()).is_some_and(|n| n <= 1))
    }

    /// How a clean unit whose pages wait in the shadow gets into the program's view
    /// (`frames.rs`: a moved page arrives writable).
    pub(super) fn clean_move(&self, st: &mut State) -> CleanMove {
        if self.program_stopped(st) {
            CleanMove::ThenProtect
        } else if self.mode == FaultMode::HandlerThread && self.cfg.hash_clean {
            CleanMove::Hashed
        } else {
            CleanMove::Copied
        }
    }

    /// Map the shadow's `[src, src + len)` at `[dst, dst + len)` in the program's view, clean
    /// unless `dirty`, by [`Inner::clean_move`]: moved and write-protected; hashed from the
    /// shadow, then moved and left writable (the hash is returned: a store made after the move
    /// shows at eviction); or copied (UFFDIO_COPY mode WP) and the shadow frames kept. Moves
    /// are gathered with their neighbours while replies are taken (`MoveIns`).
    pub(super) fn move_in(
        &self,
        st: &mut State,
        ai: usize,
        dst: usize,
        src: usize,
        len: usize,
        dirty: bool,
    ) -> Option<u64> {
        let how = if dirty { CleanMove::ThenProtect } else { self.clean_move(st) };
        match how {
            CleanMove::Copied => {
                let uffd = self.uffd.as_ref().expect("shadow areas have a uffd");
                journal::record(Op::CopyIn, dst, src, len);
                // SAFETY: the shadow range is populated (received into, or an armed unit's
                // pages) and readable.
                if let Err(err) = unsafe { uffd.copy(dst, src as *const u8, len, true, true) } {
                    journal::fatal(
                        &[(dst, len), (src, len)],
                        format_args!("pagewise dlm: installing {dst:#x}+{len:#x} failed: {err}"),
                    );
                }
                if !self.keep_frames(st, src, len) {
                    free_frames(src, len);
                }
                None
            }
            CleanMove::Hashed => {
                st.stats.hashed_installs += 1;
                // SAFETY: the shadow range is populated and readable, and only the runtime
                // (holding its lock) can reach it.
                let h = unsafe { content_hash(self.hash_seed, src, len) };
                self.gather_move_in(st, ai, dst, src, len, true);
                Some(h)
            }
            CleanMove::ThenProtect => {
                self.gather_move_in(st, ai, dst, src, len, dirty);
                None
            }
        }
    }

    /// Move `[src, src + len)` of the shadow to `[dst, dst + len)` of area `ai`'s view,
    /// write-protected unless `writable`: now, or joined to the moves gathered (`MoveIns`).
    fn gather_move_in(&self, st: &mut State, ai: usize, dst: usize, src: usize, len: usize, writable: bool) {
        st.stats.moved_units += 1;
        if !st.move_ins.gathering {
            self.move_in_now(dst, src, len, writable);
            return;
        }
        if st.move_ins.joins(ai, dst, src, writable) {
            st.stats.joined_move_ins += 1;
        } else if let Some((d, s, l, w)) = st.move_ins.take() {
            self.move_in_now(d, s, l, w);
        }
        st.move_ins.add(ai, dst, src, len, writable);
    }

    /// Move pages in from the shadow, write-protect them unless `writable`, and wake whoever
    /// waits on them: nobody under SIGBUS, where a fault raises the signal at once instead of
    /// waiting (fs/userfaultfd.c, `handle_userfault`), so no wake-up call is made there.
    pub(super) fn move_in_now(&self, dst: usize, src: usize, len: usize, writable: bool) {
        let uffd = self.uffd.as_ref().expect("shadow areas have a uffd");
        let waiters = self.mode != FaultMode::Sigbus;
        journal::record(Op::MoveIn, dst, src, len);
        let r = if writable {
            uffd.move_pages(dst, src, len, waiters, false)
        } else {
            uffd.move_pages(dst, src, len, false, false)
                // Protecting never wakes (fs/userfaultfd.c wakes only on un-protecting).
                .and_then(|()| uffd.write_protect(dst, len, true, true))
                .and_then(|()| if waiters { uffd.wake(dst, len) } else { Ok(()) })
        };
        if let Err(err) = r {
            journal::fatal(
                &[(dst, len), (src, len)],
                format_args!(
                    "pagewise dlm: installing {dst:#x}+{len:#x} failed: {err} (pages present: {} in the program's \
                     view, {} in the shadow at {src:#x})",
                    present_pages(dst, len),
                    present_pages(src, len)
                ),
            );
        }
    }

    /// Install the units gathered since [`MoveIns::gather`], and stop gathering.
    pub(super) fn move_in_gathered(&self, st: &mut State) {
        if let Some((d, s, l, w)) = st.move_ins.finish() {
            self.move_in_now(d, s, l, w);
        }
    }

    /// Request the non-resident pages of unit [first, first+count) of area `ai`, for a demand
    /// fault or read-ahead (zeros are installed at once; others get a READ). `open`: the
    /// demand fault is a known write to this page, so the part of the unit holding it is
    /// installed writable and dirty: no write-protect now and no opening after.
    pub(super) fn request(
        &self,
        st: &mut State,
        ai: usize,
        first: usize,
        count: usize,
        readahead: bool,
        open: Option<usize>,
    ) {
        self.request_units(st, ai, first, count, count, readahead, open);
    }

    /// Request read-ahead unit `[first, first + count)` of area `ai` as [`Inner::request`]
    /// does, or add it to `group`: adjacent units, wholly missing and at consecutive pages of
    /// one home, leave as one READ of up to `GROUP_MAX` bytes (`Group` says why). Requests
    /// keep their address order; [`Inner::request_group`] sends the last group.
    pub(super) fn request_ahead(
        &self,
        st: &mut State,
        ai: usize,
        first: usize,
        count: usize,
        group: &mut Option<Group>,
    ) {
        let b = self.cfg.base_page;
        if self.groups_reads(st, ai, count) {
            let a = st.areas[ai].as_ref().expect("live");
            let pages = first..first + count;
            let whole = a.slot[pages.clone()].iter().all(|&s| s == NONE) && a.home_written[pages].contains(&true);
            if whole {
                if let Some(g) = group.as_mut().filter(|g| g.joins(ai, first, count, &a.layout, GROUP_MAX / b)) {
                    g.count += count;
                    return;
                }
                self.request_group(st, group);
                *group = Some(Group { area: ai, first, count, unit: count });
                return;
            }
        }
        self.request_group(st, group);
        self.request(st, ai, first, count, true, None);
    }

    /// Request the units gathered in `group`, if any, with one READ.
    pub(super) fn request_group(&self, st: &mut State, group: &mut Option<Group>) {
        if let Some(g) = group.take() {
            if g.count > g.unit {
                st.stats.grouped_reads += 1;
            }
            self.request_units(st, g.area, g.first, g.count, g.unit, true, None);
        }
    }

    /// Whether read-ahead units of `count` pages of area `ai` may share a READ: where units
    /// of that size leave their frames in the shadow when evicted (`keeps_frames`), so that a
    /// group's reply is received into kept frames and moved in with one move (and one
    /// write-protect) for all its units — a group shorter than `MOVE_MIN` is still copied in
    /// a unit at a time (`reply_target`). Not with redundancy, whose pieces are placed a block
    /// at a time, nor zero-copy.
    fn groups_reads(&self, st: &mut State, ai: usize, count: usize) -> bool {
        !self.zero_copy
            && !self.cfg.redundancy.is_redundant()
            && st.areas[ai].as_ref().is_some_and(|a| a.shadow.is_some())
            && self.keeps_frames(st, count * self.cfg.base_page)
    }

    /// [`Inner::request`] of `count` pages that are units of `unit` pages each: one CLOCK
    /// entry per unit when installed.
    #[allow(clippy::too_many_arguments)]
    fn request_units(
        &self,
        st: &mut State,
        ai: usize,
        first: usize,
        count: usize,
        unit: usize,
        readahead: bool,
        open: Option<usize>,
    ) {
        let b = self.cfg.base_page;
        self.settle_reads_within(st, ai, first, count);
        let count_missing = |st: &State| {
            st.areas[ai].as_ref().expect("live").slot[first..first + count].iter().filter(|&&s| s == NONE).count()
        };
        let mut missing = count_missing(st);
        if missing == 0 {
            return;
        }
        // Making room may evict resident pages of this very unit (units of an older set count
        // inside it), which then are missing too: repeat until the count is stable.
        loop {
            self.make_room(st, missing * b);
            let now = count_missing(st);
            if now == missing {
                break;
            }
            missing = now;
        }
        let a = st.areas[ai].as_mut().expect("live");
        let needs_home = (first..first + count).any(|p| a.slot[p] == NONE && a.home_written[p]);
        for p in first..first + count {
            if a.slot[p] == NONE {
                a.slot[p] = INFLIGHT;
            }
        }
        st.resident += missing * b;
        st.stats.peak_resident_bytes = st.stats.peak_resident_bytes.max(st.resident);
        if !needs_home {
            st.stats.zero_units += (count / unit) as u64;
            self.install(st, ai, first, count, unit, Fill::Zeros, open);
            return;
        }
        let (srv, spage) = a.layout.home(first);
        let mut h = Header::request(Opcode::Read, 0);
        h.region = a.regions[srv];
        h.page = spage as u64;
        h.set_count = count as u32;
        let (start, len) = (a.addr + first * b, count * b);
        let sent = st.queue_read(srv, h, start, len);
        if !readahead {
            // A demand fault waits for this reply: it leaves now.
            st.flush(srv, start, len);
        }
        // While the request travels: where its reply is received, and the pages it is
        // received into made to exist. Nothing in between takes a reply, so the entry still
        // joins the queue in the order the request left.
        let into = self.reply_target(st, ai, first, count, missing, readahead);
        st.conns[srv].pending.push_back(Pending::Read { area: ai as u32, first, count, unit, into, sent, open });
        if readahead {
            st.stats.readahead_units += (count / unit) as u64;
        }
    }

    /// Take the replies of earlier READs for any page of `[first, first + count)` of area `ai`
    /// before that unit is requested. A reply installs the pages of its unit still in flight
    /// (`install`), so two READs in flight must never share a page. They would after the page
    /// size changed (a larger unit around a smaller one in flight), or where part of a unit
    /// was resident when it was requested and is evicted before the reply comes: the later
    /// request, or a unit installed as zeros at once, would take the earlier reply's pages —
    /// zeros or old bytes over what is on its way, and the reply's frames left in the shadow.
    fn settle_reads_within(&self, st: &mut State, ai: usize, first: usize, count: usize) {
        let overlaps_unit = |p: &Pending| {
            matches!(*p, Pending::Read { area, first: f, count: c, .. }
                if area as usize == ai && f < first + count && first < f + c)
        };
        while let Some(srv) = st.conns.iter().position(|c| c.pending.iter().any(overlaps_unit)) {
            self.complete_one(st, srv);
        }
    }

    /// Where the reply for unit `[first, first + count)` of area `ai` (`missing` of its pages
    /// not resident), requested just now, is received, with the pages it is received into made
    /// to exist. In place needs the whole unit missing: the reply then lands as is
    /// - in the program's view (`ReplyInto::View`): a demand fault on the faulting thread
    ///   (SIGBUS) of a program with no other thread, which cannot run before the reply is
    ///   installed; units of `VIEW_MIN` and more. Only the write-protect is left for after
    ///   the reply. Not for read-ahead: the program runs on before that reply arrives;
    /// - in the memfd's page cache through the alias (zero-copy), mapped with UFFDIO_CONTINUE;
    /// - in the shadow (units of `MOVE_MIN` and more, program with one thread), moved in.
    ///
    /// Else in the runtime's buffer, copied in (UFFDIO_COPY).
    pub(super) fn reply_target(
        &self,
        st: &mut State,
        ai: usize,
        first: usize,
        count: usize,
        missing: usize,
        readahead: bool,
    ) -> ReplyInto {
        if missing != count {
            return ReplyInto::Buffer;
        }
        let b = self.cfg.base_page;
        let a = st.areas[ai].as_ref().expect("live");
        let (start, len) = (a.addr + first * b, count * b);
        if let Some((alias, _)) = a.alias.as_ref().filter(|_| self.zero_copy) {
            let at = alias.addr() + first * b;
            if let Err(e) = madvise(at, len, Advice::PopulateWrite) {
                crate::fatal(format_args!("pagewise dlm: allocating {start:#x}+{len:#x} failed: {e}"));
            }
            return ReplyInto::Runtime(at);
        }
        let Some(place) = a.shadow.as_ref().filter(|_| self.cfg.move_install).map(|m| m.addr() + first * b) else {
            return ReplyInto::Buffer;
        };
        let to_view =
            !readahead && self.mode == FaultMode::Sigbus && len >= self.view_min() && self.program_stopped(st);
        if !to_view && (len < self.move_min(st) || self.clean_move(st) == CleanMove::Copied) {
            return ReplyInto::Buffer;
        }
        if to_view {
            self.fill_view(st, place, start, len);
            return ReplyInto::View;
        }
        match self.receive_target(st, place, len) {
            Some(ReceiveAt::Ready(at)) => ReplyInto::Runtime(at),
            Some(ReceiveAt::Fill(at)) => {
                self.fill_place(st, at, len);
                ReplyInto::Runtime(at)
            }
            None => ReplyInto::Buffer,
        }
    }

    /// Put pages at `[view, view + len)`, a wholly missing unit of the program's view whose
    /// reply is to be received there (`ReplyInto::View`): its own kept frames from its `place`
    /// in the shadow, else kept runs from anywhere, else fresh pages. All moved or copied in
    /// writable and without waking anyone; `install` write-protects them once the data is in
    /// (unless the fault is a known write).
    pub(super) fn fill_view(&self, st: &mut State, place: usize, view: usize, len: usize) {
        st.stats.view_receives += 1;
        let uffd = self.uffd.as_ref().expect("shadow areas have a uffd");
        let move_in = |dst: usize, src: usize, n: usize| {
            journal::record(Op::MoveIn, dst, src, n);
            if let Err(err) = uffd.move_pages(dst, src, n, false, false) {
                journal::fatal(
                    &[(dst, n), (src, n)],
                    format_args!("pagewise dlm: moving frames {src:#x}+{n:#x} to {dst:#x} failed: {err}"),
                );
            }
        };
        if !overlaps(&st.borrowed, place, len) && st.frames.take_in_place(place, len) {
            journal::record(Op::TakeInPlace, place, 0, len);
            move_in(view, place, len);
            return;
        }
        let mut off = 0;
        while off < len {
            let Some((src, n)) = st.frames.pop(len - off) else { break };
            move_in(view + off, src, n);
            off += n;
        }
        if off < len {
            journal::record(Op::CopyIn, view + off, 0, len - off);
            // SAFETY: `zeros` is a block long, at least as long as any unit.
            if let Err(err) = unsafe { uffd.copy(view + off, st.zeros.as_ptr(), len - off, false, false) } {
                crate::fatal(format_args!("pagewise dlm: allocating {:#x}+{:#x} failed: {err}", view + off, len - off));
            }
        }
    }

    /// Install the in-flight pages of `[first, first + count)`, units of `unit` pages each,
    /// write-protected — except the run holding page `open`, the page of a known write
    /// (`request`), which is installed writable and dirty. Each run of in-flight pages within
    /// a unit becomes one CLOCK entry; units moved in from the shadow are moved together.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn install(
        &self,
        st: &mut State,
        ai: usize,
        first: usize,
        count: usize,
        unit: usize,
        data: Fill<'_>,
        open: Option<usize>,
    ) {
        let b = self.cfg.base_page;
        // Gathered here unless the caller gathers (`Inner::serve`): a READ of several units
        // is then moved in with one call too.
        let gather_here = !st.move_ins.gathering;
        if gather_here {
            st.move_ins.gather();
        }
        let mut p = first;
        while p < first + count {
            if st.areas[ai].as_ref().expect("live").slot[p] != INFLIGHT {
                p += 1;
                continue;
            }
            let run_start = p;
            p += 1;
            while p < first + count
                && !(p - first).is_multiple_of(unit)
                && st.areas[ai].as_ref().expect("live").slot[p] == INFLIGHT
            {
                p += 1;
            }
            let n = p - run_start;
            let off = (run_start - first) * b;
            let dirty = open.is_some_and(|o| (run_start..p).contains(&o));
            let src = match data {
                Fill::Data(d) => d[off..off + n * b].as_ptr(),
                Fill::Zeros | Fill::InPlace(_) | Fill::InView => st.zeros.as_ptr(),
            };
            let a = st.areas[ai].as_ref().expect("live");
            // Small clean units are hashed, not protected (module doc of `runtime.rs`, "Dirty
            // tracking"): received into the view by the program's one thread, or copied in from
            // a buffer or zeros. A copy's hash is taken of its source: the copy wakes the
            // program, whose stores must show as a different hash at eviction.
            let copied = matches!(data, Fill::Data(_) | Fill::Zeros) && a.staging.is_none() && self.uffd.is_some();
            let hashed = !dirty && self.cfg.hash_clean && n * b <= HASH_MAX && (copied || matches!(data, Fill::InView));
            let dst = a.addr + run_start * b;
            let mut moved_hash = None;
            let r = match (&self.uffd, &a.staging) {
                // Received into the program's view itself (`ReplyInto::View`), where it is
                // writable: write-protect unless dirty. Protecting never wakes
                // (fs/userfaultfd.c), nor has it anyone to wake: the program's one thread is
                // the one serving this fault.
                (Some(_), _) if (dirty || hashed) && matches!(data, Fill::InView) => Ok(()),
                (Some(u), _) if matches!(data, Fill::InView) => u.write_protect(dst, n * b, true, true),
                // The data is in the shadow (the unit's place or borrowed frames): move it in.
                (Some(_), _) if a.shadow.is_some() && matches!(data, Fill::InPlace(_)) => {
                    let Fill::InPlace(at) = data else { unreachable!("matched above") };
                    moved_hash = self.move_in(st, ai, dst, at + off, n * b, dirty);
                    Ok(())
                }
                // The data is already in the memfd's page cache: map it.
                (Some(u), _) if matches!(data, Fill::InPlace(_)) => u.continue_wp(dst, n * b, !dirty, true),
                (Some(u), _) => {
                    journal::record(Op::CopyIn, dst, 0, n * b);
                    // SAFETY: src points at n*b readable bytes (the reply buffer or zeros,
                    // both at least one block long).
                    unsafe { u.copy(dst, src, n * b, !dirty && !hashed, true) }.map(|_| ())
                }
                (None, Some((stage, _))) => {
                    // SAFETY: the staging view covers the area; these pages are not yet
                    // readable through the program's view, so nobody observes the copy.
                    unsafe { std::ptr::copy_nonoverlapping(src, (stage.addr() + run_start * b) as *mut u8, n * b) };
                    mprotect(dst, n * b, if dirty { Protection::ReadWrite } else { Protection::Read })
                }
                (None, None) => unreachable!("an area has a uffd or a staging view"),
            };
            if let Err(e) = r {
                journal::fatal(
                    &[(dst, n * b)],
                    format_args!("pagewise dlm: installing {dst:#x}+{:#x} failed: {e}", n * b),
                );
            }
            let clean_hash = moved_hash.or_else(|| {
                hashed.then(|| {
                    st.stats.hashed_installs += 1;
                    // SAFETY: a copy's source is n*b readable bytes (above); a reply received
                    // into the view is present and readable at [dst, dst + n*b), and nobody
                    // else runs to write it (the program's one thread is serving this fault).
                    unsafe { content_hash(self.hash_seed, if copied { src as usize } else { dst }, n * b) }
                })
            });
            let entry =
                Entry { area: ai as u32, first: run_start as u32, count: n as u32, dirty, clean_hash, armed: false };
            let Some(slot) = st.clock.insert(entry) else {
                crate::fatal(format_args!("pagewise dlm: internal error: clock full"));
            };
            let a = st.areas[ai].as_mut().expect("live");
            a.slot[run_start..p].iter_mut().for_each(|s| *s = slot as u32);
        }
        if gather_here {
            self.move_in_gathered(st);
        }
    }
}

/// Largest READ of several read-ahead units ([`Inner::request_ahead`]). One READ per unit cost
/// a stream of 128 KiB units a request and a reply header each, and a move and a
/// write-protect of 32 pages each, which this VM's kernel flushes from the TLB page by page
/// (`Run` in `evict.rs`); units sharing a READ are received into adjacent frames and moved
/// in and protected with one call each, beyond the single-page flush ceiling. A demand fault
/// on a unit of a group waits for the whole group, and the read-ahead window holds fewer
/// groups the larger they are: `examples/dlm_stream` at 128 KiB units and a window of 32
/// (the stream of `pagewise eval dlm-fault`) ran at 2.4 GB/s with a READ per unit, 3.1 with
/// groups of 256 KiB, 3.6-4.0 with 512 KiB, 3.5-3.8 with 768 KiB and 1 MiB, and 2.8-3.1
/// with 2 MiB (medians of 5 passes, three or two runs each, interleaved).
const GROUP_MAX: usize = 512 << 10;

/// Read-ahead units gathered into one READ ([`Inner::request_ahead`]).
pub(super) struct Group {
    area: usize,
    first: usize,
    count: usize,
    unit: usize,
}

impl Group {
    /// Whether unit `[first, first + count)` of area `area` continues the group: the next unit
    /// of the same size, at the next pages of the same home, within `max_pages`.
    fn joins(&self, area: usize, first: usize, count: usize, layout: &crate::layout::Layout, max_pages: usize) -> bool {
        self.area == area
            && self.unit == count
            && self.first + self.count == first
            && self.count + count <= max_pages
            && layout.continues_on_home(self.first, self.count)
    }
}

/// How a clean unit gets from the shadow into the program's view (`Inner::clean_move`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CleanMove {
    /// Moved, then write-protected: nothing of the program runs in between.
    ThenProtect,
    /// Hashed in the shadow, then moved and left writable.
    Hashed,
    /// Copied in write-protected (UFFDIO_COPY mode WP); the frames stay in the shadow.
    Copied,
}

/// Where a reply received in place lands (`Inner::receive_target`).
#[derive(Clone, Copy)]
pub(super) enum ReceiveAt {
    /// Pages are there already.
    Ready(usize),
    /// The pages are to be made to exist there while the request travels.
    Fill(usize),
}

/// Which base pages of `[addr, addr + len)` are present (mincore(2)), as a bitmap of `1`s and
/// `.`s: what a failed move found where it moved from and to.
fn present_pages(addr: usize, len: usize) -> String {
    let mut v = vec![0u8; len.div_ceil(pagewise_kernel::mem::page_size())];
    match pagewise_kernel::mem::mincore(addr, len, &mut v) {
        Ok(()) => v.iter().map(|&p| if p & 1 != 0 { '1' } else { '.' }).collect(),
        Err(e) => format!("unknown ({e})"),
    }
}

/// Whether `[addr, addr + len)` overlaps any of `ranges`.
pub(super) fn overlaps(ranges: &[(usize, usize)], addr: usize, len: usize) -> bool {
    ranges.iter().any(|&(a, l)| a < addr + len && addr < a + l)
}

/// Units moved from the shadow into the program's view, gathered while adjacent in both, in
/// one area (two areas' views may be adjacent yet two mappings, which one UFFDIO_MOVE
/// refuses) and to be left alike (write-protected, or writable: hashed or dirty), so that a
/// stream's replies taken together — and the units of one READ — are moved in (and
/// write-protected) with one system call each, and one TLB flush ([`Run`] says why that
/// pays). Only between `gather` and `finish`, which `Inner::serve` brackets around taking
/// replies and `Inner::install` around installing one; nothing in between reads the gathered
/// ranges of the view or the shadow.
#[derive(Default)]
pub(crate) struct MoveIns {
    pub(super) gathering: bool,
    area: usize,
    dst: usize,
    src: usize,
    len: usize,
    writable: bool,
}

impl MoveIns {
    pub(crate) fn gather(&mut self) {
        debug_assert!(self.len == 0, "nothing left over from the last gathering");
        self.gathering = true;
    }

    /// Whether pages of area `area` moving from `src` to `dst`, to be left `writable` or not,
    /// continue the range gathered so far.
    pub(super) fn joins(&self, area: usize, dst: usize, src: usize, writable: bool) -> bool {
        self.len > 0
            && self.area == area
            && self.writable == writable
            && self.dst + self.len == dst
            && self.src + self.len == src
    }

    /// Gather `[src, src + len)` moving to `[dst, dst + len)`: joined to the range gathered
    /// so far, or a new range if that is empty (the caller [`MoveIns::take`]s it first).
    pub(super) fn add(&mut self, area: usize, dst: usize, src: usize, len: usize, writable: bool) {
        if self.joins(area, dst, src, writable) {
            self.len += len;
        } else {
            debug_assert!(self.len == 0, "a range that does not join is taken first");
            (self.area, self.dst, self.src, self.len, self.writable) = (area, dst, src, len, writable);
        }
    }

    /// The range gathered `(dst, src, len, writable)`, to be moved in now; gathering goes on.
    pub(super) fn take(&mut self) -> Option<(usize, usize, usize, bool)> {
        let r = (self.len > 0).then_some((self.dst, self.src, self.len, self.writable));
        self.len = 0;
        r
    }

    /// Stop gathering; the range gathered, to be moved in now.
    pub(super) fn finish(&mut self) -> Option<(usize, usize, usize, bool)> {
        self.gathering = false;
        self.take()
    }
}

/// Where the data of pages being installed comes from.
#[derive(Clone, Copy)]
pub(super) enum Fill<'a> {
    /// Zeros (never written home).
    Zeros,
    /// A reply in a buffer (copied in).
    Data(&'a [u8]),
    /// Received where it is to be mapped from: at this address of the shadow (moved in), or of
    /// the alias (already in the memfd's page cache, zero-copy).
    InPlace(usize),
    /// Received into the program's view itself (`ReplyInto::View`).
    InView,
}

#[cfg(test)]
mod tests {
    use super::MoveIns;

    #[test]
    pub(super) fn move_ins_join_only_ranges_adjacent_in_both_mappings() {
        let mut m = MoveIns::default();
        m.gather();
        assert!(!m.joins(0, 0x10000, 0x90000, false), "nothing gathered yet");
        m.add(0, 0x10000, 0x90000, 0x1000, false);
        assert!(m.joins(0, 0x11000, 0x91000, false));
        assert!(!m.joins(1, 0x11000, 0x91000, false), "adjacent in both, but another area's view");
        assert!(!m.joins(0, 0x11000, 0x91000, true), "adjacent in both, but to be left writable");
        m.add(0, 0x11000, 0x91000, 0x2000, false);
        assert!(!m.joins(0, 0x13000, 0x95000, false), "adjacent in the view, not in the shadow");
        assert!(!m.joins(0, 0x14000, 0x93000, false), "adjacent in the shadow, not in the view");
        assert_eq!(m.take(), Some((0x10000, 0x90000, 0x3000, false)));
        m.add(0, 0x13000, 0x95000, 0x1000, true);
        assert_eq!(m.finish(), Some((0x13000, 0x95000, 0x1000, true)));
        assert!(!m.gathering);
        assert_eq!(m.finish(), None);
    }
}
