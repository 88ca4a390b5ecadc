//! PAGEMAP_SCAN (Linux 6.7): ask the kernel which pages of a range are written, present,
//! huge, ..., in one ioctl on /proc/PID/pagemap, optionally write-protecting them again
//! (with userfaultfd WP_ASYNC) in the same walk. Layouts from include/uapi/linux/fs.h.

use std::fs::File;
use std::os::fd::AsRawFd;

use crate::error::{Error, Result};
use crate::procfs::Pid;

/// Page categories (`PAGE_IS_*`).
pub mod category {
    pub const WPALLOWED: u64 = 1 << 0;
    pub const WRITTEN: u64 = 1 << 1;
    pub const FILE: u64 = 1 << 2;
    pub const PRESENT: u64 = 1 << 3;
    pub const SWAPPED: u64 = 1 << 4;
    pub const PFNZERO: u64 = 1 << 5;
    pub const HUGE: u64 = 1 << 6;
    pub const SOFT_DIRTY: u64 = 1 << 7;
}

/// Write-protect the matching pages during the walk.
pub const PM_SCAN_WP_MATCHING: u64 = 1 << 0;
/// Fail unless every page is in a WP_ASYNC userfaultfd range.
pub const PM_SCAN_CHECK_WPASYNC: u64 = 1 << 1;

#[repr(C)]
#[derive(Default)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

/// `_IOWR('f', 16, struct pm_scan_arg)`.
const PAGEMAP_SCAN: u64 = (3 << 30) | ((std::mem::size_of::<PmScanArg>() as u64) << 16) | (0x66 << 8) | 16;

/// A run of pages with the same categories.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageRegion {
    pub start: u64,
    pub end: u64,
    pub categories: u64,
}

/// What to ask for.
#[derive(Clone, Copy, Debug, Default)]
pub struct ScanQuery {
    /// Pages must have all of these categories (after inversion).
    pub required: u64,
    /// Categories whose meaning is inverted (e.g. "not present").
    pub inverted: u64,
    /// Pages must have at least one of these (0: no such condition).
    pub any_of: u64,
    /// Categories to report in each region.
    pub report: u64,
    /// Write-protect the matching pages (userfaultfd WP_ASYNC ranges).
    pub write_protect: bool,
    /// Stop after this many pages (0: no limit).
    pub max_pages: u64,
}

/// An open pagemap for PAGEMAP_SCAN.
pub struct PagemapScanner {
    file: File,
}

impl PagemapScanner {
    pub fn open(pid: Pid) -> Result<Self> {
        let path = match pid {
            Pid::SelfProcess => "/proc/self/pagemap".to_string(),
            Pid::Id(p) => format!("/proc/{p}/pagemap"),
        };
        let file = File::open(&path).map_err(|source| Error::Read { path: path.into(), source })?;
        Ok(PagemapScanner { file })
    }

    /// Scan `[start, end)`. Fills `out` and returns the regions found and where the walk
    /// stopped (call again from there when it stopped before `end`).
    pub fn scan(&self, start: usize, end: usize, query: &ScanQuery, out: &mut Vec<PageRegion>) -> Result<usize> {
        if out.capacity() == 0 {
            out.reserve(64);
        }
        out.clear();
        let mut arg = PmScanArg {
            size: std::mem::size_of::<PmScanArg>() as u64,
            flags: if query.write_protect { PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC } else { 0 },
            start: start as u64,
            end: end as u64,
            vec: out.as_mut_ptr() as u64,
            vec_len: out.capacity() as u64,
            max_pages: query.max_pages,
            category_inverted: query.inverted,
            category_mask: query.required,
            category_anyof_mask: query.any_of,
            return_mask: query.report | query.required | query.any_of,
            ..Default::default()
        };
        // SAFETY: arg points at out's spare capacity of vec_len regions; the kernel writes at
        // most that many and returns how many.
        let n = unsafe { libc::ioctl(self.file.as_raw_fd(), PAGEMAP_SCAN as _, &mut arg) };
        if n < 0 {
            return Err(Error::last_os("ioctl(PAGEMAP_SCAN)"));
        }
        // SAFETY: the kernel initialised the first n regions.
        unsafe { out.set_len(n as usize) };
        Ok(arg.walk_end as usize)
    }

    /// Every matching region of `[start, end)`, walking as many calls as needed.
    pub fn scan_all(&self, start: usize, end: usize, query: &ScanQuery) -> Result<Vec<PageRegion>> {
        let mut all = Vec::new();
        let mut batch = Vec::with_capacity(512);
        let mut at = start;
        while at < end {
            let walk_end = self.scan(at, end, query, &mut batch)?;
            all.extend_from_slice(&batch);
            if walk_end <= at {
                break;
            }
            at = walk_end;
        }
        Ok(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::Mapping;

    #[test]
    fn layout_matches_the_uapi() {
        assert_eq!(std::mem::size_of::<PmScanArg>(), 96);
        assert_eq!(std::mem::size_of::<PageRegion>(), 24);
    }

    #[test]
    fn finds_exactly_the_present_pages() {
        let scanner = match PagemapScanner::open(Pid::SelfProcess) {
            Ok(s) => s,
            Err(e) => return crate::testing::skip(format!("cannot open /proc/self/pagemap: {e}")),
        };
        let m = Mapping::anonymous(64 * 4096, &Default::default()).unwrap();
        for i in [3usize, 4, 40] {
            // SAFETY: our own mapping.
            unsafe { m.as_mut_slice()[i * 4096] = 1 };
        }
        let q = ScanQuery { required: category::PRESENT, ..Default::default() };
        let regions = match scanner.scan_all(m.addr(), m.addr() + m.len(), &q) {
            Ok(r) => r,
            Err(e) if e.errno() == Some(libc::ENOTTY) || e.errno() == Some(libc::EINVAL) => {
                crate::testing::skip(format!("PAGEMAP_SCAN unsupported: {e}"));
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let pages: Vec<usize> = regions
            .iter()
            .flat_map(|r| (r.start..r.end).step_by(4096).map(|a| (a as usize - m.addr()) / 4096))
            .collect();
        assert_eq!(pages, vec![3, 4, 40]);
    }
}
