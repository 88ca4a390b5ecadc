//! Rebuilding a lost server's pieces (module doc of `redundant.rs`, "A lost server"): the plan
//! (where each lost piece goes, `rebuild_target`) and one step of it — a READ of the block's
//! other pieces, a decode, a WRITE to a region on the target made for rebuilt pieces.

use super::{Loss, Redundant};
use crate::proto::{Header, Opcode, Status};
use crate::redundancy::{pieces_to_read, rebuild_target, Home, MAX_PIECES};

impl Redundant {
    /// Plan where the lost pieces go (`rebuild_target`), replacing the plan so far.
    pub(super) fn plan_rebuild(&mut self) {
        self.rebuild.clear();
        self.load.iter_mut().for_each(|l| *l = 0);
        let p = self.scheme.pieces();
        let mut nowhere = 0usize;
        for ri in 0..self.regions.len() {
            let Some(r) = &self.regions[ri] else { continue };
            for b in 0..r.blocks {
                let homes = &r.homes[b * p..(b + 1) * p];
                for (i, h) in homes.iter().enumerate() {
                    if self.home_live(h) {
                        continue;
                    }
                    let servers = &self.servers;
                    match rebuild_target(homes, |s| servers[s].live, &self.load) {
                        Some(t) if self.rebuild.len() < self.rebuild.capacity() => {
                            self.load[t] += 1;
                            self.rebuild.push_back((ri, b, i, t));
                        }
                        _ => nowhere += 1,
                    }
                }
            }
        }
        if nowhere > 0 {
            crate::note(format_args!(
                "pagewise dlm: {nowhere} lost pieces cannot be rebuilt: every live server already holds a piece of \
                 their blocks (give more servers than {} pieces); the run goes on with one lost server less to spare",
                p
            ));
        }
    }

    /// Rebuild one lost piece (module doc). Only while no flight is in the air.
    pub(super) fn rebuild_step(&mut self) {
        debug_assert!(self.flights.is_empty());
        let Some(&(ri, block, piece, target)) = self.rebuild.front() else { return };
        let still = self.regions.get(ri).and_then(|r| r.as_ref()).is_some_and(|r| block < r.blocks)
            && !self.home_live(&self.homes(ri, block)[piece])
            && self.live(target)
            && !self.homes(ri, block).iter().any(|h| h.server as usize == target);
        if !still {
            self.rebuild.pop_front();
            return;
        }
        if let Err(l) = self.rebuild_piece(ri, block, piece, target) {
            self.lose(l);
            return;
        }
        self.rebuild.pop_front();
        if self.rebuild.is_empty() {
            crate::note(format_args!("pagewise dlm: lost pieces rebuilt ({})", self.scheme));
        }
    }

    pub(super) fn rebuild_piece(&mut self, ri: usize, block: usize, piece: usize, target: usize) -> Result<(), Loss> {
        let (ms, g) = (self.max_set, self.granule);
        let stride = ms * g;
        // The region on the target that rebuilt pieces of this region go to: made for all the
        // pieces planned there, and made again if a later plan sends more.
        let (id, blocks, index) = match self.regions[ri].as_ref().expect("checked").spare[target] {
            Some((id, blocks, used)) if used < blocks => (id, blocks, used),
            _ => {
                let blocks = self.rebuild.iter().filter(|s| s.0 == ri && s.3 == target).count() as u32;
                let mut h = Header::request(Opcode::Alloc, 0);
                h.page = (blocks as usize * ms) as u64;
                let rep = self.call(target, h, &(g as u32).to_le_bytes())?;
                if rep.status != Status::Ok as u16 {
                    return Err(Loss { server: target, why: "refused a region for rebuilt pieces", err: None });
                }
                let r = self.regions[ri].as_mut().expect("checked");
                if r.parts.len() < r.parts.capacity() {
                    r.parts.push((target as u16, rep.region));
                }
                r.spare[target] = Some((rep.region, blocks, 0));
                (rep.region, blocks, 0)
            }
        };
        let p = self.scheme.pieces();
        let mut homes = [Home { server: 0, region: 0, index: 0 }; MAX_PIECES];
        homes[..p].copy_from_slice(self.homes(ri, block));
        let mut order = [0u8; MAX_PIECES];
        let servers = &self.servers;
        let Some(k) = pieces_to_read(&homes[..p], self.scheme.needed(), |s| !servers[s].live, &mut order) else {
            self.unrecoverable(ri, block, 0)
        };
        let mut present = 0u32;
        for &i in &order[..k] {
            let h = homes[i as usize];
            let mut rh = Header::request(Opcode::Read, 0);
            rh.region = h.region;
            rh.page = (h.index as usize * ms) as u64;
            rh.set_count = ms as u32;
            let s = h.server as usize;
            let rep = self.call(s, rh, &[])?;
            if rep.status != Status::Ok as u16 {
                return Err(Loss { server: s, why: "refused a READ", err: None });
            }
            let slot = &mut self.staging[i as usize * stride..(i as usize + 1) * stride];
            self.servers[s].t.recv_payload(slot).map_err(|e| Loss {
                server: s,
                why: "connection lost",
                err: Some(e),
            })?;
            present |= 1 << i;
        }
        match &self.codec {
            Some(c) => {
                if let Err(e) = c.reconstruct(&mut self.staging, stride, present, true) {
                    crate::fatal(format_args!("pagewise dlm: rebuilding a piece: {e}"));
                }
            }
            None => {
                let from = order[0] as usize;
                self.staging.copy_within(from * stride..(from + 1) * stride, piece * stride);
            }
        }
        let mut wh = Header::request(Opcode::Write, 0);
        wh.region = id;
        wh.page = (index as usize * ms) as u64;
        wh.set_count = ms as u32;
        let data = std::mem::take(&mut self.staging);
        let r = self.call(target, wh, &data[piece * stride..(piece + 1) * stride]);
        self.staging = data;
        if r?.status != Status::Ok as u16 {
            return Err(Loss { server: target, why: "refused a rebuilt piece", err: None });
        }
        let r = self.regions[ri].as_mut().expect("checked");
        r.homes[block * p + piece] = Home { server: target as u16, region: id, index };
        r.spare[target] = Some((id, blocks, index + 1));
        Ok(())
    }
}
