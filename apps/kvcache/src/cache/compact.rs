//! HPS in the cache: hot items moved onto hugepage-backed slab pages (compaction), cooled
//! ones moved back (demotion), hot pages defragmented and given back when empty.

use pagewise_kernel::mem::{self, HUGE_PMD};

use super::{Cache, HotPage, HOT, HOT_PAGE, LINKED, SLAB_PAGE};

impl Cache {
    /// Move the recently read items on the 4 KiB page at `page` (an address in the cold area)
    /// onto the hot arena. Returns the number of items moved.
    pub fn compact_page(&mut self, page: usize) -> usize {
        if page < self.cold.base || page >= self.cold.base + self.cold.next {
            return 0;
        }
        let off = page - self.cold.base;
        let cls = self.page_class[off / SLAB_PAGE];
        if cls == 0 {
            return 0;
        }
        let c = cls as usize - 1;
        let (size, perslab) = (self.classes[c].size, self.classes[c].perslab);
        let slab = self.cold.base + off / SLAB_PAGE * SLAB_PAGE;
        let first = (page - slab) / size;
        let last = ((page + mem::page_size() - 1 - slab) / size).min(perslab - 1);
        let carved = if self.classes[c].carve == slab { self.classes[c].carved } else { perslab };
        let horizon = self.now_ds().saturating_sub(self.cfg.hot_window_ds);
        let mut moved = 0;
        for i in first..=last.min(carved.saturating_sub(1)) {
            let it = slab + i * size;
            let h = self.h(it);
            if h.iflags & LINKED == 0 || h.iflags & HOT != 0 || h.atime < horizon {
                continue;
            }
            if self.move_item(it, true) {
                moved += 1;
            }
        }
        moved
    }

    /// Move items of the hot arena not read within the hot window back to cold chunks, and
    /// give hot pages left empty back to the hugepage arena (which reuses their space).
    pub fn demote_cooled(&mut self) -> usize {
        let horizon = self.now_ds().saturating_sub(self.cfg.hot_window_ds);
        let pages: Vec<(usize, u8)> = self.hot.iter().map(|(&a, p)| (a, p.class)).collect();
        let mut moved = 0;
        for &(page, cls) in &pages {
            let c = cls as usize;
            let size = self.classes[c].size;
            for i in 0..self.classes[c].hot_perslab {
                let it = page + i * size;
                let h = self.h(it);
                if h.iflags & LINKED != 0 && h.iflags & HOT != 0 && h.atime < horizon && self.move_item(it, false) {
                    moved += 1;
                }
            }
        }
        self.release_empty_hot_pages();
        for c in 0..self.classes.len() {
            self.defrag_hot(c);
        }
        self.release_empty_hot_pages();
        moved
    }

    /// Pack class `c`'s hot items onto as few hot pages as they need: empty the least used
    /// page into the free chunks of the others while that saves a page. Without this, items of
    /// a new hot set land in the free chunks of many half-empty pages and no page ever empties.
    fn defrag_hot(&mut self, c: usize) {
        loop {
            let per = self.classes[c].hot_perslab as u64;
            let pages: Vec<(usize, u32)> =
                self.hot.iter().filter(|(_, p)| p.class as usize == c).map(|(&a, p)| (a, p.used)).collect();
            let needed = self.classes[c].hot_items.div_ceil(per) as usize;
            if pages.len() <= needed.max(1) && pages.iter().all(|&(_, u)| u > 0) {
                return;
            }
            let Some(&(victim, used)) = pages.iter().min_by_key(|&&(a, u)| (u, a)) else { return };
            if used == 0 {
                return; // released by the caller
            }
            // Take the victim's chunks off the free list so the moves land elsewhere.
            let keep = self.hot_free_off(c, victim);
            if (keep.len() as u64) < used as u64 {
                return;
            }
            self.set_hot_free(c, &keep);
            let size = self.classes[c].size;
            for i in 0..self.classes[c].hot_perslab {
                let old = victim + i * size;
                if self.h(old).iflags & LINKED == 0 {
                    continue;
                }
                let new = self.take_hot(c);
                debug_assert!(new != 0 && new & !(HOT_PAGE - 1) != victim);
                let total = self.total(old);
                // SAFETY: distinct hot chunks of class `c`.
                unsafe { std::ptr::copy_nonoverlapping(old as *const u8, new as *mut u8, total) };
                self.hash_replace(old, new);
                self.lru_replace(old, new);
                // The victim's page count drops; its chunk is not put back on the free list
                // (the page is released next).
                self.h(old).iflags = 0;
                self.hot.get_mut(&victim).expect("victim page").used -= 1;
            }
            debug_assert_eq!(self.hot[&victim].used, 0);
            self.release_empty_hot_pages();
        }
    }

    fn release_empty_hot_pages(&mut self) {
        let empty: Vec<usize> = self.hot.iter().filter(|(_, p)| p.used == 0).map(|(&a, _)| a).collect();
        if empty.is_empty() {
            return;
        }
        for &page in &empty {
            let c = self.hot[&page].class as usize;
            // Unthread the page's chunks from the class's hot free list.
            let keep = self.hot_free_off(c, page);
            self.set_hot_free(c, &keep);
            self.classes[c].hot_pages -= 1;
            self.hot.remove(&page);
            self.pages_used -= HOT_PAGE / SLAB_PAGE;
            if let Some(h) = &self.hps {
                let _ = h.huge_free(page as *mut u8, HOT_PAGE);
            }
        }
    }

    /// The chunks on class `c`'s hot free list that are not on the hot page `page`, in order.
    fn hot_free_off(&self, c: usize, page: usize) -> Vec<usize> {
        let mut keep = Vec::new();
        let mut it = self.classes[c].free_hot;
        while it != 0 {
            if it & !(HOT_PAGE - 1) != page {
                keep.push(it);
            }
            it = self.h(it).h_next;
        }
        keep
    }

    /// Make `chunks`, in order, class `c`'s hot free list.
    fn set_hot_free(&mut self, c: usize, chunks: &[usize]) {
        let mut head = 0;
        for &k in chunks.iter().rev() {
            self.h(k).h_next = head;
            head = k;
        }
        self.classes[c].free_hot = head;
        self.classes[c].nfree_hot = chunks.len();
    }

    fn take_hot(&mut self, c: usize) -> usize {
        if self.classes[c].free_hot != 0 {
            let it = self.classes[c].free_hot;
            self.classes[c].free_hot = self.h(it).h_next;
            self.classes[c].nfree_hot -= 1;
            self.hot.get_mut(&(it & !(HOT_PAGE - 1))).expect("hot page of a hot chunk").used += 1;
            return it;
        }
        let Some(hps) = self.hps.clone() else { return 0 };
        if self.pages_used >= self.limit_pages + self.limit_pages / 8 {
            return 0;
        }
        let Ok(p) = hps.huge_alloc(HOT_PAGE) else { return 0 };
        let page = p as usize;
        debug_assert_eq!(page % HOT_PAGE, 0);
        self.pages_used += HOT_PAGE / SLAB_PAGE;
        self.classes[c].hot_pages += 1;
        let size = self.classes[c].size;
        let perslab = self.classes[c].hot_perslab;
        // Thread chunks 1.. onto the hot free list; chunk 0 is returned.
        for i in (1..perslab).rev() {
            let it = page + i * size;
            self.h(it).iflags = 0;
            self.h(it).h_next = self.classes[c].free_hot;
            self.classes[c].free_hot = it;
        }
        self.classes[c].nfree_hot += perslab - 1;
        self.hot.insert(page, HotPage { class: c as u8, used: 1 });
        page
    }

    /// Copy a linked item to a hot (or, `to_hot == false`, a cold) chunk and repoint the hash
    /// chain and the LRU at the copy. The old chunk is freed.
    fn move_item(&mut self, old: usize, to_hot: bool) -> bool {
        let c = self.h(old).clsid as usize;
        let new = if to_hot { self.take_hot(c) } else { self.take_cold(c) };
        if new == 0 {
            return false;
        }
        let total = self.total(old);
        // SAFETY: both are chunks of class `c` (≥ total bytes) and distinct.
        unsafe { std::ptr::copy_nonoverlapping(old as *const u8, new as *mut u8, total) };
        self.hash_replace(old, new);
        self.lru_replace(old, new);
        if to_hot {
            self.h(new).iflags |= HOT;
            self.classes[c].hot_items += 1;
            self.counters.compacted_items += 1;
        } else {
            self.h(new).iflags &= !HOT;
            self.classes[c].hot_items -= 1;
            self.counters.demoted_items += 1;
        }
        self.free_chunk(old);
        true
    }

    /// Refresh which 2 MiB regions of the cold area HPS promoted.
    pub fn refresh_promoted(&mut self) {
        if let Some(h) = &self.hps {
            for (i, p) in self.promoted.iter_mut().enumerate() {
                *p = h.region_promoted(self.cold.base + i * HUGE_PMD);
            }
        }
    }
}
