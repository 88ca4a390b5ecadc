//! The write-tracking backend: userfaultfd write-protection resolved by the kernel itself
//! (UFFD_FEATURE_WP_ASYNC, Linux 6.7) and read back with PAGEMAP_SCAN.
//!
//! A period asks PAGEMAP_SCAN for the pages written since the last period (`PAGE_IS_WRITTEN`)
//! and write-protects them again in the same ioctl (PM_SCAN_WP_MATCHING). The first write to
//! a protected page is resolved inside the kernel (no message, no signal, no thread), so the
//! application pays almost nothing — but only *writes* are seen, never reads. That makes it the
//! cheap choice for write-heavy memory and useless for read-mostly data; the minor-fault
//! backend ([`crate::MinorTracker`]) sees both. It works on any memory of this process
//! (anonymous or shmem), not only on a [`crate::TrackedArena`]. Soft-dirty would do the same
//! for another process, but this kernel is built without CONFIG_MEM_SOFT_DIRTY, so it is not
//! built here.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use pagewise_kernel::pagemap_scan::{category, PagemapScanner, ScanQuery};
use pagewise_kernel::procfs::Pid;
use pagewise_kernel::uffd::{feature, RegisterMode, Uffd, UffdBuilder};

use crate::table::Table;
use crate::{Error, Result, PAGE};

struct Range {
    start: usize,
    len: usize,
    acs: Table<AtomicU32>,
}

/// Per-page write counts (periods in which the page was written).
pub struct WriteTracker {
    uffd: Uffd,
    scanner: PagemapScanner,
    ranges: Mutex<Vec<Range>>,
}

impl WriteTracker {
    /// Needs WP_ASYNC and WP_UNPOPULATED (so pages never touched are protected too) and, for
    /// shmem, WP_HUGETLBFS_SHMEM.
    pub fn new() -> Result<Self> {
        let uffd = UffdBuilder::new()
            .require(feature::WP_ASYNC | feature::WP_UNPOPULATED | feature::WP_HUGETLBFS_SHMEM)
            .open()?;
        let scanner = PagemapScanner::open(Pid::SelfProcess)?;
        Ok(WriteTracker { uffd, scanner, ranges: Mutex::new(Vec::new()) })
    }

    /// Track writes to `[start, start+len)` from now on.
    pub fn track(&self, start: usize, len: usize) -> Result<()> {
        if len == 0 || !start.is_multiple_of(PAGE) || !len.is_multiple_of(PAGE) {
            return Err(Error::Kernel(pagewise_kernel::Error::Invalid(format!(
                "tracked range {start:#x}+{len:#x} is not page aligned"
            ))));
        }
        self.uffd.register(start, len, RegisterMode { write_protect: true, ..Default::default() })?;
        // DONTWAKE together with WP is EINVAL (fs/userfaultfd.c), so wake.
        self.uffd.write_protect(start, len, true, true)?;
        let acs = Table::zeroed(len / PAGE)?;
        self.ranges.lock().expect("ranges lock").push(Range { start, len, acs });
        Ok(())
    }

    /// One period: count the pages written since the last one and protect them again.
    /// Returns the number of written pages.
    pub fn run_period(&self) -> Result<usize> {
        let q = ScanQuery { required: category::WRITTEN, write_protect: true, ..Default::default() };
        let mut written = 0;
        for r in self.ranges.lock().expect("ranges lock").iter() {
            for region in self.scanner.scan_all(r.start, r.start + r.len, &q)? {
                for a in (region.start as usize..region.end as usize).step_by(PAGE) {
                    r.acs[(a - r.start) / PAGE].fetch_add(1, Ordering::Relaxed);
                    written += 1;
                }
            }
        }
        Ok(written)
    }

    /// `(start, counts)` of every tracked range.
    pub fn counts(&self) -> Vec<(usize, Vec<u32>)> {
        self.ranges
            .lock()
            .expect("ranges lock")
            .iter()
            .map(|r| (r.start, r.acs.iter().map(|a| a.load(Ordering::Relaxed)).collect()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagewise_kernel::mem::{MapOptions, Mapping};

    #[test]
    fn counts_writes_and_not_reads() {
        let t = match WriteTracker::new() {
            Ok(t) => t,
            Err(e) => {
                pagewise_kernel::testing::skip(format!("userfaultfd WP_ASYNC unavailable: {e}"));
                return;
            }
        };
        let m = Mapping::anonymous(64 * PAGE, &MapOptions::default()).unwrap();
        // Pages 0..32 populated before tracking, the rest never touched.
        for p in 0..32 {
            // SAFETY: our own mapping.
            unsafe { ((m.addr() + p * PAGE) as *mut u64).write(1) };
        }
        t.track(m.addr(), m.len()).unwrap();
        assert_eq!(t.run_period().unwrap(), 0);
        for p in [1usize, 5, 40] {
            // SAFETY: as above; writes to a protected page are resolved by the kernel.
            unsafe { std::ptr::write_volatile((m.addr() + p * PAGE) as *mut u64, 2) };
        }
        for p in [2usize, 6, 41] {
            // SAFETY: as above; reads are not counted.
            unsafe { std::ptr::read_volatile((m.addr() + p * PAGE) as *const u64) };
        }
        assert_eq!(t.run_period().unwrap(), 3);
        // Written again in the next period: page 5 only.
        // SAFETY: as above.
        unsafe { std::ptr::write_volatile((m.addr() + 5 * PAGE) as *mut u64, 3) };
        assert_eq!(t.run_period().unwrap(), 1);
        let counts = &t.counts()[0].1;
        let nonzero: Vec<(usize, u32)> = counts.iter().enumerate().filter(|c| *c.1 > 0).map(|(i, &c)| (i, c)).collect();
        assert_eq!(nonzero, vec![(1, 1), (5, 2), (40, 1)]);
        // SAFETY: as above; data intact.
        assert_eq!(unsafe { ((m.addr() + 5 * PAGE) as *const u64).read() }, 3);
    }
}
