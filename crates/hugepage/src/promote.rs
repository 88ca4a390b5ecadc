//! Promotion: MADV_COLLAPSE, synchronous.
//!
//! The paper advised MADV_HUGEPAGE and waited for khugepaged, which took 80–300 rounds of its
//! benchmark. MADV_COLLAPSE (Linux 6.1) collapses in the calling thread, on anonymous memory and
//! on shmem/memfd alike, regardless of the THP sysfs mode ("madvise" here), so a hot region is
//! PMD-mapped as soon as the decision is made. It can be slow when the kernel must compact to
//! find a free 2 MiB page; [`crate::policy::Backoff`] turns that latency (CPU time of the
//! collapsing thread, so preemption on a busy machine is not mistaken for it) into a pause.

use std::time::{Duration, Instant};

use pagewise_kernel::mem::{self, Advice, HUGE_PMD};

use crate::Result;

/// Collapse the 2 MiB region at `addr`; returns how long it took.
pub fn collapse(addr: usize) -> Result<Duration> {
    let t = Instant::now();
    mem::madvise(addr, HUGE_PMD, Advice::Collapse)?;
    Ok(t.elapsed())
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
