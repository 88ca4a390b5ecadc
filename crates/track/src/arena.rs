//! The tracked arena: memfd-backed MAP_SHARED memory in whole 2 MiB regions.
//!
//! Shared file memory is what makes tracking lossless: MADV_DONTNEED on it drops the page-table
//! entries but the pages stay in the memfd's page cache (madvise(2): "shared mappings ... the
//! pages will be ... repopulated from the underlying mapped file"). The arena is 2 MiB aligned
//! so every region can later be collapsed into one PMD hugepage (MADV_COLLAPSE on shmem gives
//! `ShmemPmdMapped` in smaps).

use std::sync::Mutex;

use pagewise_kernel::mem::{self, align_up, Advice, MapOptions, Mapping, HUGE_PMD};
use pagewise_kernel::tmpfs::HugeTmpfs;

use crate::Result;

mod young;

/// A memfd mapped shared, 2 MiB aligned, a whole number of 2 MiB regions long: the program's
/// view, which the program may cut holes into (`unmap`, `detach`), and an alias of the whole
/// memfd the arena keeps for itself (releasing memory, counting it) — so the memfd's
/// descriptor is closed once both are mapped: a program under `pagewise hps run` never runs
/// out of descriptors, nor finds its sockets above 1024, because of its arenas. A young arena's
/// view is private anonymous memory at first, each region moved into the memfd later
/// (`arena/young.rs`).
#[derive(Debug)]
pub struct TrackedArena {
    addr: usize,
    len: usize,
    /// Where the view starts: `addr`, or inside the first region for an arena made [`at`] an
    /// address.
    ///
    /// [`at`]: TrackedArena::at
    view: usize,
    alias: Mapping,
    /// Ranges of the view that are no longer the arena's, sorted: unmapped by the program or
    /// detached (plain memory of its own now). Never unmapped, punched or counted again.
    holes: Mutex<Vec<(usize, usize)>>,
    /// Per 2 MiB region: whether the view maps the memfd there (true), or still the program's
    /// private anonymous memory of a young arena, not yet moved in ([`TrackedArena::young`]).
    in_memfd: Mutex<Vec<bool>>,
}

impl TrackedArena {
    /// A new arena of at least `len` bytes (rounded up to 2 MiB). Nothing is populated.
    pub fn new(name: &str, len: usize) -> Result<Self> {
        Self::on(None, name, len)
    }

    /// The same, its memory a file of `fs` when given (huge-capable: a 2 MiB range advised with
    /// MADV_HUGEPAGE gets a hugepage at its first touch), else a memfd.
    pub fn on(fs: Option<&HugeTmpfs>, name: &str, len: usize) -> Result<Self> {
        let len = align_up(len.max(1), HUGE_PMD);
        let fd = match fs {
            Some(fs) => fs.create(name, len as u64)?,
            None => {
                let fd = mem::memfd_create(name, None)?;
                mem::ftruncate(&fd, len as u64)?;
                fd
            }
        };
        let view =
            Mapping::of_fd(&fd, len, 0, &MapOptions { shared: true, align: Some(HUGE_PMD), ..Default::default() })?;
        Ok(Self::whole(view, alias_of(&fd, len)?, true))
    }

    /// An arena whose view is all of `view` (whole 2 MiB regions, aligned), `alias` its memfd's
    /// own mapping, every region's memory in the memfd or none of it (`in_memfd`).
    fn whole(view: Mapping, alias: Mapping, in_memfd: bool) -> Self {
        let (addr, len) = view.into_raw();
        TrackedArena {
            addr: addr as usize,
            len,
            view: addr as usize,
            alias,
            holes: Mutex::new(Vec::new()),
            in_memfd: Mutex::new(vec![in_memfd; len / HUGE_PMD]),
        }
    }

    /// An arena whose view is exactly `[addr, addr+len)` (page aligned), mapped over whatever
    /// is there: where the program placed a mapping of its own (MAP_FIXED, a reservation it
    /// commits). The arena spans the 2 MiB regions around it, each page of the view at the
    /// memfd offset that keeps it congruent to its address modulo 2 MiB, so the regions wholly
    /// inside can be collapsed; the parts of the span outside the view are never the arena's
    /// (holes from the start: another mapping's, never touched, punched or unmapped).
    ///
    /// # Safety
    /// The caller owns `[addr, addr+len)` (the program handed it over to be replaced).
    pub unsafe fn at(name: &str, addr: usize, len: usize) -> Result<Self> {
        let page = mem::page_size();
        if len == 0 || !addr.is_multiple_of(page) || !len.is_multiple_of(page) {
            return Err(crate::Error::Kernel(pagewise_kernel::Error::Invalid(format!(
                "arena view {addr:#x}+{len:#x} is not page aligned"
            ))));
        }
        let lo = addr - addr % HUGE_PMD;
        let hi = align_up(addr + len, HUGE_PMD);
        let fd = mem::memfd_create(name, None)?;
        mem::ftruncate(&fd, (hi - lo) as u64)?;
        let shared = MapOptions { shared: true, ..Default::default() };
        let alias = alias_of(&fd, hi - lo)?;
        // SAFETY: the caller owns the range (this function's contract).
        let view = unsafe { Mapping::of_fd_at(&fd, addr, len, (addr - lo) as u64, &shared) }?;
        let _ = view.into_raw();
        let holes = [(lo, addr - lo), (addr + len, hi - addr - len)].into_iter().filter(|&(_, n)| n > 0).collect();
        Ok(TrackedArena {
            addr: lo,
            len: hi - lo,
            view: addr,
            alias,
            holes: Mutex::new(holes),
            in_memfd: Mutex::new(vec![true; (hi - lo) / HUGE_PMD]),
        })
    }

    /// The first of its 2 MiB regions.
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// What tells this arena from every other live one: the address of its alias, which it
    /// alone maps (two arenas' views may start at one address: one placed where the program
    /// unmapped another's start).
    pub fn id(&self) -> usize {
        self.alias.addr()
    }

    /// The first byte the program was given.
    pub fn view_addr(&self) -> usize {
        self.view
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.addr as *mut u8
    }

    /// Bytes of memory the arena holds: the memfd's pages in memory (mincore(2) on the alias
    /// asks the page cache). Unlike the VMA's Rss this includes pages whose mappings the
    /// tracker dropped (they still occupy memory).
    pub fn resident_bytes(&self) -> u64 {
        let page = mem::page_size();
        let mut v = vec![0u8; self.len / page];
        if mem::mincore(self.alias.addr(), self.len, &mut v).is_err() {
            return 0;
        }
        let in_memfd = v.iter().filter(|&&b| b & 1 != 0).count() as u64 * page as u64;
        // A young region's memory is the view's own (anonymous) pages.
        let young: u64 = self
            .parts_by_home(self.addr, self.len)
            .into_iter()
            .filter(|p| !p.in_memfd)
            .map(|p| {
                let mut v = vec![0u8; p.len / page];
                mem::mincore(p.addr, p.len, &mut v).map_or(0, |_| v.iter().filter(|&&b| b & 1 != 0).count() as u64)
            })
            .sum();
        in_memfd + young * page as u64
    }

    /// Whether page `page` of 2 MiB region `region` is in memory (mincore(2) of one page of
    /// the alias: a page whose mapping the tracker dropped still counts).
    pub fn page_resident(&self, region: usize, page: usize) -> bool {
        let mut v = [0u8; 1];
        let at = self.alias.addr() + region * HUGE_PMD + page * mem::page_size();
        at < self.alias.addr() + self.len && mem::mincore(at, mem::page_size(), &mut v).is_ok() && v[0] & 1 != 0
    }

    /// Pages of 2 MiB region `region` in memory.
    pub fn region_resident_pages(&self, region: usize) -> u32 {
        let mut v = vec![0u8; HUGE_PMD / mem::page_size()];
        let at = self.alias.addr() + region * HUGE_PMD;
        if at >= self.alias.addr() + self.len || mem::mincore(at, HUGE_PMD, &mut v).is_err() {
            return 0;
        }
        v.iter().filter(|&&b| b & 1 != 0).count() as u32
    }

    /// Free the memory behind `[addr, addr+len)` of the view, where it is still the arena's
    /// (MADV_REMOVE on the alias punches a hole in the memfd; MADV_DONTNEED on a young
    /// region's private memory); it reads back as zeros.
    pub fn release(&self, addr: usize, len: usize) -> Result<()> {
        self.check(addr, len)?;
        for p in self.parts_by_home(addr, len) {
            if p.in_memfd {
                mem::madvise(self.alias.addr() + (p.addr - self.addr), p.len, Advice::Remove)?;
            } else {
                mem::madvise(p.addr, p.len, Advice::DontNeed)?;
            }
        }
        Ok(())
    }

    /// Copy what the memfd holds of `[addr, addr+len)` of the view to `dst` (as long), page
    /// by page through the alias: pages the memfd does not hold read as zeros and are not
    /// touched in `dst` (a fresh mapping is zeros already), so taking over a large range the
    /// program barely used costs what it used.
    ///
    /// # Safety
    /// `dst` is `len` writable bytes of the caller's, and nobody writes the range meanwhile.
    pub unsafe fn copy_held(&self, addr: usize, len: usize, dst: usize) -> Result<()> {
        self.check(addr, len)?;
        let page = mem::page_size();
        for p in self.parts_by_home(addr, len) {
            // A young region's data is in the view's own pages; mincore(2) answers for either.
            let from = if p.in_memfd { self.alias.addr() + (p.addr - self.addr) } else { p.addr };
            let to = dst + (p.addr - addr);
            let mut held = vec![0u8; p.len.div_ceil(page)];
            mem::mincore(from, p.len, &mut held)?;
            for (i, h) in held.iter().enumerate() {
                if h & 1 != 0 {
                    let n = page.min(p.len - i * page);
                    // SAFETY: both ranges are the caller's and the arena's, inside their bounds.
                    unsafe {
                        std::ptr::copy_nonoverlapping((from + i * page) as *const u8, (to + i * page) as *mut u8, n)
                    };
                }
            }
        }
        Ok(())
    }

    /// `[addr, addr+len)` of the view is no longer the arena's (the caller unmapped it,
    /// replaces it, or took it over): what the memfd holds of it is released and the arena
    /// never touches that range again, nor unmaps it when dropped. A young region's part is
    /// left as it is: its memory is the view's own, which the caller unmaps, replaces, or
    /// keeps.
    pub fn give_up(&self, addr: usize, len: usize) -> Result<()> {
        self.check(addr, len)?;
        for p in self.parts_by_home(addr, len).into_iter().filter(|p| p.in_memfd) {
            mem::madvise(self.alias.addr() + (p.addr - self.addr), p.len, Advice::Remove)?;
        }
        let mut holes = self.holes.lock().expect("holes lock");
        holes.push((addr, len));
        holes.sort_unstable();
        Ok(())
    }

    /// Whether all of `[addr, addr+len)` is still the arena's: arenas' spans may overlap
    /// (one made [`at`] an address in another's hole), and a range belongs to the one that
    /// owns it.
    ///
    /// [`at`]: TrackedArena::at
    pub fn owns(&self, addr: usize, len: usize) -> bool {
        len > 0 && self.live_parts(addr, len) == [(addr, len)] && self.check(addr, len).is_ok()
    }

    /// Whether nothing of the view is the arena's any more.
    pub fn all_given_up(&self) -> bool {
        self.live_parts(self.addr, self.len).is_empty()
    }

    /// The parts of `[addr, addr+len)` that are still the arena's.
    pub fn live_parts(&self, addr: usize, len: usize) -> Vec<(usize, usize)> {
        let holes = self.holes.lock().expect("holes lock");
        let mut parts = Vec::new();
        let (mut at, end) = (addr, addr + len);
        for &(h, n) in holes.iter() {
            if h + n <= at || h >= end {
                continue;
            }
            if h > at {
                parts.push((at, h - at));
            }
            at = at.max(h + n);
        }
        if at < end {
            parts.push((at, end - at));
        }
        parts
    }

    fn check(&self, addr: usize, len: usize) -> Result<()> {
        if addr < self.addr() || addr + len > self.addr() + self.len() {
            return Err(crate::Error::NotTracked(addr));
        }
        Ok(())
    }
}

/// The arena's own mapping of its memfd (`len` bytes). A child made by fork(2) has no use for
/// it.
fn alias_of(fd: &std::os::fd::OwnedFd, len: usize) -> Result<Mapping> {
    let alias = Mapping::of_fd(fd, len, 0, &MapOptions { shared: true, ..Default::default() })?;
    alias.advise(Advice::DontFork)?;
    Ok(alias)
}

/// Whether `path`, a /proc/PID/maps path, is the file behind an arena made under `name`: a
/// memfd (`/memfd:NAME (deleted)`) or a file of a huge-capable tmpfs (`/NAME.N (deleted)`).
pub fn is_arena_path(path: &str, name: &str) -> bool {
    let tmpfs_file =
        path.strip_prefix('/').and_then(|p| p.strip_prefix(name)).and_then(|p| p.strip_prefix('.')).is_some_and(|p| {
            p.split(' ').next().is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        });
    tmpfs_file
        || path
            .strip_prefix("/memfd:")
            .and_then(|p| p.strip_prefix(name))
            .is_some_and(|p| p.is_empty() || p.starts_with(' '))
}

impl Drop for TrackedArena {
    fn drop(&mut self) {
        for (a, n) in self.live_parts(self.addr, self.len) {
            // SAFETY: a part of the view the arena still owns (holes are someone else's now).
            let _ = unsafe { mem::munmap(a, n) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arena_is_aligned_keeps_data_across_dontneed_and_release_frees() {
        let a = TrackedArena::new("pw-arena-test", 3 << 20).unwrap();
        assert_eq!(a.addr() % HUGE_PMD, 0);
        assert_eq!(a.len(), 4 << 20);
        assert_eq!(a.resident_bytes(), 0);
        // SAFETY: our own shared mapping.
        unsafe { mem::touch_pages(a.addr(), 1 << 20) };
        // SAFETY: as above.
        unsafe { (a.addr() as *mut u64).write(0xfeed) };
        assert_eq!(a.resident_bytes(), 1 << 20);
        mem::madvise(a.addr(), 1 << 20, Advice::DontNeed).unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { (a.addr() as *const u64).read() }, 0xfeed);
        a.release(a.addr(), 1 << 20).unwrap();
        assert_eq!(a.resident_bytes(), 0);
        assert!(a.release(a.addr() + (4 << 20), 4096).is_err());
    }

    #[test]
    fn an_arena_on_a_huge_tmpfs_gets_hugepages_where_advised_and_counts_residency_per_region() {
        let fs = HugeTmpfs::new().unwrap();
        let a = TrackedArena::on(Some(&fs), "pw-arena-tmpfs", 4 << 20).unwrap();
        mem::madvise(a.addr() + (2 << 20), 2 << 20, Advice::HugePage).unwrap();
        // SAFETY: our own shared mapping.
        unsafe {
            mem::touch_pages(a.addr(), 64 << 10);
            (a.addr() as *mut u8).add((2 << 20) + 4096).write(1);
        }
        assert_eq!(a.region_resident_pages(0), 16);
        assert!(a.page_resident(0, 15) && !a.page_resident(0, 16));
        // One touch of the advised region brought in its whole hugepage.
        assert_eq!(a.region_resident_pages(1), 512);
        assert!(!a.page_resident(2, 0));
        assert_eq!(a.region_resident_pages(2), 0);
    }

    #[test]
    fn arena_paths_are_told_from_other_files() {
        assert!(is_arena_path("/memfd:pagewise-hps (deleted)", "pagewise-hps"));
        assert!(is_arena_path("/pagewise-hps.12 (deleted)", "pagewise-hps"));
        assert!(!is_arena_path("/memfd:pagewise-hps-compact (deleted)", "pagewise-hps"));
        assert!(!is_arena_path("/pagewise-hps.x (deleted)", "pagewise-hps"));
        assert!(!is_arena_path("/usr/lib/pagewise-hps.1", "pagewise-hps"));
        assert!(!is_arena_path("/tmp/pagewise-hps.1", "pagewise-hps"));
    }

    #[test]
    fn a_range_given_up_is_released_and_never_unmapped_by_the_arena() {
        let a = TrackedArena::new("pw-arena-holes", 2 << 20).unwrap();
        // SAFETY: our own shared mapping.
        unsafe { mem::touch_pages(a.addr(), 2 << 20) };
        let hole = a.addr() + (1 << 20);
        a.give_up(hole, 64 << 10).unwrap();
        assert_eq!(a.resident_bytes(), (2 << 20) - (64 << 10));
        assert_eq!(
            a.live_parts(a.addr(), 2 << 20),
            vec![(a.addr(), 1 << 20), (hole + (64 << 10), (1 << 20) - (64 << 10))]
        );
        // Something else is mapped in the hole; dropping the arena must leave it.
        // SAFETY: the hole is no longer the arena's; we map our own memory there.
        let other = unsafe { Mapping::anonymous_at(hole, 64 << 10, &MapOptions::default()) }.unwrap();
        // SAFETY: our own mapping.
        unsafe { (hole as *mut u64).write(42) };
        assert!(!a.all_given_up());
        drop(a);
        // SAFETY: still mapped: the arena did not unmap its hole.
        assert_eq!(unsafe { (hole as *const u64).read() }, 42);
        drop(other);
    }
}
