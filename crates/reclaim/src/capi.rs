//! The C ABI of per-core reclaim (`include/pagewise/reclaim.h`): what a latency-critical
//! C application needs — the threshold arithmetic, setting its cores' thresholds in the running
//! reclaimd, and the paper's application habits (pin, mlockall) in one call.
//!
//! Convention: 0 on success, a negative errno on failure; never aborts the caller: a panic
//! inside is caught at the boundary and returned as -EIO (unwinding into C is undefined).

use std::path::Path;

use crate::policy::CoreThresholds;
use crate::tree::{self, TREE_DIR};

/// Watermarks in pages (`struct pw_reclaim_watermarks`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PwReclaimWatermarks {
    pub min: u64,
    pub low: u64,
    pub high: u64,
}

/// Run `f` at the C boundary: a panic becomes -EIO.
fn guarded(f: impl FnOnce() -> i32) -> i32 {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(-libc::EIO)
}

/// One core's thresholds in 4 KiB pages, over one pool of pages (a cgroup's headroom):
/// pages_min = min_free_kbytes / 4, low and high = floor(min × ratio / 100).
/// -EINVAL for a null `out`, ratios below 100 or above 100000, high below low, or
/// min_free_kbytes above INT_MAX (the kernel sysctl's type).
///
/// # Safety
/// `out` is null or points to a writable `struct pw_reclaim_watermarks`.
#[no_mangle]
pub unsafe extern "C" fn pw_reclaim_watermarks(
    min_free_kbytes: u64,
    low_ratio: u32,
    high_ratio: u32,
    out: *mut PwReclaimWatermarks,
) -> i32 {
    guarded(|| {
        let t = CoreThresholds { min_free_kbytes, pages_low_ratio: low_ratio, pages_high_ratio: high_ratio };
        if out.is_null() || t.validate().is_err() {
            return -libc::EINVAL;
        }
        let w = t.watermarks(12);
        // SAFETY: the caller passes a valid, writable struct (checked non-null above).
        unsafe { out.write(PwReclaimWatermarks { min: w.min, low: w.low, high: w.high }) };
        0
    })
}

/// Set `cpu`'s thresholds in the running reclaimd (its /run/pagewise/percpu_free_mem tree);
/// the global min_free_kbytes becomes the sum of the cores'. -ESRCH when no reclaimd runs,
/// -EINVAL for bad ratios or an unknown core, another negative errno if the write fails.
#[no_mangle]
pub extern "C" fn pw_reclaim_set_core(cpu: u32, min_free_kbytes: u64, low_ratio: u32, high_ratio: u32) -> i32 {
    guarded(|| set_core_in(Path::new(TREE_DIR), cpu as usize, min_free_kbytes, low_ratio, high_ratio))
}

fn set_core_in(dir: &Path, cpu: usize, min_free_kbytes: u64, low_ratio: u32, high_ratio: u32) -> i32 {
    let t = CoreThresholds { min_free_kbytes, pages_low_ratio: low_ratio, pages_high_ratio: high_ratio };
    if t.validate().is_err() {
        return -libc::EINVAL;
    }
    if tree::running_daemon(dir).is_none() {
        return -libc::ESRCH;
    }
    if !dir.join(format!("cpu{cpu}")).exists() {
        return -libc::EINVAL;
    }
    match tree::write_core(dir, cpu, &t) {
        Ok(()) => 0,
        Err(e) => -e.raw_os_error().unwrap_or(libc::EIO),
    }
}

/// The paper's application habits in one call: pin the calling thread to `cpu` and lock all
/// current and future memory (mlockall). -errno of whichever step failed.
#[no_mangle]
pub extern "C" fn pw_reclaim_protect_self(cpu: u32) -> i32 {
    guarded(|| {
        if let Err(e) = pagewise_kernel::cpu::pin_to(cpu as usize) {
            return -e.errno().unwrap_or(libc::EINVAL);
        }
        match pagewise_kernel::mem::mlockall_current_and_future() {
            Ok(()) => 0,
            Err(e) => -e.errno().unwrap_or(libc::EIO),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::PerCoreTable;

    #[test]
    fn watermarks_follow_the_policy() {
        let mut w = PwReclaimWatermarks::default();
        // SAFETY: a valid out pointer, or null (refused).
        unsafe {
            assert_eq!(pw_reclaim_watermarks(12288, 240, 400, &mut w), 0);
            assert_eq!(w, PwReclaimWatermarks { min: 3072, low: 7372, high: 12288 });
            assert_eq!(pw_reclaim_watermarks(12288, 90, 400, &mut w), -libc::EINVAL);
            assert_eq!(pw_reclaim_watermarks(12288, 240, 400, std::ptr::null_mut()), -libc::EINVAL);
            assert_eq!(pw_reclaim_watermarks(u64::MAX, 240, 400, &mut w), -libc::EINVAL);
            assert_eq!(pw_reclaim_watermarks(1 << 31, 240, 400, &mut w), -libc::EINVAL);
            assert_eq!(pw_reclaim_watermarks(12288, 240, u32::MAX, &mut w), -libc::EINVAL);
            assert_eq!(pw_reclaim_watermarks((1 << 31) - 1, 100_000, 100_000, &mut w), 0);
            assert_eq!(w.high, ((1u64 << 31) - 1) / 4 * 1000);
        }
    }

    #[test]
    fn set_core_needs_a_running_daemon_and_a_known_core() {
        let scratch = pagewise_kernel::private_dir::PrivateDir::new("capi-tree-test").unwrap();
        let dir = scratch.join("tree");
        assert_eq!(set_core_in(&dir, 0, 256, 3300, 4000), -libc::ESRCH);
        let t = tree::Tree::create(&dir, &PerCoreTable::uniform(&[0, 1].into(), 1000)).unwrap();
        assert_eq!(set_core_in(&dir, 1, 256, 3300, 4000), 0);
        assert_eq!(tree::read_tree(&dir).unwrap().0[&1].pages_low_ratio, 3300);
        assert_eq!(set_core_in(&dir, 7, 256, 3300, 4000), -libc::EINVAL);
        assert_eq!(set_core_in(&dir, 1, 256, 50, 4000), -libc::EINVAL);
        t.remove();
    }
}
