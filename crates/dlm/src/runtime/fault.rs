//! The fault path: where a fault on a DLM area is served, whoever receives it — the
//! handler thread (userfaultfd messages) or the faulting thread itself (the SIGBUS / SIGSEGV
//! handlers in `signals.rs`). Lookup, the unit at the current set count, read-ahead, install,
//! first-write opening, and the tuner's per-fault bookkeeping.

use std::sync::atomic::Ordering;

use pagewise_kernel::colocate::Colocation;
use pagewise_kernel::mem::{mprotect, Protection};
use pagewise_kernel::uffd::Event;

use super::{Access, Inner, State, DETACHED, GONE, INFLIGHT, MAX_PENDING, NONE};
use crate::config::FaultMode;

pub(super) fn handler_thread(inner: &Inner) {
    let uffd = inner.uffd.as_ref().expect("handler mode has a uffd");
    let fd = std::os::fd::AsRawFd::as_raw_fd(uffd);
    let mut colocation = if inner.cfg.colocate { Colocation::new(1) } else { None };
    // The tuner counts this thread's CPU time as the runtime's, not the program's.
    inner.lock().handler_clock = pagewise_kernel::cpu::CpuClock::this_thread().ok();
    // Until when the handler watches for the next fault instead of sleeping (see WATCH).
    let mut watch_until: Option<std::time::Instant> = None;
    while !inner.stop.load(Ordering::Acquire) {
        let watching = watch_until.is_some_and(|t| std::time::Instant::now() < t);
        if !watching {
            watch_until = None;
            // While pinned, threads the program starts share its one CPU until the next
            // check: check often.
            let wait = if colocation.as_ref().is_some_and(Colocation::is_pinned) { 10 } else { 100 };
            match pagewise_kernel::net::poll(fd, std::time::Duration::from_millis(wait)) {
                Ok(true) => {}
                Ok(false) => {
                    if let Some(c) = &mut colocation {
                        c.check(None);
                    }
                    continue;
                }
                Err(e) => crate::fatal(format_args!("pagewise dlm: waiting for faults failed: {e}")),
            }
        }
        // One event per wake-up, then back to poll, which returns at once while more are
        // queued: reading on until EAGAIN would put one more system call on every fault's
        // path, between the reply's UFFDIO_COPY and the faulting thread running again when
        // the two share a CPU (colocation). While watching, the read comes after the yield.
        if watching {
            std::thread::yield_now();
        }
        match uffd.read_event() {
            Ok(Some(Event::Pagefault { addr, write, thread_id, .. })) => {
                let pinned = match &mut colocation {
                    Some(c) if thread_id != 0 => c.check(Some(thread_id)),
                    _ => false,
                };
                // A panic here would leave the faulting thread waiting forever: stop instead.
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let mut st = inner.lock();
                    st.stats.colocations += u64::from(pinned);
                    st.colocated = colocation.as_ref().is_some_and(Colocation::is_pinned);
                    if let Served::NotOurs = inner.serve(&mut st, addr, write) {
                        // Registered with this userfaultfd but no area's: a range the
                        // runtime gave up as the fault was taken. Retried, it meets what
                        // is mapped there now.
                        let _ = uffd.wake(addr & !(inner.cfg.base_page - 1), inner.cfg.base_page);
                    }
                }));
                if r.is_err() {
                    crate::fatal(format_args!("pagewise dlm: the fault handler failed at {addr:#x}"));
                }
                if colocation.as_ref().is_some_and(Colocation::is_pinned) {
                    watch_until = Some(std::time::Instant::now() + WATCH);
                }
            }
            Ok(Some(_) | None) => {}
            Err(e) => {
                crate::fatal(format_args!("pagewise dlm: reading the userfaultfd failed: {e}"));
            }
        }
    }
    if let Some(c) = &mut colocation {
        c.release();
    }
}

/// How long the handler, sharing one CPU with the program (colocation), stays runnable after a
/// fault — yielding the CPU to the program between looks at the userfaultfd — before it
/// sleeps in poll: a program paging at full speed faults again within that time, and then finds
/// the handler ready instead of waking it.
const WATCH: std::time::Duration = std::time::Duration::from_micros(50);

/// Result of a fault lookup.
pub(crate) enum Served {
    Ours,
    NotOurs,
}

impl Inner {
    /// Serve a fault at `addr` (write: known to be a write). Fatal on server failure.
    pub(crate) fn serve(&self, st: &mut State, addr: usize, write: bool) -> Served {
        let b = self.cfg.base_page;
        // Areas may lie inside one another's span: one made where the program unmapped part
        // of another (MAP_FIXED). The page is served by the area it is live in.
        let covers = |a: &super::Area| addr >= a.addr && addr < a.addr + a.len;
        let live_at = |a: &super::Area| covers(a) && super::is_live(a.slot[(addr - a.addr) / b]);
        let Some(ai) = st
            .areas
            .iter()
            .position(|a| a.as_ref().is_some_and(live_at))
            .or_else(|| st.areas.iter().position(|a| a.as_ref().is_some_and(covers)))
        else {
            return Served::NotOurs;
        };
        let (page, a_addr) = {
            let a = st.areas[ai].as_ref().expect("present");
            ((addr - a.addr) / b, a.addr)
        };
        let slot = st.areas[ai].as_ref().expect("present").slot[page];
        if slot == DETACHED {
            // Taken out of DLM (`Dlm::detach`) while this fault waited: the page is plain
            // memory of the program now, its fault is retried there.
            if let Some(u) = &self.uffd {
                let _ = u.wake(addr & !(b - 1), b);
            }
            return Served::Ours;
        }
        if slot == GONE {
            // Unmapped by the program (or past the allocation): whatever is there now is not
            // DLM's. A handler-thread message for it is stale (the faulting access was to a
            // range being unmapped): wake it; it retries and gets what the kernel gives.
            if self.mode == FaultMode::HandlerThread {
                if let Some(u) = &self.uffd {
                    let _ = u.wake(addr & !(b - 1), b);
                }
                return Served::Ours;
            }
            return Served::NotOurs;
        }
        if slot != NONE && slot != INFLIGHT {
            // Resident: a use of an armed unit, a first write (WP / PROT_READ), or a fault
            // that lost a race.
            let e = *st.clock.get(slot as usize).expect("live slot");
            st.clock.touch(slot as usize);
            let start = a_addr + e.first as usize * b;
            let len = e.count as usize * b;
            if e.armed {
                // A known write to a clean unit is opened at once (no second, WP fault); a
                // hashed unit goes back as it was, writable.
                let dirty = e.dirty || write;
                let entry = st.clock.get_mut(slot as usize).expect("live");
                entry.armed = false;
                entry.dirty = dirty;
                if dirty {
                    entry.clean_hash = None;
                }
                let open = dirty || entry.clean_hash.is_some();
                st.stats.reference_faults += 1;
                st.sampling.returned();
                self.map_again(st, ai, e.first as usize, start, len, open);
                return Served::Ours;
            }
            // Under SIGBUS the kind of fault is not known: a thread that faulted on an armed
            // unit together with the one that mapped it lands here and marks it dirty — a
            // spare write-back, never a lost one. A hashed unit is writable already.
            if !e.dirty && e.clean_hash.is_none() && (write || self.mode != FaultMode::HandlerThread) {
                st.clock.get_mut(slot as usize).expect("live").dirty = true;
                st.stats.wp_faults += 1;
                st.stats.opened_units += 1;
                self.unprotect(start, len);
            } else if let Some(u) = &self.uffd {
                let _ = u.wake(start, len);
            }
            return Served::Ours;
        }
        st.stats.faults += 1;
        let t0 = std::time::Instant::now();
        crate::measure::mark(&mut st.areas[ai].as_mut().expect("present").touched, page);
        let set = st.set_count as usize;
        let layout = st.areas[ai].as_ref().expect("present").layout;
        let (first, count) = layout.unit(page, set);
        let was_inflight = slot == INFLIGHT;
        if !was_inflight {
            self.request(st, ai, first, count, false, write.then_some(page));
        }
        // Read-ahead: a fault that continues the last one (or lands on read-ahead) grows the
        // window; anything else resets it.
        let (ra, sequential) = {
            let a = st.areas[ai].as_mut().expect("present");
            let (sequential, max) = match a.access {
                // The unit holding the stream's end: the next one, or, just after a larger
                // size came into force, the one the stream was inside of.
                Access::Normal => (was_inflight || (first..first + count).contains(&a.last_end), self.cfg.readahead),
                Access::Sequential => (true, self.cfg.readahead),
                Access::Random => (false, 0),
            };
            a.window = crate::layout::next_window(a.window, sequential, max);
            a.last_end = first + count;
            (a.window, sequential)
        };
        if !was_inflight {
            st.measure.fetched(count * b, sequential);
        }
        // Keep read-ahead within a quarter of the local limit so it never evicts the stream.
        let ra = ra.min(self.cfg.local_mem / 4 / (set * b)).min(MAX_PENDING / 2);
        // Top the window up in batches: only once less than half of it is still ahead, then
        // all of it, so the requests leave in one message (and the room is made in one go).
        let mut next = first + count;
        let mut ahead = 0;
        while ahead < ra && next < layout.pages {
            let (f, c) = layout.unit(next, set);
            if st.areas[ai].as_ref().expect("present").slot[f..f + c].contains(&NONE) {
                break;
            }
            ahead += 1;
            next = f + c;
        }
        if ra < 4 || ahead * 2 < ra {
            // Room for the whole batch at once: its victims are dropped together.
            self.make_room(st, (ra - ahead) * set * b);
            let mut group = None;
            for _ in ahead..ra {
                if next >= layout.pages {
                    break;
                }
                let (f, c) = layout.unit(next, set);
                let a = st.areas[ai].as_ref().expect("present");
                if a.slot[f..f + c].contains(&NONE) {
                    self.request_ahead(st, ai, f, c, &mut group);
                    // Read-ahead follows streams only.
                    st.measure.fetched(c * b, true);
                }
                next = f + c;
            }
            self.request_group(st, &mut group);
            for s in 0..st.conns.len() {
                st.flush(s, a_addr + first * b, count * b);
            }
        }
        // Install everything queued up to and including the faulting page, then whatever has
        // arrived whole behind it: a stream's read-ahead running ahead of the program. Those
        // units then need no fault of their own, and adjacent ones are moved in together.
        let (srv, _) = layout.home(page);
        st.move_ins.gather();
        while st.areas[ai].as_ref().expect("present").slot[page] == INFLIGHT {
            if !self.complete_one(st, srv) {
                crate::fatal(format_args!("pagewise dlm: internal error: page {page} in flight but nothing pending"));
            }
        }
        let taken = self.complete_arrived(st, srv);
        self.move_in_gathered(st);
        if let Some((area, end)) = taken.filter(|&(area, _)| area == ai) {
            // The program's next fault in the stream lands after the units taken: it still
            // continues the stream (read-ahead detection, above).
            let a = st.areas[area].as_mut().expect("present");
            a.last_end = a.last_end.max(end);
        }
        if write {
            // Known write to a unit that was on its way already (read-ahead), installed
            // write-protected: open it now instead of taking a second (WP) fault.
            let s = st.areas[ai].as_ref().expect("present").slot[page] as usize;
            if let Some(e) = st.clock.get_mut(s) {
                if !e.dirty && e.clean_hash.is_none() {
                    e.dirty = true;
                    let (start, len) = (a_addr + e.first as usize * b, e.count as usize * b);
                    st.stats.opened_units += 1;
                    self.unprotect(start, len);
                }
            }
        }
        let now = std::time::Instant::now();
        if st.measure.loop_fault(st.set_count) {
            st.measure.loop_faults = 0;
            let touched = st.touched();
            let (id, started) = st.measure.active.expect("a loop is measured");
            let tuner = st.measure.tuner;
            if let Some(state) = st.measure.loops.get_mut(&id) {
                let time = now.duration_since(started).as_secs_f64();
                if let Some(d) = crate::tune::decide_early(&tuner, state, &touched, time, id) {
                    let set = state.set;
                    st.measure.log(d);
                    st.apply_set_count(set);
                    st.clear_touched();
                }
            }
        }
        if st.measure.fault(now - t0, now) {
            let touched = st.touched();
            let cpu = st.program_cpu();
            let set = st.measure.close_window(&touched, now, cpu);
            st.apply_set_count(set);
            st.clear_touched();
        }
        Served::Ours
    }

    /// Map an armed unit back into the program's view: write-protected unless `open` (dirty,
    /// or hashed).
    fn map_again(&self, st: &mut State, ai: usize, first: usize, start: usize, len: usize, open: bool) {
        let shadow = st.areas[ai].as_ref().expect("present").shadow.as_ref().map(|m| m.addr());
        if let Some(sh) = shadow {
            super::journal::record(super::journal::Op::MapAgain, start, sh + first * self.cfg.base_page, len);
            if let Some(h) = self.move_in(st, ai, start, sh + first * self.cfg.base_page, len, open) {
                let slot = st.areas[ai].as_ref().expect("present").slot[first] as usize;
                st.clock.get_mut(slot).expect("live").clean_hash = Some(h);
            }
            return;
        }
        let r = match &self.uffd {
            // The unit's pages are in the memfd's page cache: a minor fault.
            Some(u) => u.continue_wp(start, len, !open, true),
            None => mprotect(start, len, if open { Protection::ReadWrite } else { Protection::Read }),
        };
        if let Err(e) = r {
            crate::fatal(format_args!("pagewise dlm: mapping {start:#x}+{len:#x} again failed: {e}"));
        }
    }

    pub(super) fn unprotect(&self, start: usize, len: usize) {
        let r = match &self.uffd {
            Some(u) => u.write_protect(start, len, false, true),
            None => mprotect(start, len, Protection::ReadWrite),
        };
        if let Err(e) = r {
            crate::fatal(format_args!("pagewise dlm: opening {start:#x}+{len:#x} for writing failed: {e}"));
        }
    }
}
