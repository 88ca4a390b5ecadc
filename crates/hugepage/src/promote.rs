//! Promotion: MADV_COLLAPSE, synchronous.
//!
//! The paper advised MADV_HUGEPAGE and waited for khugepaged, which took 80–300 rounds of its
//! benchmark. MADV_COLLAPSE (Linux 6.1) collapses in the calling thread, on anonymous memory and
//! on shmem/memfd alike, regardless of the THP sysfs mode ("madvise" here), so a hot region is
//! PMD-mapped as soon as the decision is made. It can be slow when the kernel must compact to
//! find a free 2 MiB page; [`crate::policy::Backoff`] turns that latency (CPU time of the
//! collapsing thread, so preemption on a busy machine is not mistaken for it) into a pause.

use std::time::{Duration, Instant};

use pagewise_kernel::mem::{self, Advice, MapOptions, Mapping, HUGE_PMD};

use crate::Result;

/// Touch a hugepage of our own and free it, so that the next collapse on this CPU copies into
/// memory the host backs. MADV_COLLAPSE unmaps and locks the region's pages for as long as it
/// copies, and the program waits on any it touches meanwhile; the copy is what pays for memory
/// the host has taken back (`pagewise_kernel::page_reporting`), one host fault at a time. A
/// hugepage freed a moment before is reused by the next allocation of one on the same CPU
/// (order-9 pages are kept in the per-CPU free lists), so the faults happen here, where no one
/// waits: on this VM kind a cold collapse took 2.3–4.7 ms a region, and 0.53 ms after this
/// (which took 4.9–5.7 ms itself), measured region by region over 128 MiB. Best effort: a
/// failure only means the collapse pays as before.
pub fn warm_hugepage() {
    let opts = MapOptions { align: Some(HUGE_PMD), ..Default::default() };
    if let Ok(m) = Mapping::anonymous(HUGE_PMD, &opts) {
        if m.advise(Advice::HugePage).is_ok() {
            let _ = m.advise(Advice::PopulateWrite);
        }
    }
}

/// Collapse the 2 MiB region at `addr`; returns how long it took.
pub fn collapse(addr: usize) -> Result<Duration> {
    let t = Instant::now();
    mem::madvise(addr, HUGE_PMD, Advice::Collapse)?;
    Ok(t.elapsed())
}

/// Pages of the 2 MiB region at `addr` that hold data (mincore(2): for the shared memfd
/// arenas, pages in the file, mapped or not; a page armed for tracking is still there), i.e.
/// what a collapse would not have to allocate ([`crate::policy::filled_enough`]).
pub fn resident_pages(addr: usize) -> Result<u32> {
    let mut present = [0u8; HUGE_PMD / 4096];
    mem::mincore(addr, HUGE_PMD, &mut present)?;
    Ok(present.iter().filter(|b| *b & 1 != 0).count() as u32)
}

/// PMD-mapped bytes of the VMA containing `addr`, from /proc/self/smaps: `ShmemPmdMapped` plus
/// `AnonHugePages` plus hugetlb.
pub fn pmd_mapped_bytes(addr: usize) -> Result<u64> {
    let maps = pagewise_kernel::procfs::read_smaps(pagewise_kernel::procfs::Pid::SelfProcess)?;
    let mut total = 0u64;
    for m in maps.0.iter().filter(|m| m.address.0 as usize <= addr && addr < m.address.1 as usize) {
        let get = |k: &str| m.extension.map.get(k).copied().unwrap_or(0);
        total += get("ShmemPmdMapped") + get("AnonHugePages") + get("Shared_Hugetlb") + get("Private_Hugetlb");
    }
    Ok(total)
}
