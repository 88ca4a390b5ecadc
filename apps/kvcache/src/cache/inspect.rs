//! What the cache says about itself: `stats slabs`, `stats items`, and the self-check the
//! tests run.

use super::{Cache, HOT, LINKED, SLAB_PAGE};

impl Cache {
    /// `stats slabs` lines.
    pub fn slab_stats(&self, out: &mut Vec<u8>) {
        let mut active = 0;
        for (i, c) in self.classes.iter().enumerate() {
            if c.pages + c.hot_pages == 0 {
                continue;
            }
            active += 1;
            let id = i + 1;
            let used = c.items;
            for (k, v) in [
                ("chunk_size", c.size as u64),
                ("chunks_per_page", c.perslab as u64),
                ("total_pages", (c.pages + c.hot_pages) as u64),
                ("hot_pages", c.hot_pages as u64),
                ("total_chunks", ((c.pages + c.hot_pages) * c.perslab) as u64),
                ("used_chunks", used),
                ("free_chunks", (c.nfree + c.nfree_hot) as u64),
                ("free_chunks_end", if c.carve != 0 { (c.perslab - c.carved) as u64 } else { 0 }),
                ("hot_chunks_used", c.hot_items),
            ] {
                out.extend_from_slice(format!("STAT {id}:{k} {v}\r\n").as_bytes());
            }
        }
        out.extend_from_slice(format!("STAT active_slabs {active}\r\n").as_bytes());
        out.extend_from_slice(format!("STAT total_malloced {}\r\n", self.pages_used * SLAB_PAGE).as_bytes());
    }

    /// `stats items` lines.
    pub fn item_stats(&self, out: &mut Vec<u8>) {
        let now_ds = self.now_ds();
        for (i, c) in self.classes.iter().enumerate() {
            if c.items == 0 {
                continue;
            }
            let id = i + 1;
            let age = if c.lru_tail != 0 { (now_ds.saturating_sub(self.h(c.lru_tail).atime) / 10) as u64 } else { 0 };
            for (k, v) in [("number", c.items), ("number_hot", c.hot_items), ("age", age), ("evicted", c.evicted)] {
                out.extend_from_slice(format!("STAT items:{id}:{k} {v}\r\n").as_bytes());
            }
        }
    }

    /// Check every invariant (tests): hash chains, LRUs, counts and that every item's key
    /// hashes to its bucket.
    pub fn check(&self) -> Result<(), String> {
        let mut n = 0;
        for (b, &head) in self.buckets.iter().enumerate() {
            let mut it = head;
            while it != 0 {
                if self.bucket(self.key(it)) != b {
                    return Err(format!("item {it:#x} in the wrong bucket"));
                }
                if self.h(it).iflags & LINKED == 0 {
                    return Err(format!("unlinked item {it:#x} in the hash"));
                }
                n += 1;
                it = self.h(it).h_next;
            }
        }
        if n != self.items {
            return Err(format!("hash holds {n} items, count says {}", self.items));
        }
        let mut lru_total = 0u64;
        for (i, c) in self.classes.iter().enumerate() {
            let (mut it, mut prev, mut k, mut hot) = (c.lru_head, 0, 0u64, 0u64);
            while it != 0 {
                if self.h(it).prev != prev || self.h(it).clsid as usize != i {
                    return Err(format!("LRU of class {i} broken at {it:#x}"));
                }
                if (self.h(it).iflags & HOT != 0) != self.is_hot_addr(it) {
                    return Err(format!("item {it:#x}: hot flag and place disagree"));
                }
                hot += u64::from(self.h(it).iflags & HOT != 0);
                k += 1;
                prev = it;
                it = self.h(it).next;
            }
            if prev != c.lru_tail || k != c.items || hot != c.hot_items {
                return Err(format!("class {i}: LRU has {k} items ({hot} hot), counts {} ({})", c.items, c.hot_items));
            }
            lru_total += k;
        }
        if lru_total != self.items as u64 {
            return Err("LRU and hash disagree".into());
        }
        Ok(())
    }
}
