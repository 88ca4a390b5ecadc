//! The compaction target: hugepage-backed memory the application moves hot objects onto.
//!
//! Each chunk is one or more whole 2 MiB hugepages: from the hugetlb pool when it has free
//! pages (a memfd with MFD_HUGETLB: guaranteed hugepages, the paper's hugetlbfs), otherwise a
//! plain memfd populated and collapsed with MADV_COLLAPSE (ShmemPmdMapped). Memory is handed out
//! in page-aligned blocks: first-fit from the blocks given back with [`HugeArena::free`]
//! (coalesced), then by a bump pointer in the newest chunk, then from a new chunk. A chunk
//! whose blocks are all free is unmapped at once, so its hugepages go back to the system (or
//! the hugetlb pool). Why reuse matters: the set of hot objects drifts, and an application
//! that moves cooled objects off the arena must get their space back, or a drifting hot set
//! grows the arena without bound (issue 10).

use std::fs::File;
use std::os::unix::fs::MetadataExt;

use pagewise_kernel::mem::{self, align_up, MapOptions, Mapping, HUGE_PMD};
use pagewise_kernel::thp::HugetlbPool;

use crate::{Error, Result};

/// How a chunk got its hugepages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    Hugetlb,
    CollapsedMemfd,
}

struct Chunk {
    file: File,
    map: Mapping,
    /// Bump offset: bytes past it were never handed out.
    used: usize,
    /// Bytes handed out and not freed.
    live: usize,
    /// Freed blocks below `used`: (offset, len), sorted and coalesced.
    free: Vec<(usize, usize)>,
    backing: Backing,
}

impl Chunk {
    fn take_free(&mut self, len: usize) -> Option<usize> {
        let i = self.free.iter().position(|&(_, l)| l >= len)?;
        let (off, l) = self.free[i];
        if l == len {
            self.free.remove(i);
        } else {
            self.free[i] = (off + len, l - len);
        }
        self.live += len;
        Some(self.map.addr() + off)
    }

    fn give_back(&mut self, off: usize, len: usize) {
        let i = self.free.partition_point(|&(o, _)| o < off);
        self.free.insert(i, (off, len));
        // Coalesce with the neighbours; a block reaching the bump pointer returns to it.
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
        if let Some(&(o, l)) = self.free.last() {
            if o + l == self.used {
                self.used = o;
                self.free.pop();
            }
        }
        self.live -= len;
    }
}

/// A hugepage-backed arena that reuses freed blocks and unmaps empty chunks.
#[derive(Default)]
pub struct HugeArena {
    chunks: Vec<Chunk>,
}

impl HugeArena {
    pub fn new() -> Self {
        HugeArena { chunks: Vec::new() }
    }

    /// Allocate `len` bytes (rounded up to 4 KiB), page aligned; [`HugeArena::hugepages_needed`]
    /// tells how many new hugepages the call would map, so the caller can ask the budget first.
    pub fn alloc(&mut self, len: usize) -> Result<*mut u8> {
        let len = align_up(len.max(1), 4096);
        for c in &mut self.chunks {
            if let Some(p) = c.take_free(len) {
                return Ok(p as *mut u8);
            }
        }
        if let Some(c) = self.chunks.iter_mut().find(|c| c.used + len <= c.map.len()) {
            let p = c.map.addr() + c.used;
            c.used += len;
            c.live += len;
            return Ok(p as *mut u8);
        }
        let size = align_up(len, HUGE_PMD);
        let mut c = new_chunk(size)?;
        c.used = len;
        c.live = len;
        let p = c.map.as_ptr();
        self.chunks.push(c);
        Ok(p)
    }

    /// Hugepages a call to `alloc(len)` would add.
    pub fn hugepages_needed(&self, len: usize) -> u64 {
        let len = align_up(len.max(1), 4096);
        if self.chunks.iter().any(|c| c.used + len <= c.map.len() || c.free.iter().any(|&(_, l)| l >= len)) {
            return 0;
        }
        (align_up(len, HUGE_PMD) / HUGE_PMD) as u64
    }

    /// Give back a block from [`HugeArena::alloc`] (`len` as passed to it). Returns the
    /// hugepages unmapped because their chunk became empty (to return to a budget).
    pub fn free(&mut self, ptr: *mut u8, len: usize) -> Result<u64> {
        let (addr, len) = (ptr as usize, align_up(len.max(1), 4096));
        let i = self
            .chunks
            .iter()
            .position(|c| addr >= c.map.addr() && addr + len <= c.map.addr() + c.used)
            .ok_or_else(|| Error::Invalid(format!("{addr:#x}+{len:#x} is not a block of this arena")))?;
        let c = &mut self.chunks[i];
        let off = addr - c.map.addr();
        if !off.is_multiple_of(4096) || len > c.live || c.free.iter().any(|&(o, l)| off < o + l && o < off + len) {
            return Err(Error::Invalid(format!("{addr:#x}+{len:#x} is not an allocated block (double free?)")));
        }
        c.give_back(off, len);
        if c.live == 0 {
            let c = self.chunks.remove(i);
            return Ok((c.map.len() / HUGE_PMD) as u64);
        }
        Ok(0)
    }

    /// Bytes handed out and not freed.
    pub fn live_bytes(&self) -> u64 {
        self.chunks.iter().map(|c| c.live as u64).sum()
    }

    /// Bytes of memory held.
    pub fn resident_bytes(&self) -> u64 {
        self.chunks.iter().map(|c| c.file.metadata().map(|m| m.blocks() * 512).unwrap_or(0)).sum()
    }

    /// Hugepages mapped.
    pub fn hugepages(&self) -> u64 {
        self.chunks.iter().map(|c| (c.map.len() / HUGE_PMD) as u64).sum()
    }

    /// Whether `addr` lies in the arena.
    pub fn contains(&self, addr: usize) -> bool {
        self.chunks.iter().any(|c| addr >= c.map.addr() && addr < c.map.addr() + c.map.len())
    }

    /// The backings of the chunks, in order.
    pub fn backings(&self) -> Vec<Backing> {
        self.chunks.iter().map(|c| c.backing).collect()
    }

    /// Start address and length of every chunk.
    pub fn chunks(&self) -> Vec<(usize, usize)> {
        self.chunks.iter().map(|c| (c.map.addr(), c.map.len())).collect()
    }
}

fn new_chunk(size: usize) -> Result<Chunk> {
    let pages = (size / HUGE_PMD) as u64;
    let pool_free =
        HugetlbPool::read(HUGE_PMD as u64).map(|p| p.free_hugepages.saturating_sub(p.resv_hugepages)).unwrap_or(0);
    if pool_free >= pages {
        if let Ok(c) = hugetlb_chunk(size) {
            return Ok(c);
        }
    }
    let fd = mem::memfd_create("pagewise-hps-compact", None)?;
    mem::ftruncate(&fd, size as u64)?;
    let map = Mapping::of_fd(&fd, size, 0, &MapOptions { shared: true, align: Some(HUGE_PMD), ..Default::default() })?;
    map.advise(mem::Advice::PopulateWrite)?;
    for off in (0..size).step_by(HUGE_PMD) {
        mem::madvise(map.addr() + off, HUGE_PMD, mem::Advice::Collapse).map_err(|e| Error::Collapse(Box::new(e)))?;
    }
    Ok(Chunk { file: File::from(fd), map, used: 0, live: 0, free: Vec::new(), backing: Backing::CollapsedMemfd })
}

fn hugetlb_chunk(size: usize) -> Result<Chunk> {
    let fd = mem::memfd_create("pagewise-hps-compact", Some(HUGE_PMD))?;
    mem::ftruncate(&fd, size as u64)?;
    let map = Mapping::of_fd(
        &fd,
        size,
        0,
        &MapOptions { shared: true, populate: true, hugetlb: Some(HUGE_PMD), ..Default::default() },
    )?;
    Ok(Chunk { file: File::from(fd), map, used: 0, live: 0, free: Vec::new(), backing: Backing::Hugetlb })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn freed_blocks_are_reused_and_empty_chunks_unmapped() {
        let mut a = HugeArena::new();
        let p: Vec<*mut u8> = (0..4).map(|_| a.alloc(MIB).unwrap()).collect();
        assert_eq!(a.hugepages(), 2);
        assert_eq!(a.live_bytes(), 4 << 20);
        // A freed block is handed out again before any new memory.
        assert_eq!(a.free(p[1], MIB).unwrap(), 0);
        assert_eq!(a.hugepages_needed(MIB), 0);
        assert_eq!(a.alloc(MIB).unwrap(), p[1]);
        // Freeing a whole chunk unmaps it: a drifting user does not grow the arena.
        assert_eq!(a.free(p[2], MIB).unwrap(), 0);
        assert_eq!(a.free(p[3], MIB).unwrap(), 1);
        assert_eq!(a.hugepages(), 1);
        for _ in 0..20 {
            let q = a.alloc(MIB).unwrap();
            assert_eq!(a.hugepages(), 2);
            a.free(q, MIB).unwrap();
        }
        assert_eq!(a.hugepages(), 1);
        // Double frees and foreign pointers are refused.
        assert!(a.free(p[2], MIB).is_err());
        a.free(p[0], MIB).unwrap();
        assert!(a.free(p[0], MIB).is_err());
        let mut x = 0u8;
        assert!(a.free(&mut x, MIB).is_err());
    }

    #[test]
    fn small_blocks_coalesce() {
        let mut a = HugeArena::new();
        let b: Vec<*mut u8> = (0..8).map(|_| a.alloc(4096).unwrap()).collect();
        let keep = a.alloc(4096).unwrap();
        for &p in b.iter().rev() {
            a.free(p, 4096).unwrap();
        }
        // The eight freed pages merged into one block that a 32 KiB request reuses.
        assert_eq!(a.alloc(8 * 4096).unwrap(), b[0]);
        assert_eq!(a.hugepages(), 1);
        let _ = keep;
    }
}
