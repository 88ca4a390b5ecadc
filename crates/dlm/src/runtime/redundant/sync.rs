//! The runtime's synchronous requests over redundancy (ALLOC, FREE, STATS): done when sent,
//! with nothing in flight, and their replies kept for `recv_header`.

use std::io;

use super::{mismatch, Done, Flight, Loss, Redundant, Region, Sub, MAX_STATS};
use crate::proto::{Header, Opcode, Status};
use crate::redundancy::{Placement, MAX_PIECES};

impl Redundant {
    /// A synchronous request to server `s` (nothing is owed on its connection): the checked
    /// reply header; an error reply's message is read into `msg` (its length in `length`).
    pub(super) fn call(&mut self, s: usize, h: Header, payload: &[u8]) -> Result<Header, Loss> {
        let sent = self.send_sub(s, h, payload)?;
        let lost = |why: &'static str, err: Option<io::Error>| Loss { server: s, why, err };
        let rep = self.servers[s].t.recv_header().map_err(|e| lost("connection lost", Some(e)))?;
        let op = Opcode::from_u8(h.opcode).expect("our own request");
        let expect = match op {
            Opcode::Read => sent.set_count as usize * self.granule,
            Opcode::Stats => rep.length as usize,
            _ => 0,
        };
        let sent_for_check = if op == Opcode::Alloc { Header { region: rep.region, ..sent } } else { sent };
        if let Some(why) = mismatch(&sent_for_check, &rep, op, expect) {
            return Err(lost(why, None));
        }
        if op == Opcode::Stats && rep.status == Status::Ok as u16 && rep.length as usize > MAX_STATS {
            return Err(lost("STATS reply longer than 64 KiB", None));
        }
        if rep.status != Status::Ok as u16 {
            let n = rep.length as usize;
            self.servers[s].t.recv_payload(&mut self.msg[..n]).map_err(|e| lost("connection lost", Some(e)))?;
        }
        Ok(rep)
    }

    /// A synchronous request of the runtime (ALLOC, FREE, STATS): done now, its reply kept
    /// for `recv_header`.
    pub(super) fn sync(&mut self, h: &Header, payload: &[u8]) {
        let op = Opcode::from_u8(h.opcode);
        let (status, length, in_staging, region) = match op {
            Some(Opcode::Alloc) => self.alloc(h, payload),
            Some(Opcode::Free) => self.free(h),
            Some(Opcode::Stats) => self.stats(),
            _ => self.refuse(Status::BadOpcode, format_args!("opcode {} is not served over redundancy", h.opcode)),
        };
        let mut reply = Header::reply_to(h, status, length as u32);
        if let Some(r) = region {
            reply.region = r;
        }
        let f =
            Flight { logical: *h, done: Some(Done { reply, in_staging }), subs: [Sub::default(); MAX_PIECES], n: 0 };
        self.flights.push_back(f);
    }

    pub(super) fn refuse(
        &mut self,
        status: Status,
        what: std::fmt::Arguments<'_>,
    ) -> (Status, usize, bool, Option<u32>) {
        struct W<'a>(&'a mut [u8], usize);
        impl std::fmt::Write for W<'_> {
            fn write_str(&mut self, s: &str) -> std::fmt::Result {
                let k = s.len().min(self.0.len() - self.1);
                self.0[self.1..self.1 + k].copy_from_slice(&s.as_bytes()[..k]);
                self.1 += k;
                Ok(())
            }
        }
        let mut w = W(&mut self.msg, 0);
        let _ = std::fmt::write(&mut w, what);
        let n = w.1;
        (status, n, false, None)
    }

    pub(super) fn alloc(&mut self, h: &Header, payload: &[u8]) -> (Status, usize, bool, Option<u32>) {
        if payload.len() != 4 || u32::from_le_bytes(payload.try_into().expect("4 bytes")) as usize != self.base {
            return self.refuse(Status::BadSize, format_args!("ALLOC over redundancy takes the run's base page"));
        }
        let blocks = (h.page as usize).div_ceil(self.max_set);
        let pieces = self.scheme.pieces();
        loop {
            let live: Vec<usize> = (0..self.servers.len()).filter(|&s| self.live(s)).collect();
            if live.len() < pieces {
                let scheme = self.scheme;
                return self.refuse(
                    Status::Server,
                    format_args!("{} live memory servers left, {scheme} needs {pieces}", live.len()),
                );
            }
            let placement = Placement::new(blocks, pieces, &live, self.servers.len());
            let mut homes = placement.homes;
            let mut parts = Vec::with_capacity(2 * self.servers.len());
            let mut failed = None;
            for &s in &live {
                let rb = placement.region_blocks[s];
                if rb == 0 {
                    continue;
                }
                let mut ah = Header::request(Opcode::Alloc, 0);
                ah.page = (rb * self.max_set) as u64;
                match self.call(s, ah, &(self.granule as u32).to_le_bytes()) {
                    Ok(rep) if rep.status == Status::Ok as u16 => {
                        parts.push((s as u16, rep.region));
                        homes.iter_mut().filter(|x| x.server as usize == s).for_each(|x| x.region = rep.region);
                    }
                    Ok(rep) => {
                        failed = Some(Ok((s, rep)));
                        break;
                    }
                    Err(l) => {
                        failed = Some(Err(l));
                        break;
                    }
                }
            }
            let Some(failed) = failed else {
                let region = Region { blocks, homes, parts, spare: vec![None; self.servers.len()] };
                // Room for planning a rebuild of every piece, so that a loss allocates nothing.
                let total: usize =
                    self.regions.iter().flatten().map(|r| r.homes.len()).sum::<usize>() + region.homes.len();
                self.rebuild.reserve(total.saturating_sub(self.rebuild.len()));
                let id = match self.regions.iter().position(|r| r.is_none()) {
                    Some(i) => {
                        self.regions[i] = Some(region);
                        i + 1
                    }
                    None => {
                        self.regions.push(Some(region));
                        self.regions.len()
                    }
                };
                return (Status::Ok, 0, false, Some(id as u32));
            };
            // Give back what was made before the failure.
            for (s, id) in parts {
                let mut fh = Header::request(Opcode::Free, 0);
                fh.region = id;
                if let Err(l) = self.call(s as usize, fh, &[]) {
                    self.lose(l);
                }
            }
            match failed {
                Ok((s, rep)) => {
                    let n = rep.length as usize;
                    let status = Status::from_u16(rep.status).unwrap_or(Status::Server);
                    let text = String::from_utf8_lossy(&self.msg[..n]).into_owned();
                    let addr = self.servers[s].addr.clone();
                    return self.refuse(status, format_args!("memory server {s} ({addr}): {text}"));
                }
                // A server lost while the area was made: made again over the others.
                Err(l) => self.lose(l),
            }
        }
    }

    pub(super) fn free(&mut self, h: &Header) -> (Status, usize, bool, Option<u32>) {
        let Some(r) = (h.region as usize).checked_sub(1).and_then(|i| self.regions.get_mut(i)).and_then(|r| r.take())
        else {
            return self.refuse(Status::BadRegion, format_args!("no region {}", h.region));
        };
        for &(s, id) in &r.parts {
            if !self.live(s as usize) {
                continue;
            }
            let mut fh = Header::request(Opcode::Free, 0);
            fh.region = id;
            match self.call(s as usize, fh, &[]) {
                Ok(rep) if rep.status == Status::Ok as u16 => {}
                Ok(_) => {
                    self.mark_lost(Loss { server: s as usize, why: "refused to free a region", err: None });
                    self.recover();
                }
                Err(l) => self.lose(l),
            }
        }
        (Status::Ok, 0, false, None)
    }

    pub(super) fn stats(&mut self) -> (Status, usize, bool, Option<u32>) {
        loop {
            let Some(s) = (0..self.servers.len()).find(|&s| self.live(s)) else {
                return self.refuse(Status::Server, format_args!("no memory server left"));
            };
            match self.call(s, Header::request(Opcode::Stats, 0), &[]) {
                Ok(rep) if rep.status == Status::Ok as u16 => {
                    let n = rep.length as usize;
                    let r = self.servers[s].t.recv_payload(&mut self.staging[..n]);
                    match r {
                        Ok(()) => return (Status::Ok, n, true, None),
                        Err(e) => self.lose(Loss { server: s, why: "connection lost", err: Some(e) }),
                    }
                }
                Ok(rep) => {
                    let status = Status::from_u16(rep.status).unwrap_or(Status::Server);
                    return (status, rep.length as usize, false, None);
                }
                Err(l) => self.lose(l),
            }
        }
    }
}
