//! The C ABI of the hp_alloc arena (`include/pagewise/hp_alloc.h`) and its JNI entry points
//! (`dev.pagewise.hugepage.HpAlloc` in java/).
//!
//! One arena per process, created by the first call with [`HpConfig::from_env`]
//! (`PAGEWISE_HP_BACKING`, `PAGEWISE_HP_SEGMENT_MB`, `PAGEWISE_HP_RETAIN_MB`). `hp_alloc`
//! returns NULL and sets errno on failure; the other functions return 0 or a negative errno.
//! No function unwinds into C or Java: a Rust panic becomes EIO.
//!
//! The JNI functions take and return plain integers (addresses as `jlong`), so they need
//! neither the JNIEnv nor JNI headers; the Java side wraps addresses in DirectByteBuffers.

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

use pagewise_kernel::mem::{align_down, align_up, madvise, Advice, HUGE_PMD};

use crate::hp_alloc::{HpArena, HpConfig, HpStats};

/// `struct hp_stats`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct HpStatsC {
    pub requested_bytes: u64,
    pub allocated_bytes: u64,
    pub live_allocations: u64,
    pub mapped_bytes: u64,
    pub recycled_bytes: u64,
    pub fresh_bytes: u64,
    pub hugepage_bytes: u64,
    pub rss_bytes: u64,
    pub collapse_failures: u64,
    /// HP_BACKING_NONE 0, HP_BACKING_THP 1, HP_BACKING_COLLAPSE 2, HP_BACKING_HUGETLB 3.
    pub backing: u32,
    pub reserved: u32,
}

impl HpStatsC {
    fn from(s: &HpStats, backing: u32) -> Self {
        HpStatsC {
            requested_bytes: s.requested_bytes,
            allocated_bytes: s.allocated_bytes,
            live_allocations: s.live_allocations,
            mapped_bytes: s.mapped_bytes,
            recycled_bytes: s.recycled_bytes,
            fresh_bytes: s.fresh_bytes,
            hugepage_bytes: s.hugepage_bytes,
            rss_bytes: s.rss_bytes,
            collapse_failures: s.collapse_failures,
            backing,
            reserved: 0,
        }
    }
}

static ARENA: OnceLock<Result<HpArena, i32>> = OnceLock::new();

/// The process's arena, or the errno of why it could not be made.
pub fn arena() -> Result<&'static HpArena, i32> {
    ARENA.get_or_init(|| HpConfig::from_env().and_then(HpArena::new).map_err(|e| e.errno())).as_ref().map_err(|&e| e)
}

fn guarded(f: impl FnOnce() -> i64) -> i64 {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(-(libc::EIO as i64))
}

fn set_errno(e: i32) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// Allocate `size` bytes on hugepage-backed memory; -errno on failure.
fn alloc_raw(size: usize) -> i64 {
    guarded(|| match arena() {
        Ok(a) => match a.alloc(size) {
            Ok(p) => p as i64,
            Err(e) => -(e.errno() as i64),
        },
        Err(e) => -(e as i64),
    })
}

fn free_raw(ptr: usize) -> i64 {
    guarded(|| match arena() {
        Ok(a) => match a.free(ptr as *mut u8) {
            Ok(()) => 0,
            Err(e) => -(e.errno() as i64),
        },
        Err(e) => -(e as i64),
    })
}

fn stats_raw(out: *mut HpStatsC) -> i64 {
    if out.is_null() {
        return -(libc::EINVAL as i64);
    }
    guarded(|| match arena() {
        Ok(a) => match a.stats() {
            Ok(s) => {
                // SAFETY: the caller guarantees `out` points to a writable struct hp_stats.
                unsafe { out.write(HpStatsC::from(&s, a.backing().raw())) };
                0
            }
            Err(e) => -(e.errno() as i64),
        },
        Err(e) => -(e as i64),
    })
}

/// `hp_alloc`: `size` bytes on hugepage-backed memory (see hp_alloc.h for the alignment).
/// Returns NULL and sets errno (EINVAL for 0 or absurd sizes, ENOMEM) on failure.
#[no_mangle]
pub extern "C" fn hp_alloc(size: usize) -> *mut c_void {
    let r = alloc_raw(size);
    if r < 0 {
        set_errno(-r as i32);
        std::ptr::null_mut()
    } else {
        r as usize as *mut c_void
    }
}

/// `hp_free`: return memory from `hp_alloc`. NULL is a no-op; a pointer hp_alloc did not
/// return (or one already freed) gives -EINVAL and changes nothing.
#[no_mangle]
pub extern "C" fn hp_free(ptr: *mut c_void) -> c_int {
    if ptr.is_null() {
        return 0;
    }
    free_raw(ptr as usize) as c_int
}

/// `hp_stats`: fill `out`, reading /proc/self/smaps for the hugepage and resident bytes.
///
/// # Safety
/// `out` is NULL (rejected with -EINVAL) or points to a writable `struct hp_stats`.
#[no_mangle]
pub unsafe extern "C" fn hp_stats(out: *mut HpStatsC) -> c_int {
    stats_raw(out) as c_int
}

/// JNI: `static native long alloc0(long size)` of `dev.pagewise.hugepage.HpAlloc`; the address,
/// or -errno.
#[no_mangle]
pub extern "C" fn Java_dev_pagewise_hugepage_HpAlloc_alloc0(_env: *mut c_void, _cls: *mut c_void, size: i64) -> i64 {
    if size <= 0 {
        return -(libc::EINVAL as i64);
    }
    alloc_raw(size as usize)
}

/// JNI: `static native int free0(long addr)`; 0 or -errno.
#[no_mangle]
pub extern "C" fn Java_dev_pagewise_hugepage_HpAlloc_free0(_env: *mut c_void, _cls: *mut c_void, addr: i64) -> i32 {
    if addr <= 0 {
        return -libc::EINVAL;
    }
    free_raw(addr as usize) as i32
}

/// JNI: `static native int stats0(long outAddr)`: writes a `struct hp_stats` at `outAddr` (the
/// address of a direct buffer of at least `sizeof(struct hp_stats)` bytes); 0 or -errno.
#[no_mangle]
pub extern "C" fn Java_dev_pagewise_hugepage_HpAlloc_stats0(_env: *mut c_void, _cls: *mut c_void, out: i64) -> i32 {
    if out <= 0 || !(out as usize).is_multiple_of(std::mem::align_of::<HpStatsC>()) {
        return -libc::EINVAL;
    }
    stats_raw(out as usize as *mut HpStatsC) as i32
}

/// JNI: `static native long adviseHuge0(long addr, long len)`: MADV_HUGEPAGE on the whole
/// 2 MiB regions inside `[addr, addr+len)` (memory not from the arena: the scanning baseline of
/// the paper, which advises cached buffers after the fact and leaves promotion to khugepaged).
/// Returns the bytes advised (0 when no whole region fits), or -errno.
#[no_mangle]
pub extern "C" fn Java_dev_pagewise_hugepage_HpAlloc_adviseHuge0(
    _env: *mut c_void,
    _cls: *mut c_void,
    addr: i64,
    len: i64,
) -> i64 {
    if addr <= 0 || len <= 0 {
        return -(libc::EINVAL as i64);
    }
    let start = align_up(addr as usize, HUGE_PMD);
    let end = align_down((addr as usize).saturating_add(len as usize), HUGE_PMD);
    if end <= start {
        return 0;
    }
    guarded(|| match madvise(start, end - start, Advice::HugePage) {
        Ok(()) => (end - start) as i64,
        Err(e) => -(e.errno().unwrap_or(libc::EINVAL) as i64),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_abi_allocates_frees_and_rejects_bad_pointers() {
        let p = hp_alloc(3 << 20);
        assert!(!p.is_null());
        // SAFETY: 3 MiB just allocated.
        unsafe { std::ptr::write_bytes(p as *mut u8, 7, 3 << 20) };
        let mut s = HpStatsC::default();
        // SAFETY: s is a writable hp_stats.
        assert_eq!(unsafe { hp_stats(&mut s) }, 0);
        assert!(s.requested_bytes >= 3 << 20);
        assert!(s.rss_bytes >= 3 << 20);
        assert_eq!(hp_free(p), 0);
        assert_eq!(hp_free(p), -libc::EINVAL);
        assert!(hp_alloc(0).is_null());
        // SAFETY: NULL is rejected.
        assert_eq!(unsafe { hp_stats(std::ptr::null_mut()) }, -libc::EINVAL);
        assert_eq!(Java_dev_pagewise_hugepage_HpAlloc_alloc0(std::ptr::null_mut(), std::ptr::null_mut(), -5), -22);
        let a = Java_dev_pagewise_hugepage_HpAlloc_alloc0(std::ptr::null_mut(), std::ptr::null_mut(), 1000);
        assert!(a > 0);
        assert_eq!(Java_dev_pagewise_hugepage_HpAlloc_free0(std::ptr::null_mut(), std::ptr::null_mut(), a), 0);
    }

    #[test]
    fn advise_covers_only_whole_regions_inside() {
        let n = std::ptr::null_mut();
        let m = pagewise_kernel::mem::Mapping::anonymous(
            6 << 20,
            &pagewise_kernel::mem::MapOptions { align: Some(HUGE_PMD), ..Default::default() },
        )
        .unwrap();
        let a = m.addr() as i64;
        assert_eq!(Java_dev_pagewise_hugepage_HpAlloc_adviseHuge0(n, n, a + 4096, (4 << 20) + 8192), 2 << 20);
        assert_eq!(Java_dev_pagewise_hugepage_HpAlloc_adviseHuge0(n, n, a, 6 << 20), 6 << 20);
        assert_eq!(Java_dev_pagewise_hugepage_HpAlloc_adviseHuge0(n, n, a + 16, 1 << 20), 0);
        assert_eq!(Java_dev_pagewise_hugepage_HpAlloc_adviseHuge0(n, n, -1, 10), -(libc::EINVAL as i64));
    }
}
