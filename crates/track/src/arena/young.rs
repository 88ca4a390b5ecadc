//! Young arenas: routed memory that starts as the program's own private anonymous memory and
//! moves into the memfd, where it can be tracked and promoted, region by region, once the
//! caller's rule says it is worth it (late routing).
//!
//! Why: memory in a memfd costs the program more than private memory before it has given
//! anything back. On this VM kind a first touch of a shared memfd page took 2.1 µs against
//! 1.4 µs for a private one, and freeing it at exit 0.74 µs against 0.26 µs (128 MiB written
//! and unmapped, four runs each); GNU sort of 64 MiB, whose buffer is one routed allocation,
//! ran 1.07–1.14× plain for that alone. Tracking and promotion pay back only over a long run,
//! so a program that ends young should never have paid for the memfd.
//!
//! How a region moves in while the program runs: its range is write-protected (userfaultfd
//! WP, unpopulated pages included), the pages it holds are copied into the memfd through the
//! alias (pages of zeros stay holes: they read back as zeros), the memfd is mapped over the
//! range in one step (mremap(2) of the alias with an old size of zero: a second mapping of
//! the same pages, replacing the private one), and waiting writers are woken. A thread that
//! writes the region meanwhile waits in its fault, then retries on the new mapping and its
//! write lands in the memfd; readers never wait (they read the same bytes from either
//! mapping). Only whole regions move in: one the program cut a hole into (an munmap, an
//! mprotect of part of it) could never be promoted, so it stays private memory.

use pagewise_kernel::mem::{self, Advice, MapOptions, Mapping, HUGE_PMD};
use pagewise_kernel::uffd::{RegisterMode, Uffd};

use super::TrackedArena;
use crate::Result;

/// A part of an arena's view, and where its memory lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Part {
    pub(super) addr: usize,
    pub(super) len: usize,
    /// In the memfd (else the view's own private pages: a young region).
    pub(super) in_memfd: bool,
}

/// What moving a region in did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MovedIn {
    /// Pages copied into the memfd (pages the program wrote; zeros are left out).
    pub pages: usize,
}

impl TrackedArena {
    /// An arena of at least `len` bytes (rounded up to 2 MiB) whose memory is, for now, the
    /// view's own private anonymous pages: nothing of it is in the memfd until
    /// [`TrackedArena::move_in`] moves a region there. Nothing is populated.
    pub fn young(name: &str, len: usize) -> Result<Self> {
        let len = mem::align_up(len.max(1), HUGE_PMD);
        let fd = mem::memfd_create(name, None)?;
        mem::ftruncate(&fd, len as u64)?;
        let view = Mapping::anonymous(len, &MapOptions { align: Some(HUGE_PMD), ..Default::default() })?;
        Ok(Self::whole(view, super::alias_of(&fd, len)?, false))
    }

    /// Whether region `region`'s memory is in the memfd.
    pub fn region_in_memfd(&self, region: usize) -> bool {
        self.in_memfd.lock().expect("in_memfd lock").get(region).copied().unwrap_or(false)
    }

    /// The regions still young that can move in: whole, every byte still the arena's.
    pub fn young_regions(&self) -> Vec<usize> {
        let young: Vec<usize> = {
            let in_memfd = self.in_memfd.lock().expect("in_memfd lock");
            (0..in_memfd.len()).filter(|&r| !in_memfd[r]).collect()
        };
        young.into_iter().filter(|&r| self.region_whole(r)).collect()
    }

    /// The parts of the view whose memory is in the memfd and still the arena's: what a tracker
    /// may watch (a young region's private memory cannot be).
    pub fn memfd_parts(&self) -> Vec<(usize, usize)> {
        self.parts_by_home(self.addr, self.len).into_iter().filter(|p| p.in_memfd).map(|p| (p.addr, p.len)).collect()
    }

    /// Whether any of `[addr, addr+len)` has its memory in the memfd (else it is all the view's
    /// own private pages, or given up).
    pub fn in_memfd_anywhere(&self, addr: usize, len: usize) -> bool {
        self.parts_by_home(addr, len).iter().any(|p| p.in_memfd)
    }

    /// Move young region `region` into the memfd while the program may be using it (module
    /// doc). `uffd` offers write protection of unpopulated anonymous memory
    /// (UFFD_FEATURE_WP_UNPOPULATED) and is read by nobody: writers wait until woken here. On
    /// an error the region is left young, as it was.
    pub fn move_in(&self, region: usize, uffd: &Uffd) -> Result<MovedIn> {
        let at = self.addr + region * HUGE_PMD;
        if self.region_in_memfd(region) || !self.region_whole(region) {
            return Err(crate::Error::Kernel(pagewise_kernel::Error::Invalid(format!(
                "region at {at:#x} is not a whole young region"
            ))));
        }
        uffd.register(at, HUGE_PMD, RegisterMode { write_protect: true, ..Default::default() })?;
        let moved = self.copy_in_protected(at, uffd);
        if moved.is_err() {
            // Unregistering drops the protection and wakes any writer.
            let _ = uffd.unregister(at, HUGE_PMD);
            return moved;
        }
        self.in_memfd.lock().expect("in_memfd lock")[region] = true;
        // Writers that waited on the old mapping retry on the new one.
        let _ = uffd.wake(at, HUGE_PMD);
        moved
    }

    /// [`TrackedArena::move_in`]'s work once the region is registered: protect, copy, map.
    fn copy_in_protected(&self, at: usize, uffd: &Uffd) -> Result<MovedIn> {
        // (Protecting wakes nobody; the kernel refuses DONTWAKE with it.)
        uffd.write_protect(at, HUGE_PMD, true, true)?;
        let page = mem::page_size();
        let mut held = vec![0u8; HUGE_PMD / page];
        mem::mincore(at, HUGE_PMD, &mut held)?;
        let alias = self.alias.addr() + (at - self.addr);
        let mut pages = 0;
        for (i, h) in held.iter().enumerate() {
            // SAFETY: a page of the view the arena owns (the region is whole), write-protected:
            // nobody changes it while it is read.
            let src = unsafe { std::slice::from_raw_parts((at + i * page) as *const u64, page / 8) };
            if h & 1 == 0 || src.iter().all(|&w| w == 0) {
                continue;
            }
            // SAFETY: the same page of the alias, the arena's own shared mapping of the memfd.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr() as *const u8, (alias + i * page) as *mut u8, page) };
            pages += 1;
        }
        // SAFETY: the alias is a shared mapping of the arena's; the region is the arena's view.
        unsafe { mem::map_shared_again(alias, at, HUGE_PMD) }?;
        // The new mapping took the alias's flags, MADV_DONTFORK among them: the program's view
        // is inherited by a child as it was before.
        mem::madvise(at, HUGE_PMD, Advice::DoFork)?;
        Ok(MovedIn { pages })
    }

    /// Whether region `region` is whole: inside the view and none of it given up.
    pub(super) fn region_whole(&self, region: usize) -> bool {
        let at = self.addr + region * HUGE_PMD;
        at >= self.view && at + HUGE_PMD <= self.addr + self.len && self.live_parts(at, HUGE_PMD) == [(at, HUGE_PMD)]
    }

    /// The live parts of `[addr, addr+len)`, cut where regions change home.
    pub(super) fn parts_by_home(&self, addr: usize, len: usize) -> Vec<Part> {
        let in_memfd = self.in_memfd.lock().expect("in_memfd lock").clone();
        let mut out: Vec<Part> = Vec::new();
        for (a, n) in self.live_parts(addr, len) {
            let mut at = a;
            while at < a + n {
                let region = (at - self.addr) / HUGE_PMD;
                let end = (self.addr + (region + 1) * HUGE_PMD).min(a + n);
                let home = in_memfd.get(region).copied().unwrap_or(true);
                match out.last_mut() {
                    Some(p) if p.addr + p.len == at && p.in_memfd == home => p.len += end - at,
                    _ => out.push(Part { addr: at, len: end - at, in_memfd: home }),
                }
                at = end;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagewise_kernel::uffd::{feature, UffdBuilder};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    fn wp_uffd() -> Uffd {
        UffdBuilder::new().require(feature::WP_UNPOPULATED).nonblocking(true).open().unwrap()
    }

    fn word(addr: usize) -> u64 {
        // SAFETY: callers read their own arena's mapped view.
        unsafe { (addr as *const u64).read_volatile() }
    }

    fn put(addr: usize, v: u64) {
        // SAFETY: callers write their own arena's mapped view.
        unsafe { (addr as *mut u64).write_volatile(v) }
    }

    #[test]
    fn a_young_region_moves_into_the_memfd_with_its_data_and_its_zeros_left_out() {
        let a = TrackedArena::young("pw-young", 4 << 20).unwrap();
        assert_eq!(a.memfd_parts(), vec![]);
        assert_eq!(a.young_regions(), vec![0, 1]);
        put(a.addr() + 8, 11);
        put(a.addr() + (1 << 20), 12);
        // Read, never written: the zero page, or a page of zeros; either stays a hole.
        let _ = word(a.addr() + (1 << 19));
        put(a.addr() + (2 << 20), 13);
        // The page read maps the zero page, which mincore(2) counts.
        assert_eq!(a.resident_bytes(), 4 * 4096);
        let moved = a.move_in(0, &wp_uffd()).unwrap();
        assert_eq!(moved.pages, 2);
        assert!(a.region_in_memfd(0) && !a.region_in_memfd(1));
        assert_eq!((word(a.addr() + 8), word(a.addr() + (1 << 20)), word(a.addr() + (2 << 20))), (11, 12, 13));
        assert_eq!(a.memfd_parts(), vec![(a.addr(), 2 << 20)]);
        assert_eq!(a.young_regions(), vec![1]);
        // One memory with the alias now: releasing punches the memfd, the young region's
        // private page goes as well.
        assert_eq!(a.resident_bytes(), 3 * 4096);
        a.release(a.addr(), 4 << 20).unwrap();
        assert_eq!(a.resident_bytes(), 0);
        assert_eq!((word(a.addr() + 8), word(a.addr() + (2 << 20))), (0, 0));
        assert!(a.move_in(0, &wp_uffd()).is_err(), "a region moves in once");
    }

    #[test]
    fn a_region_with_a_hole_stays_young_and_its_parts_keep_their_data() {
        let a = TrackedArena::young("pw-young-hole", 2 << 20).unwrap();
        put(a.addr(), 5);
        a.give_up(a.addr() + (1 << 20), 4096).unwrap();
        assert_eq!(a.young_regions(), Vec::<usize>::new());
        assert!(a.move_in(0, &wp_uffd()).is_err());
        assert_eq!(word(a.addr()), 5);
        let copy = Mapping::anonymous(4096, &MapOptions::default()).unwrap();
        // SAFETY: `copy` is ours, one page; nobody writes the arena meanwhile.
        unsafe { a.copy_held(a.addr(), 4096, copy.addr()) }.unwrap();
        assert_eq!(word(copy.addr()), 5);
    }

    /// A thread writing the region all along, every write checked against the memfd after.
    #[test]
    fn writes_during_the_move_land_in_the_memfd() {
        let a = Arc::new(TrackedArena::young("pw-young-race", 2 << 20).unwrap());
        let words = (2 << 20) / 8;
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (a, stop) = (a.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut round = 1u64;
                while !stop.load(Ordering::Relaxed) {
                    for i in (0..words).step_by(509) {
                        put(a.addr() + i * 8, round << 32 | i as u64);
                    }
                    round += 1;
                }
                round - 1
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        a.move_in(0, &wp_uffd()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        stop.store(true, Ordering::Relaxed);
        let last = writer.join().unwrap();
        for i in (0..words).step_by(509) {
            let alias = a.alias.addr() + i * 8;
            assert_eq!(word(alias), last << 32 | i as u64, "word {i}: the memfd missed a write");
            assert_eq!(word(a.addr() + i * 8), word(alias));
        }
    }

    /// A child made by fork(2) after the move still has the region (the new mapping must not
    /// keep the alias's MADV_DONTFORK).
    #[test]
    fn a_region_moved_in_is_inherited_by_a_child() {
        let a = TrackedArena::young("pw-young-fork", 2 << 20).unwrap();
        put(a.addr() + 64, 77);
        a.move_in(0, &wp_uffd()).unwrap();
        // SAFETY: the child only reads memory and exits with _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let ok = word(a.addr() + 64) == 77;
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status:#x}");
    }
}
