//! The compaction target: hugepage-backed memory the application moves hot objects onto.
//!
//! Each chunk is one or more whole 2 MiB hugepages: from the hugetlb pool when it has free
//! pages (a memfd with MFD_HUGETLB: guaranteed hugepages, the paper's hugetlbfs), otherwise a
//! plain memfd populated and collapsed with MADV_COLLAPSE (ShmemPmdMapped). Memory is handed out
//! by a bump pointer in page-aligned blocks; the arena grows a chunk at a time and frees
//! everything when dropped (hot objects live as long as the application keeps them hot).

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
    used: usize,
    backing: Backing,
}

/// A growing hugepage-backed bump arena.
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
        if let Some(c) = self.chunks.last_mut() {
            if c.used + len <= c.map.len() {
                let p = c.map.addr() + c.used;
                c.used += len;
                return Ok(p as *mut u8);
            }
        }
        let size = align_up(len, HUGE_PMD);
        let mut c = new_chunk(size)?;
        c.used = len;
        let p = c.map.as_ptr();
        self.chunks.push(c);
        Ok(p)
    }

    /// Hugepages a call to `alloc(len)` would add.
    pub fn hugepages_needed(&self, len: usize) -> u64 {
        let len = align_up(len.max(1), 4096);
        match self.chunks.last() {
            Some(c) if c.used + len <= c.map.len() => 0,
            _ => (align_up(len, HUGE_PMD) / HUGE_PMD) as u64,
        }
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
    Ok(Chunk { file: File::from(fd), map, used: 0, backing: Backing::CollapsedMemfd })
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
    Ok(Chunk { file: File::from(fd), map, used: 0, backing: Backing::Hugetlb })
}
