//! libpagewise: one shared and one static library carrying the C ABI of every Pagewise
//! system. Each system keeps its `extern "C"` functions next to its Rust API (a `capi` module
//! in its own crate); this crate links them into `libpagewise.so` / `libpagewise.a`, and
//! `include/pagewise.h` declares them.
//!
//! Convention of the ABI: functions return 0 (or a count) on success and a negative errno on
//! failure, and never abort the calling program.

/// DLM: `dlm_*` (include/pagewise/dlm.h).
pub use pagewise_dlm::capi as dlm;
pub use pagewise_hugepage::capi as hps;
/// hp_alloc: `hp_alloc`/`hp_free`/`hp_stats` (include/pagewise/hp_alloc.h) and its JNI functions.
pub use pagewise_hugepage::hp_alloc_capi as hp_alloc;
pub use pagewise_reclaim::capi as reclaim;

/// Every allocation of libpagewise comes from glibc's allocator, called by its own names
/// (`__libc_malloc`...), never through the `malloc` symbol: under the preload shim `malloc`
/// may be the program's own allocator (jemalloc, tcmalloc), which must not be entered again
/// from inside the mmap it is making, nor be handed a pointer another thread of the runtime
/// allocated elsewhere (preload/shim.c: one owner per pointer).
mod glibc_allocator {
    use std::alloc::{GlobalAlloc, Layout};
    use std::ffi::c_void;

    extern "C" {
        fn __libc_malloc(size: usize) -> *mut c_void;
        fn __libc_calloc(n: usize, size: usize) -> *mut c_void;
        fn __libc_realloc(p: *mut c_void, size: usize) -> *mut c_void;
        fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
        fn __libc_free(p: *mut c_void);
    }

    /// What glibc's malloc guarantees without asking (2 × size_t on x86-64).
    const MALLOC_ALIGN: usize = 16;

    struct Glibc;

    // SAFETY: each function forwards to glibc's allocator, which returns memory aligned to
    // MALLOC_ALIGN (or to `align` with memalign) or null, and frees what it returned.
    unsafe impl GlobalAlloc for Glibc {
        unsafe fn alloc(&self, l: Layout) -> *mut u8 {
            // SAFETY: plain calls into glibc's allocator.
            unsafe {
                if l.align() <= MALLOC_ALIGN {
                    __libc_malloc(l.size()) as *mut u8
                } else {
                    __libc_memalign(l.align(), l.size()) as *mut u8
                }
            }
        }

        unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
            if l.align() <= MALLOC_ALIGN {
                // SAFETY: a plain call into glibc's allocator.
                return unsafe { __libc_calloc(1, l.size()) as *mut u8 };
            }
            // SAFETY: alloc's contract is ours; the result, if not null, has l.size() bytes.
            let p = unsafe { self.alloc(l) };
            if !p.is_null() {
                // SAFETY: see above.
                unsafe { std::ptr::write_bytes(p, 0, l.size()) };
            }
            p
        }

        unsafe fn dealloc(&self, p: *mut u8, _l: Layout) {
            // SAFETY: p came from this allocator (GlobalAlloc's contract).
            unsafe { __libc_free(p as *mut c_void) }
        }

        unsafe fn realloc(&self, p: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
            if l.align() <= MALLOC_ALIGN {
                // SAFETY: p came from __libc_malloc/calloc (alignment within MALLOC_ALIGN).
                return unsafe { __libc_realloc(p as *mut c_void, new_size) as *mut u8 };
            }
            // SAFETY: GlobalAlloc's contract; new layout valid per realloc's contract.
            unsafe {
                let q = self.alloc(Layout::from_size_align_unchecked(new_size, l.align()));
                if !q.is_null() {
                    std::ptr::copy_nonoverlapping(p, q, l.size().min(new_size));
                    self.dealloc(p, l);
                }
                q
            }
        }
    }

    #[global_allocator]
    static GLOBAL: Glibc = Glibc;
}
