//! Redundancy's mechanism (issue 24 item 3): one [`Transport`] that stands for all the memory
//! servers of a run whose units are stored with redundancy (`redundancy.rs` decides where each
//! piece lives and which pieces a read takes). The runtime sees one server holding every
//! block; each of its requests becomes requests for pieces on several servers, and its replies
//! are made from theirs:
//! - ALLOC: a region on each server for the pieces it holds ([`Placement`]), in granules of
//!   one piece of a page (B/K under `ec:K+M`, B under `copies:N`);
//! - READ: the pieces [`pieces_to_read`] picks (the data pieces while their servers live, all
//!   asked at once so a unit gets K servers' bandwidth); missing data pieces are decoded;
//! - WRITE: the pieces cut from the unit, parity computed, each sent to its server;
//! - DISCARD, FREE: to every server holding a piece; STATS: to the first live server.
//!
//! # Order
//! Every physical request is sent in the order of the runtime's requests (*flights*), and the
//! runtime takes replies in that order too; so the next reply owed on a server's connection is
//! always for the oldest flight with a piece there, and a flight's replies are taken when the
//! runtime asks for its reply.
//!
//! # A lost server
//! A connection that fails (reset, closed, timed out) or a reply that does not match its
//! request loses that server: it is never talked to again. Then ([`Redundant::recover`]): every
//! block must still have the pieces a read needs, else the program stops with a message (a
//! second failure before the rebuild; never wrong data); replies owed by the live servers
//! are taken (the oldest flight's kept, the others' READ payloads thrown away) and the READs
//! still owed are sent again to live pieces, in flight order, so the order above holds again.
//! WRITEs need nothing more: their pieces on live servers were sent, and the lost pieces are
//! rebuilt. The lost server's pieces are rebuilt onto live servers holding no piece of the
//! same block, one block at a time whenever nothing is in flight (a READ of the block's other
//! pieces, a decode, a WRITE to a region made for rebuilt pieces): the program keeps running
//! meanwhile. With n = K+M servers there is nowhere to rebuild: the run goes on with one
//! loss fewer to spare, and says so.
//!
//! Nothing here allocates once the run is set up, also when a server is lost (the fault path
//! may run in a signal handler): flights, staging buffers and the rebuild queue are sized at
//! start and at ALLOC.

use std::collections::VecDeque;
use std::io;

use crate::proto::{Header, Opcode, Status, REPLY_BIT, VERSION};
use crate::redundancy::{join_pieces, pieces_to_read, split_pieces, Codec, Home};
use crate::redundancy::{Redundancy, MAX_PIECES};
use crate::transport::Transport;

mod rebuild;
mod sync;

/// Flights in the air at most: the runtime's own bound on what a connection may owe, and room
/// for the requests one call adds.
const MAX_FLIGHTS: usize = super::MAX_PENDING + 64;

/// Longest error message a piece's reply may carry (as the runtime's own bound).
const MAX_MESSAGE: usize = 4096;

/// Longest STATS reply (as the runtime's own bound).
const MAX_STATS: usize = 64 << 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
enum SubState {
    /// Sent; its reply is owed on its server's connection.
    #[default]
    Owed,
    /// Reply taken (a READ's payload is in its staging slot: the oldest flight only).
    Done,
    /// Its server is lost.
    Lost,
    /// Reply taken and thrown away while recovering: a READ to send again.
    Dropped,
}

/// One physical request of a flight: a piece on a server.
#[derive(Clone, Copy, Default)]
struct Sub {
    server: u16,
    piece: u8,
    state: SubState,
    sent: Header,
}

/// One request of the runtime and the physical requests it became.
#[derive(Clone, Copy)]
struct Flight {
    logical: Header,
    /// READ, WRITE, DISCARD; or the reply of a synchronous request, made already.
    done: Option<Done>,
    subs: [Sub; MAX_PIECES],
    n: usize,
}

/// The reply of a synchronous request (ALLOC, FREE, STATS), made when it was sent.
#[derive(Clone, Copy)]
struct Done {
    reply: Header,
    /// Where its payload is: the message buffer (errors) or the staging buffer (STATS).
    in_staging: bool,
}

struct Server {
    t: Box<dyn Transport>,
    addr: String,
    live: bool,
    next_id: u32,
    /// READ requests of a batch (`send_headers`), sent together.
    corked: Vec<Header>,
}

/// A region of the runtime: where each piece of each block lives.
struct Region {
    blocks: usize,
    /// Block-major, `pieces` a block.
    homes: Vec<Home>,
    /// Every region on a server holding pieces of it (server, id), for FREE.
    parts: Vec<(u16, u32)>,
    /// Per server, the region rebuilt pieces go to: (id, blocks, used).
    spare: Vec<Option<(u32, u32, u32)>>,
}

/// A piece to rebuild: (region index, block, piece, target server).
type Step = (usize, usize, usize, usize);

/// What the runtime takes next with `recv_payload`.
#[derive(Clone, Copy)]
enum Payload {
    None,
    /// A READ's pieces in the staging slots: `present` bit i: piece i is there.
    Read {
        count: usize,
        present: u32,
    },
    /// `len` bytes of the message buffer (or the staging buffer), `off` taken so far.
    Bytes {
        len: usize,
        off: usize,
        in_staging: bool,
    },
}

/// The servers of a run with redundancy, as one transport (module doc).
pub(crate) struct Redundant {
    scheme: Redundancy,
    codec: Option<Codec>,
    base: usize,
    max_set: usize,
    /// Bytes of a page's piece (B/K, or B).
    granule: usize,
    servers: Vec<Server>,
    regions: Vec<Option<Region>>,
    flights: VecDeque<Flight>,
    /// Received pieces (a READ's, a rebuild's), one slot per piece index.
    staging: Vec<u8>,
    /// A WRITE's pieces (erasure coding).
    outgoing: Vec<u8>,
    msg: [u8; MAX_MESSAGE],
    payload: Payload,
    rebuild: VecDeque<Step>,
    /// Per server: pieces planned onto it (`rebuild_target`'s load).
    load: Vec<usize>,
    /// A server was lost while a request's pieces were being sent: recover once all are.
    must_recover: bool,
    name: String,
}

/// Why a server was lost (printed once).
struct Loss {
    server: usize,
    why: &'static str,
    err: Option<io::Error>,
}

impl Redundant {
    /// The servers `servers` (connected: transport and address each) storing units by
    /// `scheme`, for base pages of `base` bytes and blocks of `max_set` pages.
    pub(crate) fn new(
        scheme: Redundancy,
        base: usize,
        max_set: usize,
        servers: Vec<(Box<dyn Transport>, String)>,
    ) -> Result<Self, String> {
        scheme.check(base, servers.len())?;
        let codec = match scheme {
            Redundancy::Erasure { data, parity } => Some(Codec::new(data, parity)?),
            _ => None,
        };
        let granule = scheme.piece_bytes(base);
        let slots = scheme.pieces() * max_set * granule;
        let name = format!("{scheme} over {}", servers.iter().map(|(_, a)| a.as_str()).collect::<Vec<_>>().join(", "));
        let n = servers.len();
        Ok(Redundant {
            scheme,
            codec,
            base,
            max_set,
            granule,
            servers: servers
                .into_iter()
                .map(|(t, addr)| Server { t, addr, live: true, next_id: 1, corked: Vec::with_capacity(MAX_FLIGHTS) })
                .collect(),
            regions: Vec::new(),
            flights: VecDeque::with_capacity(MAX_FLIGHTS),
            staging: vec![0u8; slots.max(MAX_STATS)],
            outgoing: vec![0u8; if scheme.needed() > 1 { slots } else { 0 }],
            msg: [0u8; MAX_MESSAGE],
            payload: Payload::None,
            rebuild: VecDeque::new(),
            load: vec![0; n],
            must_recover: false,
            name,
        })
    }

    fn live(&self, s: usize) -> bool {
        self.servers[s].live
    }

    fn home_live(&self, h: &Home) -> bool {
        h.region != 0 && self.servers[h.server as usize].live
    }

    /// The region, block and page offset a request names.
    fn locate(&self, h: &Header) -> Option<(usize, usize, usize)> {
        let ri = (h.region as usize).checked_sub(1)?;
        let r = self.regions.get(ri)?.as_ref()?;
        let block = h.page as usize / self.max_set;
        let off = h.page as usize % self.max_set;
        (block < r.blocks && off + h.set_count as usize <= self.max_set && h.set_count > 0).then_some((ri, block, off))
    }

    fn homes(&self, ri: usize, block: usize) -> &[Home] {
        let p = self.scheme.pieces();
        &self.regions[ri].as_ref().expect("live region").homes[block * p..(block + 1) * p]
    }

    /// Send `h` (numbered here) to server `s` now; false when that loses the server.
    fn send_sub(&mut self, s: usize, mut h: Header, payload: &[u8]) -> Result<Header, Loss> {
        let srv = &mut self.servers[s];
        h.request_id = srv.next_id;
        srv.next_id = srv.next_id.wrapping_add(1);
        h.length = payload.len() as u32;
        srv.t.send(&h, payload).map_err(|e| Loss { server: s, why: "sending failed", err: Some(e) })?;
        Ok(h)
    }

    /// Number `h` for server `s` and queue it for the batch's send (`flush_corked`).
    fn cork_sub(&mut self, s: usize, mut h: Header) -> Header {
        let srv = &mut self.servers[s];
        h.request_id = srv.next_id;
        srv.next_id = srv.next_id.wrapping_add(1);
        h.length = 0;
        srv.corked.push(h);
        h
    }

    fn flush_corked(&mut self) {
        for s in 0..self.servers.len() {
            let srv = &mut self.servers[s];
            if srv.corked.is_empty() {
                continue;
            }
            // A lost server's requests are never sent: `recover` finds them owed by it.
            let r = if srv.live { srv.t.send_headers(&srv.corked) } else { Ok(()) };
            srv.corked.clear();
            if let Err(e) = r {
                self.lost_while_sending(Loss { server: s, why: "sending failed", err: Some(e) });
            }
        }
    }

    /// A server lost while a request's pieces are sent: the others are sent, then `recover`.
    fn lost_while_sending(&mut self, l: Loss) {
        self.mark_lost(l);
        self.must_recover = true;
    }

    /// Receive the reply to sub `i` of flight `fi`: kept (into its staging slot) for the
    /// oldest flight, thrown away for the others (`keep`).
    fn recv_sub(&mut self, fi: usize, i: usize, keep: bool) -> Result<(), Loss> {
        let sub = self.flights[fi].subs[i];
        let s = sub.server as usize;
        let op = Opcode::from_u8(sub.sent.opcode).expect("our own request");
        let count = sub.sent.set_count as usize;
        let expect = if op == Opcode::Read { count * self.granule } else { 0 };
        let lost = |why: &'static str, err: Option<io::Error>| Loss { server: s, why, err };
        let rep = self.servers[s].t.recv_header().map_err(|e| lost("connection lost", Some(e)))?;
        if let Some(why) = mismatch(&sub.sent, &rep, op, expect) {
            return Err(lost(why, None));
        }
        if op == Opcode::Read {
            let stride = count * self.granule;
            let p = sub.piece as usize;
            let t = &mut self.servers[s].t;
            let r =
                if keep { t.recv_payload(&mut self.staging[p * stride..(p + 1) * stride]) } else { t.discard(expect) };
            r.map_err(|e| lost("connection lost", Some(e)))?;
        }
        let sub = &mut self.flights[fi].subs[i];
        sub.state = if op == Opcode::Read && !keep { SubState::Dropped } else { SubState::Done };
        Ok(())
    }

    /// Take the replies of the oldest flight, recovering from any server lost meanwhile.
    fn complete_front(&mut self) {
        'again: loop {
            let Some(f) = self.flights.front() else { return };
            for i in 0..f.n {
                if self.flights[0].subs[i].state == SubState::Owed {
                    if let Err(l) = self.recv_sub(0, i, true) {
                        self.lose(l);
                        continue 'again;
                    }
                }
            }
            return;
        }
    }

    /// Server `l.server` is lost: say so, and recover (module doc).
    fn lose(&mut self, l: Loss) {
        self.mark_lost(l);
        self.recover();
    }

    fn mark_lost(&mut self, l: Loss) {
        if !self.servers[l.server].live {
            return;
        }
        self.servers[l.server].live = false;
        let s = &self.servers[l.server];
        match &l.err {
            Some(e) => crate::note(format_args!(
                "pagewise dlm: memory server {} ({}) lost: {}: {e}; its pieces are read from the others ({})",
                l.server, s.addr, l.why, self.scheme
            )),
            None => crate::note(format_args!(
                "pagewise dlm: memory server {} ({}) lost: {}; its pieces are read from the others ({})",
                l.server, s.addr, l.why, self.scheme
            )),
        }
    }

    /// After a loss: check that every block can still be read, take the replies the live
    /// servers owe, send again the READs that lost pieces, and plan the rebuild.
    fn recover(&mut self) {
        'again: loop {
            for fi in 0..self.flights.len() {
                for i in 0..self.flights[fi].n {
                    let sub = self.flights[fi].subs[i];
                    if sub.state == SubState::Owed && !self.live(sub.server as usize) {
                        self.flights[fi].subs[i].state = SubState::Lost;
                    }
                }
            }
            self.check_survivable();
            for fi in 0..self.flights.len() {
                for i in 0..self.flights[fi].n {
                    if self.flights[fi].subs[i].state == SubState::Owed {
                        if let Err(l) = self.recv_sub(fi, i, fi == 0) {
                            self.mark_lost(l);
                            continue 'again;
                        }
                    }
                }
            }
            for fi in 0..self.flights.len() {
                if self.flights[fi].logical.opcode != Opcode::Read as u8 || self.flights[fi].done.is_some() {
                    continue;
                }
                if let Err(l) = self.reissue(fi) {
                    self.mark_lost(l);
                    continue 'again;
                }
            }
            break;
        }
        self.plan_rebuild();
    }

    /// Send READ flight `fi` the pieces it lacks: those kept stay (the oldest flight's).
    fn reissue(&mut self, fi: usize) -> Result<(), Loss> {
        let f = self.flights[fi];
        let (ri, block, off) = self.locate(&f.logical).expect("a flight's region lives until its reply");
        let mut subs = [Sub::default(); MAX_PIECES];
        let mut n = 0;
        let mut present = 0u32;
        for sub in f.subs[..f.n].iter().filter(|s| s.state == SubState::Done) {
            subs[n] = *sub;
            present |= 1 << sub.piece;
            n += 1;
        }
        let (p, needed) = (self.scheme.pieces(), self.scheme.needed());
        let mut homes = [Home { server: 0, region: 0, index: 0 }; MAX_PIECES];
        homes[..p].copy_from_slice(self.homes(ri, block));
        let first_new = n;
        for (i, h) in homes[..p].iter().enumerate() {
            if n < needed && present & (1 << i) == 0 && self.home_live(h) {
                let mut rh = Header::request(Opcode::Read, 0);
                rh.region = h.region;
                rh.page = (h.index as usize * self.max_set + off) as u64;
                rh.set_count = f.logical.set_count;
                subs[n] = Sub { server: h.server, piece: i as u8, state: SubState::Owed, sent: rh };
                n += 1;
            }
        }
        if n < needed {
            self.unrecoverable(ri, block, n);
        }
        // Stored before they are sent: a send that fails leaves its sub owed by a lost server.
        self.flights[fi].subs = subs;
        self.flights[fi].n = n;
        for i in first_new..n {
            let sub = self.flights[fi].subs[i];
            let sent = self.send_sub(sub.server as usize, sub.sent, &[])?;
            self.flights[fi].subs[i].sent = sent;
        }
        Ok(())
    }

    /// Stop the program if some block has fewer live pieces than a read needs.
    fn check_survivable(&self) {
        let (p, needed) = (self.scheme.pieces(), self.scheme.needed());
        for (ri, r) in self.regions.iter().enumerate() {
            let Some(r) = r else { continue };
            for b in 0..r.blocks {
                let live = r.homes[b * p..(b + 1) * p].iter().filter(|h| self.home_live(h)).count();
                if live < needed {
                    self.unrecoverable(ri, b, live);
                }
            }
        }
    }

    fn unrecoverable(&self, ri: usize, block: usize, left: usize) -> ! {
        let mut lost = [0usize; 8];
        let mut nl = 0;
        for (s, srv) in self.servers.iter().enumerate() {
            if !srv.live && nl < lost.len() {
                lost[nl] = s;
                nl += 1;
            }
        }
        let addr = |i: usize| if i < nl { self.servers[lost[i]].addr.as_str() } else { "" };
        crate::fatal(format_args!(
            "pagewise dlm: {nl} memory servers lost ({} {} {}…) before the pieces of the first were rebuilt: \
             {} survives {} lost server(s) at a time, and block {block} of area region {} has {left} of the {} \
             pieces a read needs. Stopping the program rather than returning wrong data",
            addr(0),
            addr(1),
            addr(2),
            self.scheme,
            self.scheme.tolerated(),
            ri + 1,
            self.scheme.needed()
        ))
    }

    /// Make flight `f` for READ / DISCARD `h` of a located unit, its subs numbered and corked
    /// (READ, to leave with the batch) or sent (DISCARD).
    fn read_or_discard(&mut self, h: &Header) {
        let op = Opcode::from_u8(h.opcode).expect("checked by the caller");
        let Some((ri, block, off)) = self.locate(h) else {
            self.bad_request(h);
            return;
        };
        let mut f = Flight { logical: *h, done: None, subs: [Sub::default(); MAX_PIECES], n: 0 };
        let p = self.scheme.pieces();
        let mut homes = [Home { server: 0, region: 0, index: 0 }; MAX_PIECES];
        homes[..p].copy_from_slice(self.homes(ri, block));
        let mut order = [0u8; MAX_PIECES];
        let k = if op == Opcode::Read {
            let servers = &self.servers;
            match pieces_to_read(&homes[..p], self.scheme.needed(), |s| !servers[s].live, &mut order) {
                Some(k) => k,
                None => self.unrecoverable(ri, block, 0),
            }
        } else {
            for (i, o) in order[..p].iter_mut().enumerate() {
                *o = i as u8;
            }
            p
        };
        for &i in &order[..k] {
            let hm = homes[i as usize];
            if !self.home_live(&hm) {
                continue;
            }
            let mut sh = Header::request(op, 0);
            sh.region = hm.region;
            sh.page = (hm.index as usize * self.max_set + off) as u64;
            sh.set_count = h.set_count;
            let s = hm.server as usize;
            let sent = if op == Opcode::Read {
                self.cork_sub(s, sh)
            } else {
                match self.send_sub(s, sh, &[]) {
                    Ok(x) => x,
                    Err(l) => {
                        self.lost_while_sending(l);
                        sh
                    }
                }
            };
            f.subs[f.n] = Sub { server: hm.server, piece: i, state: SubState::Owed, sent };
            f.n += 1;
        }
        self.flights.push_back(f);
    }

    fn write(&mut self, h: &Header, payload: &[u8]) {
        let Some((ri, block, off)) = self.locate(h) else {
            self.bad_request(h);
            return;
        };
        let count = h.set_count as usize;
        if payload.len() != count * self.base {
            self.bad_request(h);
            return;
        }
        let stride = count * self.granule;
        let mut outgoing = std::mem::take(&mut self.outgoing);
        if let Some(c) = &self.codec {
            split_pieces(payload, &mut outgoing, c.data(), self.granule, count);
            c.encode(&mut outgoing, stride);
        }
        let mut f = Flight { logical: *h, done: None, subs: [Sub::default(); MAX_PIECES], n: 0 };
        let p = self.scheme.pieces();
        let mut homes = [Home { server: 0, region: 0, index: 0 }; MAX_PIECES];
        homes[..p].copy_from_slice(self.homes(ri, block));
        for (i, hm) in homes[..p].iter().enumerate() {
            if !self.home_live(hm) {
                continue;
            }
            let mut sh = Header::request(Opcode::Write, 0);
            sh.region = hm.region;
            sh.page = (hm.index as usize * self.max_set + off) as u64;
            sh.set_count = h.set_count;
            let data = if self.codec.is_some() { &outgoing[i * stride..(i + 1) * stride] } else { payload };
            let s = hm.server as usize;
            let sent = match self.send_sub(s, sh, data) {
                Ok(x) => x,
                Err(l) => {
                    self.lost_while_sending(l);
                    sh
                }
            };
            f.subs[f.n] = Sub { server: hm.server, piece: i as u8, state: SubState::Owed, sent };
            f.n += 1;
        }
        self.outgoing = outgoing;
        self.flights.push_back(f);
    }

    /// A READ, WRITE or DISCARD naming no unit of a region: the runtime's own bug, answered
    /// as a server would (BAD_REGION / OUT_OF_RANGE), which stops the program.
    fn bad_request(&mut self, h: &Header) {
        let (status, n, _, _) = self.refuse(
            Status::OutOfRange,
            format_args!("pages {}+{} of region {} are no unit of a region", h.page, h.set_count, h.region),
        );
        let reply = Header::reply_to(h, status, n as u32);
        let f = Flight {
            logical: *h,
            done: Some(Done { reply, in_staging: false }),
            subs: [Sub::default(); MAX_PIECES],
            n: 0,
        };
        self.flights.push_back(f);
    }

    /// Before a new request: rebuild a piece if nothing is in the air, and make room.
    fn before_request(&mut self) -> io::Result<()> {
        if self.flights.is_empty() && !self.rebuild.is_empty() {
            self.rebuild_step();
        }
        if self.flights.len() >= MAX_FLIGHTS {
            return Err(io::ErrorKind::OutOfMemory.into());
        }
        Ok(())
    }

    /// Recover from the servers lost while the last request's pieces were sent.
    fn after_sending(&mut self) {
        if std::mem::take(&mut self.must_recover) {
            self.recover();
        }
    }
}

/// Why `rep` cannot be the reply to physical request `sent` (`op`, a payload of `expect` bytes
/// when OK), if it cannot.
fn mismatch(sent: &Header, rep: &Header, op: Opcode, expect: usize) -> Option<&'static str> {
    if rep.magic != crate::proto::MAGIC {
        Some("reply with a bad magic")
    } else if rep.version != VERSION {
        Some("reply of another protocol version")
    } else if rep.opcode != op as u8 | REPLY_BIT {
        Some("reply to another operation")
    } else if rep.request_id != sent.request_id {
        Some("reply to another request id")
    } else if rep.region != sent.region {
        Some("reply for another region")
    } else if rep.page != sent.page || rep.set_count != sent.set_count {
        Some("reply for other pages")
    } else if rep.status == Status::Ok as u16 && rep.length as usize != expect {
        Some("reply of the wrong length")
    } else if rep.status != Status::Ok as u16 && rep.length as usize > MAX_MESSAGE {
        Some("error reply with a message longer than 4 KiB")
    } else if rep.status != Status::Ok as u16 && op != Opcode::Alloc && op != Opcode::Free && op != Opcode::Stats {
        // READ, WRITE and DISCARD of pieces never fail on a sound server.
        Some("error reply to a piece's request")
    } else {
        None
    }
}

impl Transport for Redundant {
    fn send(&mut self, header: &Header, payload: &[u8]) -> io::Result<()> {
        self.before_request()?;
        match Opcode::from_u8(header.opcode) {
            Some(Opcode::Read) | Some(Opcode::Discard) => {
                self.read_or_discard(header);
                self.flush_corked();
            }
            Some(Opcode::Write) => self.write(header, payload),
            _ => {
                debug_assert!(self.flights.is_empty(), "synchronous requests come with nothing owed");
                self.sync(header, payload);
            }
        }
        self.after_sending();
        Ok(())
    }

    fn send_headers(&mut self, headers: &[Header]) -> io::Result<()> {
        self.before_request()?;
        for h in headers {
            if self.flights.len() >= MAX_FLIGHTS {
                return Err(io::ErrorKind::OutOfMemory.into());
            }
            if h.opcode == Opcode::Read as u8 || h.opcode == Opcode::Discard as u8 {
                self.read_or_discard(h);
            } else {
                self.bad_request(h);
            }
        }
        self.flush_corked();
        self.after_sending();
        Ok(())
    }

    fn recv_header(&mut self) -> io::Result<Header> {
        self.complete_front();
        let f = self.flights.pop_front().ok_or(io::ErrorKind::InvalidInput)?;
        if let Some(d) = f.done {
            self.payload = Payload::Bytes {
                len: d.reply.length as usize,
                off: 0,
                in_staging: d.in_staging && d.reply.status == 0,
            };
            return Ok(d.reply);
        }
        let op = Opcode::from_u8(f.logical.opcode).expect("our flights are READ, WRITE, DISCARD");
        if op != Opcode::Read {
            self.payload = Payload::None;
            return Ok(Header::reply_to(&f.logical, Status::Ok, 0));
        }
        let mut present = 0u32;
        for sub in &f.subs[..f.n] {
            if sub.state == SubState::Done {
                present |= 1 << sub.piece;
            }
        }
        let count = f.logical.set_count as usize;
        self.payload = Payload::Read { count, present };
        Ok(Header::reply_to(&f.logical, Status::Ok, (count * self.base) as u32))
    }

    fn recv_payload(&mut self, buf: &mut [u8]) -> io::Result<()> {
        match self.payload {
            Payload::None => Err(io::ErrorKind::InvalidInput.into()),
            Payload::Read { count, present } => {
                // Taken whole, in one call: the runtime always does.
                if buf.len() != count * self.base {
                    return Err(io::ErrorKind::InvalidInput.into());
                }
                self.payload = Payload::None;
                let stride = count * self.granule;
                match &self.codec {
                    Some(c) => {
                        let data_mask = (1u32 << c.data()) - 1;
                        if present & data_mask != data_mask {
                            if let Err(e) = c.reconstruct(&mut self.staging, stride, present, false) {
                                crate::fatal(format_args!("pagewise dlm: decoding a unit: {e}"));
                            }
                        }
                        join_pieces(&self.staging, buf, c.data(), self.granule, count);
                    }
                    None => {
                        let from = present.trailing_zeros() as usize;
                        buf.copy_from_slice(&self.staging[from * stride..(from + 1) * stride]);
                    }
                }
                Ok(())
            }
            Payload::Bytes { len, off, in_staging } => {
                if off + buf.len() > len {
                    return Err(io::ErrorKind::InvalidInput.into());
                }
                let src =
                    if in_staging { &self.staging[off..off + buf.len()] } else { &self.msg[off..off + buf.len()] };
                buf.copy_from_slice(src);
                self.payload = Payload::Bytes { len, off: off + buf.len(), in_staging };
                Ok(())
            }
        }
    }

    fn discard(&mut self, len: usize) -> io::Result<()> {
        match self.payload {
            Payload::Bytes { len: total, off, in_staging } if off + len <= total => {
                self.payload = Payload::Bytes { len: total, off: off + len, in_staging };
                Ok(())
            }
            Payload::Read { count, .. } if len == count * self.base => {
                self.payload = Payload::None;
                Ok(())
            }
            _ => Err(io::ErrorKind::InvalidInput.into()),
        }
    }

    fn peer(&self) -> String {
        self.name.clone()
    }
}
