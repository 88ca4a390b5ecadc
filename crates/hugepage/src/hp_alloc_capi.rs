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

/// Allocate `size` bytes and write the allocation's tag to `tag`; -errno on failure.
fn alloc_tagged_raw(size: usize, tag: &mut u64) -> i64 {
    guarded(|| match arena() {
        Ok(a) => match a.alloc_tagged(size) {
            Ok((p, t)) => {
                *tag = t;
                p as i64
            }
            Err(e) => -(e.errno() as i64),
        },
        Err(e) => -(e as i64),
    })
}

/// Free `ptr`: any allocation there (`tag` None), or only the one tagged `tag`.
fn free_raw(ptr: usize, tag: Option<u64>) -> i64 {
    guarded(|| match arena() {
        Ok(a) => match tag.map_or_else(|| a.free(ptr as *mut u8), |t| a.free_tagged(ptr as *mut u8, t)) {
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
    free_raw(ptr as usize, None) as c_int
}

/// `hp_alloc_tagged`: as `hp_alloc`, and the allocation's tag in `*tag` (never 0).
///
/// # Safety
/// `tag` is NULL (rejected with EINVAL) or points to a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn hp_alloc_tagged(size: usize, tag: *mut u64) -> *mut c_void {
    if tag.is_null() {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    let mut t = 0;
    let r = alloc_tagged_raw(size, &mut t);
    if r < 0 {
        set_errno(-r as i32);
        return std::ptr::null_mut();
    }
    // SAFETY: non-null and writable per the contract.
    unsafe { tag.write(t) };
    r as usize as *mut c_void
}

/// `hp_free_tagged`: free the allocation at `ptr` only if it is the one tagged `tag`. A stale
/// free (that block was freed and the address handed out again) gives -ESTALE and changes
/// nothing; NULL is a no-op.
#[no_mangle]
pub extern "C" fn hp_free_tagged(ptr: *mut c_void, tag: u64) -> c_int {
    if ptr.is_null() {
        return 0;
    }
    free_raw(ptr as usize, Some(tag)) as c_int
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

/// JNI: `static native long tag0(long addr)`: the tag of the live allocation at `addr` (taken
/// right after `alloc0`, while the caller alone holds the block), or -EINVAL.
#[no_mangle]
pub extern "C" fn Java_dev_pagewise_hugepage_HpAlloc_tag0(_env: *mut c_void, _cls: *mut c_void, addr: i64) -> i64 {
    if addr <= 0 {
        return -(libc::EINVAL as i64);
    }
    guarded(|| match arena() {
        Ok(a) => a.tag_of(addr as usize as *mut u8).map_or(-(libc::EINVAL as i64), |t| t as i64),
        Err(e) => -(e as i64),
    })
}

/// JNI: `static native int free0(long addr, long tag)`: free the allocation at `addr` only if
/// it is the one tagged `tag` (a stale free is -ESTALE and changes nothing); 0 or -errno.
#[no_mangle]
pub extern "C" fn Java_dev_pagewise_hugepage_HpAlloc_free0(
    _env: *mut c_void,
    _cls: *mut c_void,
    addr: i64,
    tag: i64,
) -> i32 {
    if addr <= 0 || tag <= 0 {
        return -libc::EINVAL;
    }
    free_raw(addr as usize, Some(tag as u64)) as i32
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
        let n = std::ptr::null_mut();
        let a = Java_dev_pagewise_hugepage_HpAlloc_alloc0(n, n, 1000);
        assert!(a > 0);
        let tag = Java_dev_pagewise_hugepage_HpAlloc_tag0(n, n, a);
        assert!(tag > 0);
        assert_eq!(Java_dev_pagewise_hugepage_HpAlloc_free0(n, n, a, tag + 1), -libc::ESTALE);
        assert_eq!(Java_dev_pagewise_hugepage_HpAlloc_free0(n, n, a, tag), 0);
        assert_eq!(Java_dev_pagewise_hugepage_HpAlloc_tag0(n, n, a), -(libc::EINVAL as i64));
        let mut t = 0u64;
        // SAFETY: t is a writable u64.
        let p = unsafe { hp_alloc_tagged(2 << 20, &mut t) };
        assert!(!p.is_null() && t > 0);
        assert_eq!(hp_free_tagged(p, t + 1), -libc::ESTALE);
        assert_eq!(hp_free_tagged(p, t), 0);
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
