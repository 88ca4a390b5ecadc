//! Remote I/O: the connections to the memory servers, what each owes us, and every reply
//! checked against its request before a byte of it is used. The fault path's sends and
//! receives allocate nothing, also when they fail (`State::fail` formats into a fixed buffer).

use std::collections::VecDeque;

use super::{Fill, Inner, State};
use crate::proto::{Header, Opcode, Status, HEADER_LEN};
use crate::transport::Transport;
use crate::DlmError;

pub(super) enum Pending {
    /// `open`: the page of a known write the unit was requested for (`Inner::request`).
    /// `unit`: pages per unit; `count` is a multiple of it (several read-ahead units in one
    /// READ, `Inner::request_ahead`), and each unit is installed as one CLOCK entry.
    Read {
        area: u32,
        first: usize,
        count: usize,
        unit: usize,
        into: ReplyInto,
        sent: Sent,
        open: Option<usize>,
    },
    Write {
        area: u32,
        first: usize,
        count: usize,
        sent: Sent,
    },
    /// Pages the program dropped, forgotten at their home (`Dlm::discard`).
    Discard {
        area: u32,
        first: usize,
        count: usize,
        sent: Sent,
    },
}

/// Where a READ's reply is received (`Inner::reply_target`).
#[derive(Clone, Copy)]
pub(super) enum ReplyInto {
    /// The runtime's buffer, then copied in (UFFDIO_COPY).
    Buffer,
    /// This address of the runtime's own mapping (the shadow, or the memfd's alias), reserved
    /// for the reply: the unit's place or frames borrowed for it. Mapped in from there.
    Runtime(usize),
    /// The unit's place in the program's view, where its pages were put while the request
    /// travelled; write-protected once the data is in.
    View,
}

/// What a request named, so its reply can be checked against it before any byte is used.
#[derive(Clone, Copy)]
pub(super) struct Sent {
    id: u32,
    region: u32,
    page: u64,
    set_count: u32,
}

impl Sent {
    fn of(h: &Header) -> Self {
        Sent { id: h.request_id, region: h.region, page: h.page, set_count: h.set_count }
    }

    /// Why `rep` cannot be the reply to this request (op: its opcode), if it cannot.
    fn mismatch(&self, rep: &Header, op: Opcode, payload: usize) -> Option<&'static str> {
        if rep.magic != crate::proto::MAGIC {
            Some("bad magic")
        } else if rep.version != crate::proto::VERSION {
            Some("bad protocol version")
        } else if rep.opcode != op as u8 | crate::proto::REPLY_BIT {
            Some("reply to another operation")
        } else if rep.request_id != self.id {
            Some("reply to another request id")
        } else if rep.region != self.region {
            Some("reply for another region")
        } else if rep.page != self.page || rep.set_count != self.set_count {
            Some("reply for other pages")
        } else if rep.status == Status::Ok as u16 && rep.length as usize != payload {
            Some("reply of the wrong length")
        } else {
            None
        }
    }
}

/// Longest error message a reply may carry; longer is a broken or hostile server.
const MAX_ERROR_MESSAGE: u32 = 4096;
/// Longest STATS reply accepted (a few hundred bytes of JSON in practice).
const MAX_STATS_REPLY: u32 = 64 << 10;

impl Sent {
    /// Why `rep` cannot be the reply to this synchronous request (ALLOC, FREE, STATS, or a
    /// READ outside the fault path), if it cannot: the checks of [`Sent::mismatch`] — except the region of ALLOC's reply,
    /// which names the new region — and a bound on the length for each kind of reply, so a
    /// broken or hostile server gets a clear error instead of making us allocate what its
    /// length field asks for (issue 23).
    fn sync_mismatch(&self, rep: &Header, op: Opcode) -> Option<&'static str> {
        let limit = match (rep.status == Status::Ok as u16, op) {
            (false, _) => MAX_ERROR_MESSAGE,
            (true, Opcode::Stats) => MAX_STATS_REPLY,
            // A synchronous READ (`fetch_into`) checks the exact length against its pages.
            (true, Opcode::Read) => crate::proto::MAX_PAYLOAD,
            (true, _) => 0,
        };
        if rep.length > limit {
            return Some(if rep.status == Status::Ok as u16 {
                "reply longer than its request allows"
            } else {
                "error reply with a message longer than 4 KiB"
            });
        }
        let region = if op == Opcode::Alloc { rep.region } else { self.region };
        let why = Sent { region, ..*self }.mismatch(rep, op, rep.length as usize);
        if why.is_none() && op == Opcode::Alloc && rep.status == Status::Ok as u16 && rep.region == 0 {
            return Some("ALLOC reply naming no region");
        }
        why
    }
}

pub(super) struct Conn {
    pub(super) t: Box<dyn Transport>,
    pub(super) addr: String,
    pub(super) next_id: u32,
    pub(super) pending: VecDeque<Pending>,
    /// READ requests queued (already in `pending`) but not yet sent: read-ahead requests leave
    /// in one batch (`State::flush`); anything that sends or receives on the connection
    /// flushes first, so replies still come in `pending` order.
    pub(super) corked: Vec<Header>,
}

impl Inner {
    /// Take the next reply owed by server `srv`; false when none is owed.
    pub(super) fn complete_one(&self, st: &mut State, srv: usize) -> bool {
        let Some(p) = st.conns[srv].pending.pop_front() else { return false };
        let b = self.cfg.base_page;
        let (ai, first, count, unit, op, into, sent, open) = match p {
            Pending::Read { area, first, count, unit, into, sent, open } => {
                (area as usize, first, count, unit, Opcode::Read, into, sent, open)
            }
            Pending::Write { area, first, count, sent } => {
                (area as usize, first, count, count, Opcode::Write, ReplyInto::Buffer, sent, None)
            }
            Pending::Discard { area, first, count, sent } => {
                (area as usize, first, count, count, Opcode::Discard, ReplyInto::Buffer, sent, None)
            }
        };
        let is_read = op == Opcode::Read;
        let start = st.areas[ai].as_ref().map(|a| a.addr + first * b).unwrap_or(0);
        st.flush(srv, start, count * b);
        // While the reply is awaited, its destination is read into the cache a chunk at a
        // time (`warm`): the reply is then copied into cached lines whose translations are
        // in the TLB. A 64 KiB reply took 19 µs to receive into cold pages and 10 µs into
        // warmed ones; warming took 8 µs of the ~20 µs wait. A reply into the buffer needs
        // none: the buffer stays warm.
        let dest = match into {
            ReplyInto::Buffer => None,
            ReplyInto::Runtime(at) => Some(at),
            ReplyInto::View => Some(start),
        };
        let mut warmed = 0;
        let mut warm_next = || match dest {
            Some(at) if warmed < count * b => {
                let n = WARM_CHUNK.min(count * b - warmed);
                // SAFETY: `reply_target` put pages at all of `[at, at + count*b)`.
                unsafe { warm(at + warmed, n) };
                warmed += n;
                true
            }
            _ => false,
        };
        let h = match st.conns[srv].t.recv_header_working(&mut warm_next) {
            Ok(h) => h,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => st.fail(
                srv,
                &format_args!(
                    "no reply within {:?} (the server is stopped, hung or cut off)",
                    self.cfg.fault_timeout.unwrap_or_default()
                ),
                start,
                count * b,
            ),
            Err(e) => st.fail(srv, &format_args!("connection lost: {e}"), start, count * b),
        };
        // Every reply is checked against its request before a byte of it is used: a reply
        // that does not match stops the program, it never installs bytes (issue 9).
        if let Some(why) = sent.mismatch(&h, op, if is_read { count * b } else { 0 }) {
            st.fail(
                srv,
                &format_args!(
                    "{why} (got opcode {:#x} status {} id {} region {} page {} set {} length {}; sent id {} region {} page {} set {})",
                    h.opcode, h.status, h.request_id, h.region, h.page, h.set_count, h.length,
                    sent.id, sent.region, sent.page, sent.set_count
                ),
                start,
                count * b,
            );
        }
        if h.status != Status::Ok as u16 {
            let mut msg = [0u8; 256];
            let n = (h.length as usize).min(msg.len());
            let _ = st.conns[srv].t.recv_payload(&mut msg[..n]);
            // No allocation here either: this may run in a signal handler.
            let text = std::str::from_utf8(&msg[..n]).unwrap_or("(message not UTF-8)");
            let name = Status::from_u16(h.status).map(|s| s.name()).unwrap_or("unknown status");
            st.fail(srv, &format_args!("error reply {name} to {op:?}: {text}"), start, count * b);
        }
        if !is_read {
            return true;
        }
        let (at, fill) = match into {
            ReplyInto::Buffer => (None, None),
            ReplyInto::Runtime(at) => (Some(at), Some(Fill::InPlace(at))),
            ReplyInto::View => (Some(start), Some(Fill::InView)),
        };
        if let (Some(at), Some(fill)) = (at, fill) {
            // SAFETY: `at` is count*b bytes that `reply_target` reserved for this reply and put
            // pages at, which nobody but this reply can touch until it is installed: the unit's
            // place or borrowed frames in the runtime's own mapping (the shadow, or the memfd's
            // alias), which the program does not see; or the unit's place in the program's
            // view, which the program cannot reach until it is installed — its one thread is
            // the one serving this demand fault, with all signals blocked (`signals.rs`), and
            // it installs this reply before returning.
            let dst = unsafe { std::slice::from_raw_parts_mut(at as *mut u8, count * b) };
            if let Err(e) = st.conns[srv].t.recv_payload(dst) {
                st.fail(srv, &format_args!("connection lost: {e}"), start, count * b);
            }
            st.stats.fetched_units += (count / unit) as u64;
            st.stats.fetched_bytes += (count * b) as u64;
            super::journal::record(super::journal::Op::Receive, at, start, count * b);
            // Installing moves the pages away from `at`: its place is free again.
            st.borrowed.retain(|&(a, _)| a != at);
            self.install(st, ai, first, count, unit, fill, open);
            return true;
        }
        // Into the buffer (one block long) a unit at a time: a READ of several units is
        // longer than the buffer.
        let mut buf = std::mem::take(&mut st.buf);
        for u in (first..first + count).step_by(unit) {
            if let Err(e) = st.conns[srv].t.recv_payload(&mut buf[..unit * b]) {
                st.fail(srv, &format_args!("connection lost: {e}"), start, count * b);
            }
            st.stats.fetched_units += 1;
            st.stats.fetched_bytes += (unit * b) as u64;
            self.install(st, ai, u, unit, unit, Fill::Data(&buf[..unit * b]), open);
        }
        st.buf = buf;
        true
    }
}

/// Units [`Inner::complete_arrived`] takes at most in one go (the reply that reaches it is
/// taken whole): bounds the work one fault does for units ahead of the program (16 units of
/// 128 KiB: 2 MiB to receive, a few hundred µs).
const ARRIVED_MAX: usize = 16;

impl Inner {
    /// Take the READ replies owed by server `srv` that have arrived whole (header and
    /// payload in the socket), so taking them does not wait: read-ahead the program has not
    /// reached yet. It would fault on each; this way it does not, and `MoveIns` moves adjacent
    /// ones in together. Returns the area and end page of the last unit taken.
    pub(super) fn complete_arrived(&self, st: &mut State, srv: usize) -> Option<(usize, usize)> {
        let b = self.cfg.base_page;
        let mut last = None;
        // Asked once, and again only when what was there runs out: one ioctl per batch.
        let mut there = 0;
        let mut taken = 0;
        while taken < ARRIVED_MAX {
            let Some(&Pending::Read { area, first, count, unit, .. }) = st.conns[srv].pending.front() else { break };
            let whole = HEADER_LEN + count * b;
            if there < whole {
                there = st.conns[srv].t.arrived();
            }
            if !st.conns[srv].corked.is_empty() || there < whole {
                break;
            }
            there -= whole;
            self.complete_one(st, srv);
            st.stats.arrived_installs += (count / unit) as u64;
            taken += count / unit;
            // For the tuner, each unit counts as faulted on at its start, where the stream the
            // read-ahead follows would have touched it first: it sees the same working set
            // whether a reply arrived before the program or after.
            if let Some(a) = st.areas[area as usize].as_mut() {
                (first..first + count).step_by(unit).for_each(|u| crate::measure::mark(&mut a.touched, u));
            }
            last = Some((area as usize, first + count));
        }
        last
    }
}

/// Bytes [`warm`] reads between two looks at whether a reply has arrived (about 2 µs).
const WARM_CHUNK: usize = 16 << 10;

/// Read `[addr, addr + len)` into the cache, one load per cache line.
///
/// # Safety
/// The range must be mapped readable with its pages present (no load may fault: this can run
/// in the SIGBUS handler with the runtime's lock held).
unsafe fn warm(addr: usize, len: usize) {
    let mut sum = 0u64;
    for off in (0..len).step_by(64) {
        // SAFETY: inside the caller's range.
        sum = sum.wrapping_add(unsafe { ((addr + off) as *const u64).read_volatile() });
    }
    std::hint::black_box(sum);
}

impl State {
    /// Send a message or stop the program naming the server and the range concerned.
    pub(super) fn send(&mut self, srv: usize, mut h: Header, payload: &[u8], start: usize, len: usize) -> Sent {
        self.flush(srv, start, len);
        let c = &mut self.conns[srv];
        h.request_id = c.next_id;
        c.next_id = c.next_id.wrapping_add(1);
        h.length = payload.len() as u32;
        if let Err(e) = c.t.send(&h, payload) {
            self.fail(srv, &format_args!("connection lost: {e}"), start, len);
        }
        Sent::of(&h)
    }

    /// Queue a payload-less request (READ) to leave with the next [`State::flush`].
    pub(super) fn queue_read(&mut self, srv: usize, mut h: Header, start: usize, len: usize) -> Sent {
        if self.conns[srv].corked.len() == self.conns[srv].corked.capacity() {
            self.flush(srv, start, len);
        }
        let c = &mut self.conns[srv];
        h.request_id = c.next_id;
        c.next_id = c.next_id.wrapping_add(1);
        h.length = 0;
        c.corked.push(h);
        Sent::of(&h)
    }

    /// Send the queued requests of server `srv` (`start`/`len`: the range named on failure).
    pub(super) fn flush(&mut self, srv: usize, start: usize, len: usize) {
        if self.conns[srv].corked.is_empty() {
            return;
        }
        let c = &mut self.conns[srv];
        let r = c.t.send_headers(&c.corked);
        c.corked.clear();
        if let Err(e) = r {
            self.fail(srv, &format_args!("connection lost: {e}"), start, len);
        }
    }

    pub(super) fn fail(&self, srv: usize, what: &std::fmt::Arguments<'_>, start: usize, len: usize) -> ! {
        let c = &self.conns[srv];
        crate::fatal(format_args!(
            "pagewise dlm: memory server {srv} ({}) failed: {what}; it is the home of pages \
             {start:#x}-{:#x} of this program, which cannot continue without them",
            c.addr,
            start + len
        ))
    }

    pub(super) fn lost(&self, srv: usize, e: std::io::Error) -> DlmError {
        DlmError::Server { server: self.conns[srv].addr.clone(), detail: e.to_string() }
    }

    /// A synchronous request outside the fault path (ALLOC, FREE, STATS, a detach's READ):
    /// error as a value. Nothing may be owed on the connection (`Inner::drain_all`): the next
    /// reply read is taken for this one's.
    pub(super) fn call_raw(&mut self, srv: usize, mut h: Header, payload: &[u8]) -> Result<Header, DlmError> {
        assert!(self.conns[srv].pending.is_empty(), "replies owed before a synchronous call");
        self.flush(srv, 0, 0);
        let c = &mut self.conns[srv];
        h.request_id = c.next_id;
        c.next_id = c.next_id.wrapping_add(1);
        h.length = payload.len() as u32;
        c.t.send(&h, payload).map_err(|e| self.lost(srv, e))?;
        let rep = self.conns[srv].t.recv_header().map_err(|e| self.lost(srv, e))?;
        self.check_sync_reply(srv, &h, &rep)?;
        if rep.status != 0 {
            let mut body = vec![0u8; rep.length as usize];
            self.conns[srv].t.recv_payload(&mut body).map_err(|e| self.lost(srv, e))?;
            let name = Status::from_u16(rep.status).map(|s| s.name()).unwrap_or("unknown status");
            return Err(DlmError::Server {
                server: self.conns[srv].addr.clone(),
                detail: format!("{name}: {}", String::from_utf8_lossy(&body)),
            });
        }
        Ok(rep)
    }

    /// Check a synchronous reply against its request ([`Sent::sync_mismatch`]). A mismatch
    /// leaves the connection out of step, so it is an error naming the server, and nothing
    /// of the reply is read.
    fn check_sync_reply(&self, srv: usize, req: &Header, rep: &Header) -> Result<(), DlmError> {
        let Some(op) = Opcode::from_u8(req.opcode) else { return Ok(()) };
        match Sent::of(req).sync_mismatch(rep, op) {
            None => Ok(()),
            Some(why) => Err(DlmError::Server {
                server: self.conns[srv].addr.clone(),
                detail: format!(
                    "{why} (got opcode {:#x} status {} id {} region {} length {}; sent {op:?} id {} region {})",
                    rep.opcode, rep.status, rep.request_id, rep.region, rep.length, req.request_id, req.region
                ),
            }),
        }
    }

    pub(super) fn call(&mut self, srv: usize, h: Header, payload: &[u8]) -> Result<Header, DlmError> {
        let rep = self.call_raw(srv, h, payload)?;
        if rep.length > 0 {
            let mut body = vec![0u8; rep.length as usize];
            self.conns[srv].t.recv_payload(&mut body).map_err(|e| self.lost(srv, e))?;
        }
        Ok(rep)
    }
}
