//! The memcached commands on the cache: get/gets/gat/gats, the store verbs, delete, touch,
//! incr/decr and flush_all, with memcached's semantics (protocol.txt).

use pagewise_kernel::mem::HUGE_PMD;

use super::{push_num, ArithResult, Cache, StoreResult, HDR, HOT, ITEM_MAX};
use crate::proto::Store;

impl Cache {
    /// get/gets/gat/gats of one key: appends `VALUE key flags bytes [cas]\r\n data\r\n` to
    /// `out` on a hit. `touch` sets a new exptime.
    pub fn get(&mut self, key: &[u8], with_cas: bool, touch: Option<i64>, out: &mut Vec<u8>) -> bool {
        let now = self.now();
        self.counters.cmd_get += 1;
        if touch.is_some() {
            self.counters.cmd_touch += 1;
        }
        let it = self.find(key, now);
        if it == 0 {
            self.counters.get_misses += 1;
            if touch.is_some() {
                self.counters.touch_misses += 1;
            }
            return false;
        }
        if let Some(e) = touch {
            self.h(it).exptime = self.realtime(e, now);
            self.counters.touch_hits += 1;
        }
        self.counters.get_hits += 1;
        if self.h(it).iflags & HOT != 0 {
            self.counters.hot_hits += 1;
        } else if self.promoted[(it - self.cold.base) / HUGE_PMD] {
            self.counters.promoted_hits += 1;
        }
        self.bump(it);
        let h = self.h(it);
        let (flags, nbytes, cas) = (h.flags, h.nbytes, h.cas);
        out.extend_from_slice(b"VALUE ");
        out.extend_from_slice(key);
        out.push(b' ');
        push_num(out, flags as u64);
        out.push(b' ');
        push_num(out, nbytes as u64);
        if with_cas {
            out.push(b' ');
            push_num(out, cas);
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(self.data(it));
        out.extend_from_slice(b"\r\n");
        true
    }

    /// A storage command with its complete data block (without `\r\n`).
    pub fn store(&mut self, verb: Store, key: &[u8], flags: u32, exptime: i64, data: &[u8], cas: u64) -> StoreResult {
        let now = self.now();
        self.counters.cmd_set += 1;
        let old = self.find(key, now);
        if HDR + key.len() + data.len() > ITEM_MAX {
            // memcached drops the old value of a set that is too large so no stale data stays.
            if verb == Store::Set && old != 0 {
                self.unlink(old);
            }
            return StoreResult::TooLarge;
        }
        match verb {
            Store::Add if old != 0 => {
                self.bump(old);
                return StoreResult::NotStored;
            }
            Store::Replace | Store::Append | Store::Prepend if old == 0 => return StoreResult::NotStored,
            Store::Cas if old == 0 => {
                self.counters.cas_misses += 1;
                return StoreResult::NotFound;
            }
            Store::Cas if self.h(old).cas != cas => {
                self.counters.cas_badval += 1;
                return StoreResult::Exists;
            }
            _ => {}
        }
        if verb == Store::Cas {
            self.counters.cas_hits += 1;
        }
        let exptime = self.realtime(exptime, now);
        let new = match verb {
            Store::Append | Store::Prepend => {
                let (oflags, oexp, olen) = (self.h(old).flags, self.h(old).exptime, self.h(old).nbytes as usize);
                if HDR + key.len() + olen + data.len() > ITEM_MAX {
                    return StoreResult::TooLarge;
                }
                let new = match self.alloc_item(key, oflags, oexp, olen + data.len()) {
                    Ok(n) => n,
                    Err(e) => return e,
                };
                // The allocation may have evicted `old`.
                if self.find_raw(key) != old {
                    self.free_chunk(new);
                    return StoreResult::NotStored;
                }
                let (od, nd) = (self.data(old).as_ptr(), self.data_mut(new));
                // SAFETY: `od` is the old item's value of `olen` bytes, a different chunk.
                let od = unsafe { std::slice::from_raw_parts(od, olen) };
                if verb == Store::Append {
                    nd[..olen].copy_from_slice(od);
                    nd[olen..].copy_from_slice(data);
                } else {
                    nd[..data.len()].copy_from_slice(data);
                    nd[data.len()..].copy_from_slice(od);
                }
                new
            }
            _ => {
                let new = match self.alloc_item(key, flags, exptime, data.len()) {
                    Ok(n) => n,
                    Err(e) => return e,
                };
                self.data_mut(new).copy_from_slice(data);
                new
            }
        };
        let old = self.find_raw(key);
        if old != 0 {
            self.replace(old, new);
        } else {
            self.link(new);
        }
        StoreResult::Stored
    }

    pub fn delete(&mut self, key: &[u8]) -> bool {
        let it = self.find(key, self.now());
        if it == 0 {
            self.counters.delete_misses += 1;
            return false;
        }
        self.counters.delete_hits += 1;
        self.unlink(it);
        true
    }

    pub fn touch(&mut self, key: &[u8], exptime: i64) -> bool {
        let now = self.now();
        self.counters.cmd_touch += 1;
        let it = self.find(key, now);
        if it == 0 {
            self.counters.touch_misses += 1;
            return false;
        }
        self.counters.touch_hits += 1;
        self.h(it).exptime = self.realtime(exptime, now);
        self.bump(it);
        true
    }

    pub fn arith(&mut self, key: &[u8], incr: bool, delta: u64) -> ArithResult {
        let it = self.find(key, self.now());
        let (hits, misses) = if incr {
            (&mut self.counters.incr_hits, &mut self.counters.incr_misses)
        } else {
            (&mut self.counters.decr_hits, &mut self.counters.decr_misses)
        };
        if it == 0 {
            *misses += 1;
            return ArithResult::NotFound;
        }
        *hits += 1;
        let Some(v) = std::str::from_utf8(self.data(it)).ok().and_then(|s| s.trim_end_matches(' ').parse::<u64>().ok())
        else {
            return ArithResult::NonNumeric;
        };
        let v = if incr { v.wrapping_add(delta) } else { v.saturating_sub(delta) };
        let text = v.to_string();
        if text.len() == self.h(it).nbytes as usize {
            self.data_mut(it).copy_from_slice(text.as_bytes());
            self.cas += 1;
            self.h(it).cas = self.cas;
            self.bump(it);
            return ArithResult::Value(v);
        }
        let (flags, exp) = (self.h(it).flags, self.h(it).exptime);
        let new = match self.alloc_item(key, flags, exp, text.len()) {
            Ok(n) => n,
            Err(_) => return ArithResult::OutOfMemory,
        };
        self.data_mut(new).copy_from_slice(text.as_bytes());
        let old = self.find_raw(key);
        if old != 0 {
            self.replace(old, new);
        } else {
            self.link(new);
        }
        ArithResult::Value(v)
    }

    /// flush_all: now, or in `delay` seconds (a pending flush is replaced).
    pub fn flush_all(&mut self, delay: i64) {
        self.counters.cmd_flush += 1;
        let now = self.now();
        if delay <= 0 {
            self.flush_at = None;
            self.flush_now();
        } else {
            self.flush_at = Some(self.realtime(delay, now).max(now));
        }
    }
}
