//! The cache: items in slab memory, a chained hash table, an LRU per slab class, eviction,
//! and HPS compaction (moving hot items onto hugepage-backed slab pages and back).
//!
//! Layout follows memcached (items.c, slabs.c): an item is a fixed header, the key and the
//! value, stored in one chunk of its slab class; classes grow by a factor of 1.25 from 96
//! bytes; slab pages are 1 MiB and are handed to a class for good; each class has a free list
//! and an LRU (doubly linked through the headers); the hash table chains through the headers.
//! When memory is full a store evicts from the tail of its class's LRU.
//!
//! Concurrency: the whole cache sits behind one mutex (the server's `Mutex<Cache>`). Every
//! reader copies an item's value into its connection's output buffer while holding it, so an
//! item's memory is never read after the lock is released: compaction, which copies an item
//! to a new chunk, repoints the hash chain and the LRU and frees the old chunk, runs under
//! the same lock, and no reader can ever see a torn or freed item. memcached needs per-item
//! refcounts because it sends values straight from item memory; this cache pays one memcpy of
//! the value instead (measured in `pagewise eval hps-kvcache` against memcached itself).
//!
//! Where things are: this file holds the storage (slabs, hash table, LRUs, items);
//! `cache/commands.rs` the memcached commands; `cache/compact.rs` HPS compaction and demotion;
//! `cache/inspect.rs` the stats output and the self-check.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use pagewise_hugepage::Hps;
use pagewise_kernel::mem::{self, Advice, MapOptions, Mapping, HUGE_PMD};

use crate::proto::REALTIME_MAXDELTA;

mod commands;
mod compact;
mod inspect;

/// Slab page size (memcached's default `-I 1m`).
pub const SLAB_PAGE: usize = 1 << 20;
/// The largest item: header + key + value must fit one slab page.
pub const ITEM_MAX: usize = SLAB_PAGE;
/// Slab pages of the hot arena are one hugepage each, so a hot page given back is a hugepage
/// given back.
pub const HOT_PAGE: usize = HUGE_PMD;
/// Growth factor between slab classes (memcached `-f 1.25`).
pub const GROWTH: f64 = 1.25;
/// The smallest chunk: header + 40 bytes (memcached: sizeof(item) + `-n 48`).
const CHUNK_MIN: usize = 96;

/// An item moves to the head of its LRU at most once in this many seconds (memcached's
/// ITEM_UPDATE_INTERVAL).
const LRU_BUMP_SECS: u32 = 60;

const LINKED: u8 = 1;
const HOT: u8 = 2;

/// The item header at the start of every chunk.
#[repr(C)]
struct Hdr {
    h_next: usize,
    prev: usize,
    next: usize,
    cas: u64,
    /// Expiry in server seconds (0: never).
    exptime: u32,
    /// Last access in server deciseconds.
    atime: u32,
    flags: u32,
    nbytes: u32,
    nkey: u8,
    clsid: u8,
    iflags: u8,
    _pad: u8,
    /// When the item last moved to the head of its LRU, in server seconds.
    ltime: u32,
}

const HDR: usize = std::mem::size_of::<Hdr>();

/// Where the slab pages of the cold area come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    /// Anonymous memory, no hugepages (THP `madvise` mode: none unless asked).
    Default,
    /// Anonymous memory, the whole slab area MADV_HUGEPAGE.
    Thp,
    /// The HPS tracked arena; hot items are compacted onto hugepages.
    Hps,
}

impl std::str::FromStr for Backing {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "default" => Ok(Backing::Default),
            "thp" => Ok(Backing::Thp),
            "hps" => Ok(Backing::Hps),
            _ => Err(format!("unknown memory mode {s:?} (default, thp, hps)")),
        }
    }
}

impl Backing {
    pub fn name(self) -> &'static str {
        match self {
            Backing::Default => "default",
            Backing::Thp => "thp",
            Backing::Hps => "hps",
        }
    }
}

/// The reply of a storage command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreResult {
    Stored,
    NotStored,
    Exists,
    NotFound,
    TooLarge,
    OutOfMemory,
}

/// The reply of incr/decr.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArithResult {
    Value(u64),
    NotFound,
    NonNumeric,
    OutOfMemory,
}

#[derive(Clone, Debug, Default)]
struct Class {
    size: usize,
    perslab: usize,
    hot_perslab: usize,
    free: usize,
    nfree: usize,
    free_hot: usize,
    nfree_hot: usize,
    /// The page being carved and how many chunks of it are handed out.
    carve: usize,
    carved: usize,
    lru_head: usize,
    lru_tail: usize,
    pages: usize,
    hot_pages: usize,
    items: u64,
    hot_items: u64,
    evicted: u64,
    stored: u64,
}

/// Counters for `stats`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    pub cmd_get: u64,
    pub get_hits: u64,
    pub get_misses: u64,
    pub get_expired: u64,
    pub get_flushed: u64,
    pub cmd_set: u64,
    pub cmd_touch: u64,
    pub touch_hits: u64,
    pub touch_misses: u64,
    pub cmd_flush: u64,
    pub delete_hits: u64,
    pub delete_misses: u64,
    pub incr_hits: u64,
    pub incr_misses: u64,
    pub decr_hits: u64,
    pub decr_misses: u64,
    pub cas_hits: u64,
    pub cas_misses: u64,
    pub cas_badval: u64,
    pub total_items: u64,
    pub evictions: u64,
    pub expired_unfetched: u64,
    /// Hits on an item in the hot (hugepage) arena.
    pub hot_hits: u64,
    /// Hits on an item in a promoted 2 MiB region of the cold area.
    pub promoted_hits: u64,
    /// Items moved onto the hot arena.
    pub compacted_items: u64,
    /// Items moved back from the hot arena once cold.
    pub demoted_items: u64,
}

/// The cold slab area: one reservation, carved into 1 MiB pages in order.
struct ColdArea {
    base: usize,
    len: usize,
    next: usize,
    _anon: Option<Mapping>,
}

struct HotPage {
    class: u8,
    used: u32,
}

/// Cache settings.
#[derive(Clone, Debug)]
pub struct CacheConfig {
    /// Memory for items, bytes (`-m`).
    pub limit: usize,
    pub backing: Backing,
    /// An item not read for this long (deciseconds) is not moved to / is moved off the hot arena.
    pub hot_window_ds: u32,
    /// Populate the whole slab area at start (memcached `-L`: the whole cache preallocated on
    /// large pages); with [`Backing::Thp`] only.
    pub prealloc: bool,
}

/// The cache.
pub struct Cache {
    cfg: CacheConfig,
    classes: Vec<Class>,
    buckets: Vec<usize>,
    items: usize,
    bytes: u64,
    cold: ColdArea,
    /// Class of each cold page (0: not handed out).
    page_class: Vec<u8>,
    /// Per 2 MiB region of the cold area: promoted by HPS.
    promoted: Vec<bool>,
    hot: HashMap<usize, HotPage>,
    hps: Option<Arc<Hps>>,
    pages_used: usize,
    limit_pages: usize,
    cas: u64,
    start: Instant,
    start_unix: i64,
    flush_at: Option<u32>,
    pub counters: Counters,
}

// SAFETY: the raw item addresses point into memory the cache owns (the cold area mapping or
// the HPS arenas, which live as long as `hps`); all access goes through `&mut self`.
unsafe impl Send for Cache {}

/// Chunk sizes: 96 growing by 1.25 (8-byte aligned) up to half a page, then one page.
pub fn class_sizes() -> Vec<usize> {
    let mut v = Vec::new();
    let mut s = CHUNK_MIN;
    while s <= SLAB_PAGE / 2 {
        v.push(s);
        s = mem::align_up((s as f64 * GROWTH) as usize, 8);
    }
    v.push(SLAB_PAGE);
    v
}

impl Cache {
    /// A cache of `cfg.limit` bytes of slab pages. With [`Backing::Hps`], `hps` provides the
    /// tracked arena (cold pages) and the hugepage arena (hot pages).
    pub fn new(cfg: CacheConfig, hps: Option<Arc<Hps>>) -> anyhow::Result<Self> {
        let limit_pages = (cfg.limit / SLAB_PAGE).max(1);
        let len = mem::align_up(limit_pages * SLAB_PAGE, HUGE_PMD);
        let cold = match cfg.backing {
            Backing::Default | Backing::Thp => {
                let map = Mapping::anonymous(len, &MapOptions { align: Some(HUGE_PMD), ..Default::default() })?;
                if cfg.backing == Backing::Thp {
                    map.advise(Advice::HugePage)?;
                }
                if cfg.prealloc {
                    anyhow::ensure!(cfg.backing == Backing::Thp, "preallocation (-L) needs --memory-mode thp");
                    map.advise(Advice::PopulateWrite)?;
                }
                ColdArea { base: map.addr(), len, next: 0, _anon: Some(map) }
            }
            Backing::Hps => {
                let h = hps.as_ref().ok_or_else(|| anyhow::anyhow!("HPS memory needs a running HPS"))?;
                let p = h.alloc(len)?;
                ColdArea { base: p as usize, len, next: 0, _anon: None }
            }
        };
        let classes = class_sizes()
            .into_iter()
            .map(|size| Class { size, perslab: SLAB_PAGE / size, hot_perslab: HOT_PAGE / size, ..Default::default() })
            .collect();
        let start_unix = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
        Ok(Cache {
            cfg,
            classes,
            buckets: vec![0; 1 << 16],
            items: 0,
            bytes: 0,
            page_class: vec![0; len / SLAB_PAGE],
            promoted: vec![false; len / HUGE_PMD],
            cold,
            hot: HashMap::new(),
            hps,
            pages_used: 0,
            limit_pages,
            cas: 0,
            start: Instant::now(),
            // memcached starts its clock a little in the past so "1" is already expired.
            start_unix: start_unix - 10,
            flush_at: None,
            counters: Counters::default(),
        })
    }

    pub fn config(&self) -> &CacheConfig {
        &self.cfg
    }

    /// Server time in seconds (starts at 10).
    pub fn now(&self) -> u32 {
        self.start.elapsed().as_secs() as u32 + 10
    }

    fn now_ds(&self) -> u32 {
        (self.start.elapsed().as_millis() / 100) as u32 + 100
    }

    pub fn uptime(&self) -> u64 {
        self.start.elapsed().as_secs()
    }

    /// Start address and length of the cold slab area.
    pub fn cold_area(&self) -> (usize, usize) {
        (self.cold.base, self.cold.len)
    }

    /// memcached's realtime(): 0 never, negative already expired, up to 30 days relative,
    /// above that an absolute Unix time.
    fn realtime(&self, exptime: i64, now: u32) -> u32 {
        if exptime == 0 {
            return 0;
        }
        if exptime < 0 {
            return 1;
        }
        if exptime > REALTIME_MAXDELTA {
            let rel = exptime - self.start_unix;
            return rel.clamp(1, u32::MAX as i64) as u32;
        }
        (now as i64 + exptime).min(u32::MAX as i64) as u32
    }

    fn class_for(&self, total: usize) -> Option<usize> {
        if total > ITEM_MAX {
            return None;
        }
        Some(self.classes.partition_point(|c| c.size < total))
    }

    // ---- raw item access -------------------------------------------------------------

    #[allow(clippy::mut_from_ref)]
    fn h(&self, it: usize) -> &mut Hdr {
        debug_assert!(it != 0 && it % 8 == 0);
        // SAFETY: `it` is a chunk address inside memory this cache owns, at least HDR bytes
        // long and 8-byte aligned (chunk sizes are multiples of 8 from page-aligned starts);
        // the cache is only used through `&mut self` (one mutex), so no other reference to
        // this header is alive while the returned one is used.
        unsafe { &mut *(it as *mut Hdr) }
    }

    fn key(&self, it: usize) -> &[u8] {
        let n = self.h(it).nkey as usize;
        // SAFETY: the key follows the header inside the item's chunk.
        unsafe { std::slice::from_raw_parts((it + HDR) as *const u8, n) }
    }

    fn data(&self, it: usize) -> &[u8] {
        let h = self.h(it);
        // SAFETY: the value follows the key inside the chunk (HDR + nkey + nbytes ≤ size).
        unsafe { std::slice::from_raw_parts((it + HDR + h.nkey as usize) as *const u8, h.nbytes as usize) }
    }

    #[allow(clippy::mut_from_ref)]
    fn data_mut(&self, it: usize) -> &mut [u8] {
        let h = self.h(it);
        // SAFETY: as in `data`; exclusive through `&mut self` of the caller.
        unsafe { std::slice::from_raw_parts_mut((it + HDR + h.nkey as usize) as *mut u8, h.nbytes as usize) }
    }

    fn total(&self, it: usize) -> usize {
        let h = self.h(it);
        HDR + h.nkey as usize + h.nbytes as usize
    }

    // ---- hash table ----------------------------------------------------------------------

    fn bucket(&self, key: &[u8]) -> usize {
        (hash(key) as usize) & (self.buckets.len() - 1)
    }

    fn find_raw(&self, key: &[u8]) -> usize {
        let mut it = self.buckets[self.bucket(key)];
        while it != 0 {
            if self.key(it) == key {
                return it;
            }
            it = self.h(it).h_next;
        }
        0
    }

    fn hash_insert(&mut self, it: usize) {
        let b = self.bucket(self.key(it));
        self.h(it).h_next = self.buckets[b];
        self.buckets[b] = it;
        self.items += 1;
        if self.items > self.buckets.len() * 3 / 2 {
            self.grow_table();
        }
    }

    fn grow_table(&mut self) {
        let n = self.buckets.len() * 2;
        let old = std::mem::replace(&mut self.buckets, vec![0; n]);
        for mut it in old {
            while it != 0 {
                let next = self.h(it).h_next;
                let b = self.bucket(self.key(it));
                self.h(it).h_next = self.buckets[b];
                self.buckets[b] = it;
                it = next;
            }
        }
    }

    /// Point whatever points at `old` in its hash chain at `new` (or past `old` if new is 0).
    fn hash_replace(&mut self, old: usize, new: usize) {
        let b = self.bucket(self.key(old));
        let repl = if new == 0 { self.h(old).h_next } else { new };
        if self.buckets[b] == old {
            self.buckets[b] = repl;
            return;
        }
        let mut it = self.buckets[b];
        while it != 0 {
            let next = self.h(it).h_next;
            if next == old {
                self.h(it).h_next = repl;
                return;
            }
            it = next;
        }
        unreachable!("item not in its hash chain");
    }

    // ---- LRU -------------------------------------------------------------------------------

    fn lru_link(&mut self, it: usize) {
        let c = self.h(it).clsid as usize;
        let head = self.classes[c].lru_head;
        let h = self.h(it);
        h.prev = 0;
        h.next = head;
        if head != 0 {
            self.h(head).prev = it;
        }
        self.classes[c].lru_head = it;
        if self.classes[c].lru_tail == 0 {
            self.classes[c].lru_tail = it;
        }
    }

    fn lru_unlink(&mut self, it: usize) {
        let c = self.h(it).clsid as usize;
        let (prev, next) = (self.h(it).prev, self.h(it).next);
        if prev != 0 {
            self.h(prev).next = next;
        } else {
            self.classes[c].lru_head = next;
        }
        if next != 0 {
            self.h(next).prev = prev;
        } else {
            self.classes[c].lru_tail = prev;
        }
    }

    /// After `new` took `old`'s place (same prev/next), point the neighbours at it.
    fn lru_replace(&mut self, old: usize, new: usize) {
        let c = self.h(new).clsid as usize;
        let (prev, next) = (self.h(new).prev, self.h(new).next);
        if prev != 0 {
            self.h(prev).next = new;
        } else {
            debug_assert_eq!(self.classes[c].lru_head, old);
            self.classes[c].lru_head = new;
        }
        if next != 0 {
            self.h(next).prev = new;
        } else {
            self.classes[c].lru_tail = new;
        }
    }

    // ---- chunks ----------------------------------------------------------------------------

    fn is_hot_addr(&self, it: usize) -> bool {
        !(it >= self.cold.base && it < self.cold.base + self.cold.len)
    }

    fn free_chunk(&mut self, it: usize) {
        let c = self.h(it).clsid as usize;
        let hot = self.h(it).iflags & HOT != 0 || self.is_hot_addr(it);
        self.h(it).iflags = 0;
        if hot {
            self.h(it).h_next = self.classes[c].free_hot;
            self.classes[c].free_hot = it;
            self.classes[c].nfree_hot += 1;
            if let Some(p) = self.hot.get_mut(&(it & !(HOT_PAGE - 1))) {
                p.used -= 1;
            }
        } else {
            self.h(it).h_next = self.classes[c].free;
            self.classes[c].free = it;
            self.classes[c].nfree += 1;
        }
    }

    /// A free cold chunk of class `c`, without evicting.
    fn take_cold(&mut self, c: usize) -> usize {
        let cl = &mut self.classes[c];
        if cl.free != 0 {
            let it = cl.free;
            cl.nfree -= 1;
            // SAFETY: free chunks keep the next free chunk in their h_next field.
            cl.free = unsafe { (*(it as *const Hdr)).h_next };
            return it;
        }
        if cl.carve != 0 && cl.carved < cl.perslab {
            let it = cl.carve + cl.carved * cl.size;
            cl.carved += 1;
            return it;
        }
        if self.pages_used < self.limit_pages && self.cold.next + SLAB_PAGE <= self.cold.len {
            let page = self.cold.base + self.cold.next;
            self.page_class[self.cold.next / SLAB_PAGE] = c as u8 + 1;
            self.cold.next += SLAB_PAGE;
            self.pages_used += 1;
            let cl = &mut self.classes[c];
            cl.pages += 1;
            cl.carve = page;
            cl.carved = 1;
            return page;
        }
        0
    }

    /// A chunk for a new item of class `c`: free, new, or evicted from the LRU tail.
    fn alloc_chunk(&mut self, c: usize) -> usize {
        let it = self.take_cold(c);
        if it != 0 {
            return it;
        }
        // Evict from the tail; a hot victim frees a hot chunk, so keep going (bounded).
        for _ in 0..64 {
            let victim = self.classes[c].lru_tail;
            if victim == 0 {
                return 0;
            }
            let now = self.now();
            let e = self.h(victim).exptime;
            if e == 0 || e > now {
                self.counters.evictions += 1;
                self.classes[c].evicted += 1;
            }
            self.unlink(victim);
            let it = self.take_cold(c);
            if it != 0 {
                return it;
            }
        }
        0
    }

    /// Remove `it` from the hash and the LRU and free its chunk.
    fn unlink(&mut self, it: usize) {
        self.hash_replace(it, 0);
        self.items -= 1;
        self.lru_unlink(it);
        let c = self.h(it).clsid as usize;
        self.classes[c].items -= 1;
        if self.h(it).iflags & HOT != 0 {
            self.classes[c].hot_items -= 1;
        }
        self.bytes -= self.total(it) as u64;
        self.free_chunk(it);
    }

    /// Allocate an item (not linked): header and key written, value left for the caller.
    fn alloc_item(&mut self, key: &[u8], flags: u32, exptime: u32, nbytes: usize) -> Result<usize, StoreResult> {
        let total = HDR + key.len() + nbytes;
        let c = self.class_for(total).ok_or(StoreResult::TooLarge)?;
        let it = self.alloc_chunk(c);
        if it == 0 {
            return Err(StoreResult::OutOfMemory);
        }
        let now_ds = self.now_ds();
        let h = self.h(it);
        *h = Hdr {
            h_next: 0,
            prev: 0,
            next: 0,
            cas: 0,
            exptime,
            atime: now_ds,
            flags,
            nbytes: nbytes as u32,
            nkey: key.len() as u8,
            clsid: c as u8,
            iflags: 0,
            _pad: 0,
            ltime: self.now(),
        };
        // SAFETY: the key area of the chunk, HDR..HDR+nkey, lies inside the chunk.
        unsafe { std::ptr::copy_nonoverlapping(key.as_ptr(), (it + HDR) as *mut u8, key.len()) };
        Ok(it)
    }

    fn link(&mut self, it: usize) {
        self.cas += 1;
        self.h(it).cas = self.cas;
        self.h(it).iflags |= LINKED;
        self.hash_insert(it);
        self.lru_link(it);
        let c = self.h(it).clsid as usize;
        self.classes[c].items += 1;
        self.classes[c].stored += 1;
        self.bytes += self.total(it) as u64;
        self.counters.total_items += 1;
    }

    /// Replace `old` (linked) by `new` (unlinked).
    fn replace(&mut self, old: usize, new: usize) {
        self.unlink(old);
        self.link(new);
    }

    fn maybe_flush(&mut self, now: u32) {
        if let Some(at) = self.flush_at {
            if now >= at {
                self.flush_at = None;
                self.flush_now();
            }
        }
    }

    fn flush_now(&mut self) {
        for c in 0..self.classes.len() {
            while self.classes[c].lru_head != 0 {
                let it = self.classes[c].lru_head;
                self.unlink(it);
            }
        }
    }

    /// A live item of `key` (expired ones are unlinked on the way).
    fn find(&mut self, key: &[u8], now: u32) -> usize {
        self.maybe_flush(now);
        let it = self.find_raw(key);
        if it == 0 {
            return 0;
        }
        let e = self.h(it).exptime;
        if e != 0 && e <= now {
            self.unlink(it);
            self.counters.get_expired += 1;
            return 0;
        }
        it
    }

    /// A read or an update of `it`: its access time (the hot window's clock) always, its LRU
    /// position at most once per [`LRU_BUMP_SECS`]. Moving an item to the head rewrites the
    /// headers of its two neighbours and of the old head, cache misses on three other items
    /// (and, under HPS, writes to pages nobody read); memcached likewise relinks an item at
    /// most once per ITEM_UPDATE_INTERVAL (60 s).
    fn bump(&mut self, it: usize) {
        let (now, now_ds) = (self.now(), self.now_ds());
        let h = self.h(it);
        h.atime = now_ds;
        if now.wrapping_sub(h.ltime) >= LRU_BUMP_SECS {
            h.ltime = now;
            self.lru_unlink(it);
            self.lru_link(it);
        }
    }

    // ---- stats ---------------------------------------------------------------------------

    pub fn curr_items(&self) -> usize {
        self.items
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn limit_bytes(&self) -> usize {
        self.limit_pages * SLAB_PAGE
    }

    /// Items on the hot arena, and the bytes of the chunks they occupy.
    pub fn hot_items(&self) -> (u64, u64) {
        let items: u64 = self.classes.iter().map(|c| c.hot_items).sum();
        let bytes: u64 = self.classes.iter().map(|c| c.hot_items * c.size as u64).sum();
        (items, bytes)
    }

    /// Bytes of slab pages on the hot arena.
    pub fn hot_pages_bytes(&self) -> u64 {
        (self.hot.len() * HOT_PAGE) as u64
    }

    pub fn promoted_regions(&self) -> usize {
        self.promoted.iter().filter(|&&p| p).count()
    }
}

/// Append a decimal number.
pub fn push_num(out: &mut Vec<u8>, v: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    let mut v = v;
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

/// 64-bit hash of a key (8 bytes at a time, then murmur3's fmix64 finaliser).
pub fn hash(key: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h = key.len() as u64 ^ 0x5851_F42D_4C95_7F2D;
    let mut chunks = key.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        h = (h ^ w).wrapping_mul(K).rotate_left(29);
    }
    let mut tail = 0u64;
    for (i, &b) in chunks.remainder().iter().enumerate() {
        tail |= (b as u64) << (8 * i);
    }
    h = (h ^ tail).wrapping_mul(K);
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests;
