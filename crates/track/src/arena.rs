//! The tracked arena: memfd-backed MAP_SHARED memory in whole 2 MiB regions.
//!
//! Shared file memory is what makes tracking lossless: MADV_DONTNEED on it drops the page-table
//! entries but the pages stay in the memfd's page cache (madvise(2): "shared mappings ... the
//! pages will be ... repopulated from the underlying mapped file"). The arena is 2 MiB aligned
//! so every region can later be collapsed into one PMD hugepage (MADV_COLLAPSE on shmem gives
//! `ShmemPmdMapped` in smaps).

use std::fs::File;
use std::os::unix::fs::MetadataExt;

use pagewise_kernel::mem::{self, align_up, Advice, MapOptions, Mapping, HUGE_PMD};

use crate::Result;

/// A memfd mapped shared, 2 MiB aligned, a whole number of 2 MiB regions long.
#[derive(Debug)]
pub struct TrackedArena {
    file: File,
    map: Mapping,
}

impl TrackedArena {
    /// A new arena of at least `len` bytes (rounded up to 2 MiB). Nothing is populated.
    pub fn new(name: &str, len: usize) -> Result<Self> {
        let len = align_up(len.max(1), HUGE_PMD);
        let fd = mem::memfd_create(name, None)?;
        mem::ftruncate(&fd, len as u64)?;
        let map =
            Mapping::of_fd(&fd, len, 0, &MapOptions { shared: true, align: Some(HUGE_PMD), ..Default::default() })?;
        Ok(TrackedArena { file: File::from(fd), map })
    }

    pub fn addr(&self) -> usize {
        self.map.addr()
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.map.as_ptr()
    }

    /// Bytes of memory the arena holds: the memfd's allocated blocks. Unlike the VMA's Rss this
    /// includes pages whose mappings the tracker dropped (they still occupy memory).
    pub fn resident_bytes(&self) -> u64 {
        self.file.metadata().map(|m| m.blocks() * 512).unwrap_or(0)
    }

    /// Free the memory behind `[addr, addr+len)` (MADV_REMOVE punches a hole in the memfd);
    /// the range reads back as zeros.
    pub fn release(&self, addr: usize, len: usize) -> Result<()> {
        self.check(addr, len)?;
        mem::madvise(addr, len, Advice::Remove)?;
        Ok(())
    }

    fn check(&self, addr: usize, len: usize) -> Result<()> {
        if addr < self.addr() || addr + len > self.addr() + self.len() {
            return Err(crate::Error::NotTracked(addr));
        }
        Ok(())
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
}
