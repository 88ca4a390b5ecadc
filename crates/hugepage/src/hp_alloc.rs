//! The hp_alloc arena: per-data hugepage placement (seed 001, the paper's HugepageRegion).
//!
//! What it decides, from what signal, and why:
//! - **Regions.** Memory is handed out from 2 MiB-aligned regions carved from the arena's own
//!   mappings ("segments"). A region is either part of a large allocation (a run of whole
//!   regions) or a slab of one size class. Hugepage memory and normal memory never mix: nothing
//!   but hp_alloc allocations lives in these mappings.
//! - **Never-used first, then recycled.** The paper's G1 takes *never-used* regions because a
//!   recycled G1 region is already mapped with 4 KiB pages and can only get a hugepage later, by
//!   khugepaged. Here a freed region keeps its PMD mapping (we never split it), so reusing it is
//!   even better than a fresh one: no fault, no zeroing. The arena therefore reuses freed
//!   (still populated) regions first, then never-used ones, then maps a new segment. Freed
//!   regions beyond `retain_bytes` are given back with MADV_DONTNEED, which zaps whole PMDs and
//!   turns them into never-used regions again (their next touch faults a fresh hugepage).
//! - **Backing** ([`choose_backing`], pure, from the same facts `pagewise doctor` reports):
//!   hugetlb when the 2 MiB pool has enough free pages for a segment (guaranteed hugepages,
//!   reserved at mmap time); otherwise THP with MADV_HUGEPAGE when THP is `always`/`madvise`
//!   (the first touch of a fresh 2 MiB-aligned region faults a hugepage directly); otherwise
//!   MADV_COLLAPSE of each fresh run when it is handed out (Linux 6.1; independent of the THP
//!   sysfs mode); otherwise plain pages, which the stats then show as zero hugepage bytes.
//! - **Stats** ([`HpArena::stats`]): hugepage bytes are read from /proc/self/smaps
//!   (`AnonHugePages` + `Private_Hugetlb`) of the arena's own mappings, set against the bytes
//!   callers requested, so "is my data on hugepages" is answered by the kernel, not by us.
//!
//! - **Tags** ([`HpArena::alloc_tagged`], [`HpArena::free_tagged`]): every allocation gets a
//!   tag no other allocation of the arena ever gets (a 64-bit counter). Addresses are reused
//!   (that is the point of the arena), so a free that comes late — a finalizer or cleaner that
//!   runs twice, a second owner — would otherwise free whoever holds the address now; a tagged
//!   free of a block that is gone is refused ([`Error::Stale`]) and changes nothing (issue 23).
//!   The untagged [`HpArena::free`] has `free(3)`'s contract: each pointer is freed once.
//!
//! Thread safety: one mutex around the arena's bookkeeping; allocation is a few map operations
//! (Spark allocates 1–4 MiB chunks, not millions of small objects).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use pagewise_kernel::mem::{self, align_up, Advice, MapOptions, Mapping, HUGE_PMD};
use pagewise_kernel::procfs::{read_smaps, Pid};
use pagewise_kernel::thp::{thp_mode, HugetlbPool};

use crate::{Error, Result};

/// Smallest size class (bytes); every allocation is at least this aligned.
pub const MIN_CLASS: usize = 64;
/// Largest size class; larger requests get whole regions.
pub const MAX_CLASS: usize = 1 << 20;
const NUM_CLASSES: usize = (MAX_CLASS.trailing_zeros() - MIN_CLASS.trailing_zeros() + 1) as usize;

/// Where the arena's hugepages come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    /// MAP_HUGETLB from the reserved 2 MiB pool.
    Hugetlb,
    /// MADV_HUGEPAGE on fresh 2 MiB-aligned mappings; the first touch faults a hugepage.
    Thp,
    /// MADV_POPULATE_WRITE + MADV_COLLAPSE of every never-used run when handed out.
    Collapse,
    /// No hugepage mechanism available: plain pages.
    None,
}

impl Backing {
    /// The stable name (also the value of `PAGEWISE_HP_BACKING`).
    pub fn name(self) -> &'static str {
        match self {
            Backing::Hugetlb => "hugetlb",
            Backing::Thp => "thp",
            Backing::Collapse => "collapse",
            Backing::None => "none",
        }
    }

    /// Parse a name; `auto` gives `None` (choose from the machine).
    pub fn parse(text: &str) -> Result<Option<Backing>> {
        Ok(Some(match text {
            "auto" | "" => return Ok(None),
            "hugetlb" => Backing::Hugetlb,
            "thp" => Backing::Thp,
            "collapse" => Backing::Collapse,
            "none" => Backing::None,
            other => {
                return Err(Error::Invalid(format!(
                    "unknown hp_alloc backing {other:?} (auto, hugetlb, thp, collapse, none)"
                )))
            }
        }))
    }

    /// The C ABI value (`HP_BACKING_*` in include/pagewise/hp_alloc.h).
    pub fn raw(self) -> u32 {
        match self {
            Backing::None => 0,
            Backing::Thp => 1,
            Backing::Collapse => 2,
            Backing::Hugetlb => 3,
        }
    }
}

/// Choose the backing from what the machine offers: the THP `enabled` mode, the free pages of
/// the 2 MiB hugetlb pool, whether MADV_COLLAPSE works, and the segment size to be mapped.
pub fn choose_backing(thp_mode: &str, hugetlb_free_pages: u64, collapse_works: bool, segment_bytes: usize) -> Backing {
    if hugetlb_free_pages.saturating_mul(HUGE_PMD as u64) >= segment_bytes as u64 {
        Backing::Hugetlb
    } else if thp_mode == "always" || thp_mode == "madvise" {
        Backing::Thp
    } else if collapse_works {
        Backing::Collapse
    } else {
        Backing::None
    }
}

/// Options of an arena.
#[derive(Clone, Debug)]
pub struct HpConfig {
    /// Bytes mapped at a time (a multiple of 2 MiB; larger allocations map what they need).
    pub segment_bytes: usize,
    /// Forced backing; `None` chooses with [`choose_backing`].
    pub backing: Option<Backing>,
    /// Freed regions kept populated for reuse; beyond this they are given back (MADV_DONTNEED).
    pub retain_bytes: usize,
}

impl Default for HpConfig {
    fn default() -> Self {
        HpConfig { segment_bytes: 64 << 20, backing: None, retain_bytes: 256 << 20 }
    }
}

impl HpConfig {
    /// The defaults, overridden by `PAGEWISE_HP_BACKING` (auto|hugetlb|thp|collapse|none),
    /// `PAGEWISE_HP_SEGMENT_MB` and `PAGEWISE_HP_RETAIN_MB`.
    pub fn from_env() -> Result<Self> {
        let mut c = HpConfig::default();
        if let Ok(v) = std::env::var("PAGEWISE_HP_BACKING") {
            c.backing = Backing::parse(&v)?;
        }
        let mb = |name: &str| -> Result<Option<usize>> {
            match std::env::var(name) {
                Ok(v) => v
                    .parse::<usize>()
                    .map(|n| Some(n << 20))
                    .map_err(|_| Error::Invalid(format!("{name}={v:?} is not a number of MiB"))),
                Err(_) => Ok(None),
            }
        };
        if let Some(s) = mb("PAGEWISE_HP_SEGMENT_MB")? {
            c.segment_bytes = s;
        }
        if let Some(r) = mb("PAGEWISE_HP_RETAIN_MB")? {
            c.retain_bytes = r;
        }
        Ok(c)
    }
}

/// Arena statistics. The `hugepage_bytes` and `rss_bytes` fields come from smaps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HpStats {
    /// Bytes callers asked for, of live allocations.
    pub requested_bytes: u64,
    /// Bytes of live allocations after rounding to a size class or to whole regions.
    pub allocated_bytes: u64,
    /// Live allocations.
    pub live_allocations: u64,
    /// Bytes of the arena's mappings.
    pub mapped_bytes: u64,
    /// Freed regions kept populated for reuse.
    pub recycled_bytes: u64,
    /// Never-used (or given back) regions.
    pub fresh_bytes: u64,
    /// `AnonHugePages` + `Private_Hugetlb` of the arena's mappings (/proc/self/smaps).
    pub hugepage_bytes: u64,
    /// `Rss` of the arena's mappings (/proc/self/smaps).
    pub rss_bytes: u64,
    /// Failed MADV_COLLAPSE calls (Collapse backing only).
    pub collapse_failures: u64,
}

struct Segment {
    map: Mapping,
}

/// A region carved into slots of one size class.
struct Slab {
    class: usize,
    /// Slots never handed out start here (lazy carving).
    next_unused: u32,
    free: Vec<u32>,
    /// One bit per slot: set while allocated (catches double frees and stray pointers).
    live: Vec<u64>,
    used: u32,
    /// Requested bytes of each carved slot (valid while the slot is live).
    sizes: Vec<u32>,
    /// Tag of each carved slot's allocation (valid while the slot is live).
    tags: Vec<u64>,
    /// Requested bytes of the live slots.
    requested: u64,
}

impl Slab {
    fn slots(&self) -> u32 {
        (HUGE_PMD / class_size(self.class)) as u32
    }
}

struct Large {
    len: usize,
    requested: usize,
    tag: u64,
}

#[derive(Default)]
struct State {
    segments: BTreeMap<usize, Segment>,
    /// Freed runs (addr -> len), still populated: reused first.
    recycled: BTreeMap<usize, usize>,
    /// Never-used runs (addr -> len).
    fresh: BTreeMap<usize, usize>,
    large: HashMap<usize, Large>,
    slabs: HashMap<usize, Slab>,
    /// Per class, the regions with a free slot.
    partial: Vec<BTreeSet<usize>>,
    allocated: u64,
    live: u64,
    collapse_failures: u64,
    /// Tags handed out so far (the next allocation's tag is this plus one; 0 is never a tag).
    tags: u64,
}

/// The hugepage arena. Cheap to share (`&HpArena` is `Sync`).
pub struct HpArena {
    state: Mutex<State>,
    backing: Backing,
    config: HpConfig,
}

fn class_of(size: usize) -> usize {
    let s = size.max(MIN_CLASS).next_power_of_two();
    (s.trailing_zeros() - MIN_CLASS.trailing_zeros()) as usize
}

fn class_size(class: usize) -> usize {
    MIN_CLASS << class
}

/// First fit in a run map; splits the run and returns the start.
fn take_run(runs: &mut BTreeMap<usize, usize>, len: usize) -> Option<usize> {
    let (&addr, &run) = runs.iter().find(|(_, &l)| l >= len)?;
    runs.remove(&addr);
    if run > len {
        runs.insert(addr + len, run - len);
    }
    Some(addr)
}

/// Insert a run, merging with the runs it touches.
fn put_run(runs: &mut BTreeMap<usize, usize>, mut addr: usize, mut len: usize) {
    if let Some((&a, &l)) = runs.range(..addr).next_back() {
        if a + l == addr {
            runs.remove(&a);
            addr = a;
            len += l;
        }
    }
    if let Some(&l) = runs.get(&(addr + len)) {
        runs.remove(&(addr + len));
        len += l;
    }
    runs.insert(addr, len);
}

impl HpArena {
    /// An arena with `config`; the backing is chosen now (and named by [`HpArena::backing`]).
    pub fn new(config: HpConfig) -> Result<Self> {
        if config.segment_bytes == 0 || !config.segment_bytes.is_multiple_of(HUGE_PMD) {
            return Err(Error::Invalid(format!(
                "segment size {} is not a positive multiple of 2 MiB",
                config.segment_bytes
            )));
        }
        let backing = match config.backing {
            Some(b) => b,
            None => {
                let mode = thp_mode().unwrap_or_else(|_| "never".into());
                let free = HugetlbPool::read(HUGE_PMD as u64).map(|p| p.free_hugepages).unwrap_or(0);
                // Collapse is only tried when THP faults are off; the first collapse that fails
                // is counted in the stats rather than probed here.
                choose_backing(&mode, free, true, config.segment_bytes)
            }
        };
        let state = State { partial: vec![BTreeSet::new(); NUM_CLASSES], ..Default::default() };
        Ok(HpArena { state: Mutex::new(state), backing, config })
    }

    /// How this arena gets its hugepages.
    pub fn backing(&self) -> Backing {
        self.backing
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent maps (every mutation is a single
        // insert/remove), so poisoning is not fatal.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Allocate `size` bytes. Sizes up to [`MAX_CLASS`] come from size-class slabs (aligned to
    /// their power-of-two class); larger ones are whole 2 MiB-aligned regions.
    pub fn alloc(&self, size: usize) -> Result<*mut u8> {
        self.alloc_tagged(size).map(|(p, _)| p)
    }

    /// [`HpArena::alloc`], and the allocation's tag for [`HpArena::free_tagged`].
    pub fn alloc_tagged(&self, size: usize) -> Result<(*mut u8, u64)> {
        if size == 0 {
            return Err(Error::Invalid("hp_alloc of 0 bytes".into()));
        }
        if size > isize::MAX as usize - HUGE_PMD {
            return Err(Error::Invalid(format!("hp_alloc of {size} bytes is too large")));
        }
        let mut st = self.lock();
        let tag = st.tags + 1;
        let p = if size <= MAX_CLASS {
            self.alloc_small(&mut st, size, tag)?
        } else {
            self.alloc_large(&mut st, size, tag)?
        };
        st.tags = tag;
        st.live += 1;
        Ok((p as *mut u8, tag))
    }

    fn alloc_large(&self, st: &mut State, size: usize, tag: u64) -> Result<usize> {
        let len = align_up(size, HUGE_PMD);
        let addr = self.take_regions(st, len)?;
        st.large.insert(addr, Large { len, requested: size, tag });
        st.allocated += len as u64;
        Ok(addr)
    }

    fn alloc_small(&self, st: &mut State, size: usize, tag: u64) -> Result<usize> {
        let class = class_of(size);
        let region = match st.partial[class].first().copied() {
            Some(r) => r,
            None => {
                let r = self.take_regions(st, HUGE_PMD)?;
                let slots = (HUGE_PMD / class_size(class)) as u32;
                st.slabs.insert(
                    r,
                    Slab {
                        class,
                        next_unused: 0,
                        free: Vec::new(),
                        live: vec![0; slots.div_ceil(64) as usize],
                        used: 0,
                        sizes: Vec::new(),
                        tags: Vec::new(),
                        requested: 0,
                    },
                );
                st.partial[class].insert(r);
                r
            }
        };
        let slab = st.slabs.get_mut(&region).expect("partial region has a slab");
        let slot = match slab.free.pop() {
            Some(s) => s,
            None => {
                let s = slab.next_unused;
                slab.next_unused += 1;
                slab.sizes.push(0);
                slab.tags.push(0);
                s
            }
        };
        slab.sizes[slot as usize] = size as u32;
        slab.tags[slot as usize] = tag;
        slab.live[slot as usize / 64] |= 1 << (slot % 64);
        slab.used += 1;
        slab.requested += size as u64;
        let full = slab.free.is_empty() && slab.next_unused == slab.slots();
        if full {
            st.partial[class].remove(&region);
        }
        st.allocated += class_size(class) as u64;
        Ok(region + slot as usize * class_size(class))
    }

    /// Take `len` bytes of whole regions: recycled first, never-used next, else a new segment.
    fn take_regions(&self, st: &mut State, len: usize) -> Result<usize> {
        if let Some(a) = take_run(&mut st.recycled, len) {
            return Ok(a);
        }
        let a = match take_run(&mut st.fresh, len) {
            Some(a) => a,
            None => {
                let seg = len.max(self.config.segment_bytes);
                let map = self.map_segment(seg)?;
                let a = map.addr();
                st.segments.insert(a, Segment { map });
                if seg > len {
                    put_run(&mut st.fresh, a + len, seg - len);
                }
                a
            }
        };
        if self.backing == Backing::Collapse {
            // A never-used run: fault it in and collapse it now, so the data written next lands
            // on hugepages (MADV_COLLAPSE ignores the THP sysfs mode, Linux 6.1).
            let ok = mem::madvise(a, len, Advice::PopulateWrite).and_then(|_| mem::madvise(a, len, Advice::Collapse));
            if ok.is_err() {
                st.collapse_failures += 1;
            }
        }
        Ok(a)
    }

    fn map_segment(&self, len: usize) -> Result<Mapping> {
        if self.backing == Backing::Hugetlb {
            let opts = MapOptions { hugetlb: Some(HUGE_PMD), align: Some(HUGE_PMD), ..Default::default() };
            // The pool may have run dry since the backing was chosen: fall back to THP pages
            // for this segment rather than fail the allocation.
            if let Ok(m) = Mapping::anonymous(len, &opts) {
                return Ok(m);
            }
        }
        let m = Mapping::anonymous(len, &MapOptions { align: Some(HUGE_PMD), noreserve: true, ..Default::default() })?;
        if matches!(self.backing, Backing::Thp | Backing::Hugetlb) {
            m.advise(Advice::HugePage)?;
        }
        Ok(m)
    }

    /// Return an allocation. A pointer the arena did not hand out, or one already freed, is
    /// rejected with [`Error::Invalid`] and changes nothing. Like `free(3)`, each pointer is
    /// freed once: a second free after the address was handed out again frees the new block
    /// (use [`HpArena::free_tagged`] where a free may come late).
    pub fn free(&self, ptr: *mut u8) -> Result<()> {
        self.free_checked(ptr, None)
    }

    /// Return the allocation at `ptr` only if it is still the one `tag` names (from
    /// [`HpArena::alloc_tagged`]); a stale free — that block was freed and the address handed
    /// out again — is rejected with [`Error::Stale`] and changes nothing.
    pub fn free_tagged(&self, ptr: *mut u8, tag: u64) -> Result<()> {
        self.free_checked(ptr, Some(tag))
    }

    /// The tag of the live allocation at `ptr`, if there is one.
    pub fn tag_of(&self, ptr: *mut u8) -> Option<u64> {
        let addr = ptr as usize;
        let st = self.lock();
        let region = mem::align_down(addr, HUGE_PMD);
        if let Some(slab) = st.slabs.get(&region) {
            let cs = class_size(slab.class);
            let off = addr - region;
            let slot = off / cs;
            let live = off.is_multiple_of(cs)
                && slot < slab.next_unused as usize
                && slab.live[slot / 64] & (1 << (slot % 64)) != 0;
            return live.then(|| slab.tags[slot]);
        }
        st.large.get(&addr).map(|l| l.tag)
    }

    fn free_checked(&self, ptr: *mut u8, tag: Option<u64>) -> Result<()> {
        let addr = ptr as usize;
        let mut st = self.lock();
        let stale = |now: u64| {
            Error::Stale(format!(
                "hp_free({addr:#x}) of the block tagged {}: that block is gone and the address now holds the one tagged {now}; nothing freed",
                tag.unwrap_or(0)
            ))
        };
        let region = mem::align_down(addr, HUGE_PMD);
        if let Some(slab) = st.slabs.get_mut(&region) {
            let cs = class_size(slab.class);
            let off = addr - region;
            if !off.is_multiple_of(cs) {
                return Err(Error::Invalid(format!("hp_free({addr:#x}): not the start of an allocation")));
            }
            let slot = (off / cs) as u32;
            let bit = 1u64 << (slot % 64);
            if slot >= slab.next_unused || slab.live[slot as usize / 64] & bit == 0 {
                return Err(Error::Invalid(format!("hp_free({addr:#x}): not allocated (double free?)")));
            }
            if tag.is_some_and(|t| t != slab.tags[slot as usize]) {
                return Err(stale(slab.tags[slot as usize]));
            }
            slab.live[slot as usize / 64] &= !bit;
            slab.used -= 1;
            slab.requested -= slab.sizes[slot as usize] as u64;
            slab.free.push(slot);
            let class = slab.class;
            let empty = slab.used == 0;
            st.allocated -= cs as u64;
            st.live -= 1;
            if empty {
                st.slabs.remove(&region);
                st.partial[class].remove(&region);
                self.release_regions(&mut st, region, HUGE_PMD);
            } else {
                st.partial[class].insert(region);
            }
            return Ok(());
        }
        if let (Some(t), Some(l)) = (tag, st.large.get(&addr)) {
            if l.tag != t {
                return Err(stale(l.tag));
            }
        }
        match st.large.remove(&addr) {
            Some(l) => {
                st.allocated -= l.len as u64;
                st.live -= 1;
                self.release_regions(&mut st, addr, l.len);
                Ok(())
            }
            None => Err(Error::Invalid(format!("hp_free({addr:#x}): not allocated by hp_alloc (or freed twice)"))),
        }
    }

    fn release_regions(&self, st: &mut State, addr: usize, len: usize) {
        let retained: usize = st.recycled.values().sum();
        if retained + len <= self.config.retain_bytes {
            put_run(&mut st.recycled, addr, len);
        } else if mem::madvise(addr, len, Advice::DontNeed).is_ok() {
            // Whole 2 MiB-aligned regions: DONTNEED zaps whole PMDs, so the run is like new.
            put_run(&mut st.fresh, addr, len);
        } else {
            put_run(&mut st.recycled, addr, len);
        }
    }

    /// Counters without reading smaps (`hugepage_bytes` and `rss_bytes` are 0).
    pub fn counters(&self) -> HpStats {
        let st = self.lock();
        let small_req: u64 = st.slabs.values().map(|s| s.requested).sum();
        let large_req: u64 = st.large.values().map(|l| l.requested as u64).sum();
        HpStats {
            requested_bytes: small_req + large_req,
            allocated_bytes: st.allocated,
            live_allocations: st.live,
            mapped_bytes: st.segments.values().map(|s| s.map.len() as u64).sum(),
            recycled_bytes: st.recycled.values().map(|&l| l as u64).sum(),
            fresh_bytes: st.fresh.values().map(|&l| l as u64).sum(),
            hugepage_bytes: 0,
            rss_bytes: 0,
            collapse_failures: st.collapse_failures,
        }
    }

    /// Counters plus the hugepage and resident bytes of the arena's mappings from smaps.
    pub fn stats(&self) -> Result<HpStats> {
        let ranges: Vec<(u64, u64)> = {
            let st = self.lock();
            st.segments.values().map(|s| (s.map.addr() as u64, (s.map.addr() + s.map.len()) as u64)).collect()
        };
        let mut s = self.counters();
        let maps = read_smaps(Pid::SelfProcess)?;
        let vmas = maps.0.iter().map(|m| {
            let get = |k: &str| m.extension.map.get(k).copied().unwrap_or(0);
            (m.address, get("AnonHugePages") + get("Private_Hugetlb"), get("Rss"))
        });
        let (huge, rss) = attribute(vmas, &ranges);
        s.hugepage_bytes = huge;
        s.rss_bytes = rss;
        Ok(s)
    }
}

/// Sum the (hugepage, rss) bytes of the VMAs that overlap `ranges`. A VMA the kernel merged
/// with a neighbouring mapping counts in proportion to its overlap with the arena.
pub fn attribute(vmas: impl Iterator<Item = ((u64, u64), u64, u64)>, ranges: &[(u64, u64)]) -> (u64, u64) {
    let (mut huge, mut rss) = (0u64, 0u64);
    for ((start, end), h, r) in vmas {
        let overlap: u64 = ranges.iter().map(|&(a, b)| end.min(b).saturating_sub(start.max(a))).sum();
        if overlap == 0 || end <= start {
            continue;
        }
        let len = end - start;
        huge += (h as u128 * overlap as u128 / len as u128) as u64;
        rss += (r as u128 * overlap as u128 / len as u128) as u64;
    }
    (huge, rss)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn thp_arena(retain: usize) -> Option<HpArena> {
        match thp_mode() {
            Ok(m) if m == "always" || m == "madvise" => Some(
                HpArena::new(HpConfig { segment_bytes: 16 << 20, backing: Some(Backing::Thp), retain_bytes: retain })
                    .unwrap(),
            ),
            _ => None,
        }
    }

    #[test]
    fn chooses_backing_from_the_machine_facts() {
        assert_eq!(choose_backing("madvise", 64, true, 64 << 20), Backing::Hugetlb);
        assert_eq!(choose_backing("madvise", 31, true, 64 << 20), Backing::Thp);
        assert_eq!(choose_backing("always", 0, false, 64 << 20), Backing::Thp);
        assert_eq!(choose_backing("never", 0, true, 64 << 20), Backing::Collapse);
        assert_eq!(choose_backing("never", 0, false, 64 << 20), Backing::None);
        assert!(Backing::parse("bogus").is_err());
        assert_eq!(Backing::parse("auto").unwrap(), None);
    }

    #[test]
    fn rejects_bad_input() {
        let a = HpArena::new(HpConfig { backing: Some(Backing::None), ..Default::default() }).unwrap();
        assert!(matches!(a.alloc(0), Err(Error::Invalid(_))));
        assert!(matches!(a.alloc(usize::MAX), Err(Error::Invalid(_))));
        let p = a.alloc(100).unwrap();
        // SAFETY: an interior pointer is only compared, never dereferenced.
        assert!(matches!(a.free(unsafe { p.add(8) }), Err(Error::Invalid(_))));
        let mut x = 0u8;
        assert!(matches!(a.free(&mut x), Err(Error::Invalid(_))));
        a.free(p).unwrap();
        assert!(matches!(a.free(p), Err(Error::Invalid(_))), "double free must be refused");
        assert!(HpArena::new(HpConfig { segment_bytes: 3 << 20, ..Default::default() }).is_err());
    }

    /// A late free of a block whose address was handed out again leaves the new block alone
    /// (issue 23): refused as stale, the new block still live, intact and freeable by its own
    /// tag. Both paths: a small slot recycled within its slab, and a large run recycled whole.
    #[test]
    fn a_stale_tagged_free_of_a_recycled_address_frees_nothing() {
        for size in [100usize, 3 << 20] {
            let a = HpArena::new(HpConfig { backing: Some(Backing::None), ..Default::default() }).unwrap();
            let (p, old) = a.alloc_tagged(size).unwrap();
            a.free_tagged(p, old).unwrap();
            let (q, new) = a.alloc_tagged(size).unwrap();
            assert_eq!(p, q, "the address is recycled");
            assert_ne!(old, new);
            // SAFETY: q is ours, `size` bytes.
            unsafe { std::ptr::write_bytes(q, 0x3c, size) };
            let err = a.free_tagged(p, old).unwrap_err();
            assert!(matches!(err, Error::Stale(_)), "{err}");
            assert_eq!(err.errno(), libc::ESTALE);
            assert_eq!(a.counters().live_allocations, 1, "the newer block was freed by a stale free");
            assert_eq!(a.tag_of(q), Some(new));
            // SAFETY: q is still live and ours.
            assert!(unsafe { std::slice::from_raw_parts(q, size) }.iter().all(|&b| b == 0x3c));
            a.free_tagged(q, new).unwrap();
            assert_eq!(a.tag_of(q), None);
            assert!(matches!(a.free_tagged(q, new), Err(Error::Invalid(_))), "freed twice");
            assert_eq!(a.counters().live_allocations, 0);
        }
    }

    #[test]
    fn attribution_counts_overlap_only() {
        let vmas = vec![((0u64, 100u64), 50u64, 100u64), ((100, 200), 100, 100), ((300, 400), 7, 7)];
        assert_eq!(attribute(vmas.into_iter(), &[(100, 200), (0, 50)]), (125, 150));
    }

    #[test]
    fn freed_regions_are_reused_before_new_memory() {
        let a = HpArena::new(HpConfig { segment_bytes: 8 << 20, backing: Some(Backing::None), retain_bytes: 64 << 20 })
            .unwrap();
        let p = a.alloc(4 << 20).unwrap();
        a.free(p).unwrap();
        let q = a.alloc(3 << 20).unwrap();
        assert_eq!(p, q, "a freed run is reused first");
        let mapped = a.counters().mapped_bytes;
        let r = a.alloc(100).unwrap();
        let s = a.alloc(2 << 20).unwrap();
        assert_eq!(a.counters().mapped_bytes, mapped, "the rest of the segment is used before mapping more");
        for x in [q, r, s] {
            a.free(x).unwrap();
        }
        let c = a.counters();
        assert_eq!((c.live_allocations, c.allocated_bytes, c.requested_bytes), (0, 0, 0));
        assert_eq!(c.recycled_bytes + c.fresh_bytes, c.mapped_bytes);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Alloc(usize),
        Free(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (1usize..5000).prop_map(Op::Alloc),
            1 => (1usize..(5 << 20)).prop_map(Op::Alloc),
            4 => any::<usize>().prop_map(Op::Free),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]
        /// Live allocations never overlap, are aligned to their class (whole regions above
        /// MAX_CLASS), keep their contents, and the counters balance after freeing everything.
        #[test]
        fn allocations_never_overlap_and_are_aligned(ops in proptest::collection::vec(op(), 1..120)) {
            let a = HpArena::new(HpConfig { segment_bytes: 4 << 20, backing: Some(Backing::None), retain_bytes: 4 << 20 }).unwrap();
            let mut live: Vec<(usize, usize, u8)> = Vec::new();
            for (i, o) in ops.into_iter().enumerate() {
                match o {
                    Op::Alloc(n) => {
                        let p = a.alloc(n).unwrap() as usize;
                        let align = if n > MAX_CLASS { HUGE_PMD } else { n.max(MIN_CLASS).next_power_of_two() };
                        prop_assert_eq!(p % align, 0, "size {} at {:#x}", n, p);
                        for &(q, m, _) in &live {
                            prop_assert!(p + n <= q || q + m <= p, "{:#x}+{} overlaps {:#x}+{}", p, n, q, m);
                        }
                        let tag = i as u8;
                        // SAFETY: [p, p+n) was just handed out to us.
                        unsafe { std::ptr::write_bytes(p as *mut u8, tag, n) };
                        live.push((p, n, tag));
                    }
                    Op::Free(k) if !live.is_empty() => {
                        let (p, n, tag) = live.swap_remove(k % live.len());
                        // SAFETY: still live: ours to read.
                        let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, n) };
                        prop_assert!(bytes.iter().all(|&b| b == tag), "contents of {:#x} changed", p);
                        a.free(p as *mut u8).unwrap();
                    }
                    Op::Free(_) => {}
                }
            }
            let c = a.counters();
            prop_assert_eq!(c.live_allocations, live.len() as u64);
            prop_assert_eq!(c.requested_bytes, live.iter().map(|l| l.1 as u64).sum::<u64>());
            for (p, _, _) in live.drain(..) {
                a.free(p as *mut u8).unwrap();
            }
            let c = a.counters();
            prop_assert_eq!((c.live_allocations, c.allocated_bytes, c.requested_bytes), (0, 0, 0));
            prop_assert_eq!(c.recycled_bytes + c.fresh_bytes, c.mapped_bytes);
            prop_assert!(c.recycled_bytes <= 4 << 20);
        }
    }

    #[test]
    fn threads_allocate_disjoint_memory() {
        let a = HpArena::new(HpConfig { backing: Some(Backing::None), ..Default::default() }).unwrap();
        let all: Vec<Vec<(usize, usize)>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|t| {
                    let a = &a;
                    s.spawn(move || {
                        (0..300)
                            .map(|i| {
                                let n = 64 + (i * 37 + t * 1000) % 300_000;
                                let p = a.alloc(n).unwrap() as usize;
                                // SAFETY: freshly allocated for this thread.
                                unsafe { std::ptr::write_bytes(p as *mut u8, t as u8, n) };
                                (p, n)
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut v: Vec<(usize, usize)> = all.into_iter().flatten().collect();
        v.sort();
        for w in v.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "overlap between {:x?} and {:x?}", w[0], w[1]);
        }
        for (p, _) in v {
            a.free(p as *mut u8).unwrap();
        }
        assert_eq!(a.counters().live_allocations, 0);
    }

    /// The point of the arena: written data sits on hugepages, per smaps.
    #[test]
    fn written_regions_show_as_hugepages_in_smaps() {
        let Some(a) = thp_arena(64 << 20) else {
            pagewise_kernel::testing::skip("THP is not enabled (always/madvise) on this machine");
            return;
        };
        let n = 32 << 20;
        let p = a.alloc(n).unwrap();
        // SAFETY: our allocation of n bytes.
        unsafe { std::ptr::write_bytes(p, 0x5a, n) };
        let s = a.stats().unwrap();
        assert_eq!(s.requested_bytes, n as u64);
        assert!(s.rss_bytes >= n as u64, "rss {} < {}", s.rss_bytes, n);
        if s.hugepage_bytes == 0 {
            // A fault falls back to 4 KiB pages only when no free 2 MiB page exists; with THP
            // enabled and most regions faulting as 4 KiB, the machine is out of contiguous
            // memory, which a test cannot fix.
            let free = pagewise_kernel::procfs::read_meminfo().map(|m| m.mem_free).unwrap_or(0);
            panic!("no hugepage bytes in smaps for 32 MiB written to a THP arena (MemFree {free})");
        }
        // Most of it must be huge: the regions are aligned and fresh, so each first touch
        // faults a PMD unless the machine is too fragmented to give one.
        assert!(s.hugepage_bytes >= (n as u64) / 2, "only {} of {} bytes on hugepages", s.hugepage_bytes, n);
        a.free(p).unwrap();
        // Retained regions keep their hugepages; a reuse gets them back without a fault.
        let q = a.alloc(n).unwrap();
        assert_eq!(p, q);
        assert!(a.stats().unwrap().hugepage_bytes >= s.hugepage_bytes);
        a.free(q).unwrap();
    }

    #[test]
    fn regions_beyond_retain_are_given_back() {
        let Some(a) = thp_arena(0) else {
            pagewise_kernel::testing::skip("THP is not enabled (always/madvise) on this machine");
            return;
        };
        let n = 8 << 20;
        let p = a.alloc(n).unwrap();
        // SAFETY: our allocation.
        unsafe { std::ptr::write_bytes(p, 1, n) };
        assert!(a.stats().unwrap().rss_bytes >= n as u64);
        a.free(p).unwrap();
        let s = a.stats().unwrap();
        assert_eq!(s.rss_bytes, 0, "freed regions beyond retain_bytes are MADV_DONTNEED'd");
        assert_eq!(s.fresh_bytes, s.mapped_bytes);
    }
}
