//! The `dlm_*` C ABI (include/pagewise/dlm.h): one runtime per process, behind a global.
//! Functions return 0 (or a count) on success and a negative errno on failure; bad arguments
//! never abort the caller (panics are caught at the boundary). A memory server that fails while
//! a page is being served still stops the program, with a message (see the runtime).

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::Mutex;

use crate::config::{Config, FaultMode};
use crate::runtime::Dlm;

static RUNTIME: Mutex<Option<Dlm>> = Mutex::new(None);

/// `struct dlm_config`: zero fields take the defaults (see dlm.h).
#[repr(C)]
pub struct DlmConfig {
    pub servers: *const c_char,
    pub local_mem: usize,
    pub page_size: usize,
    pub max_set: c_uint,
    pub set_count: c_uint,
    pub fault_mode: c_int,
    pub readahead: c_int,
    /// The servers' shared secret; NULL: `PAGEWISE_DLM_SECRET`.
    pub secret: *const c_char,
    /// `"none"`, `"ec:K+M"` or `"copies:N"`; NULL: none.
    pub redundancy: *const c_char,
}

/// `struct dlm_stats`.
#[repr(C)]
#[derive(Default)]
pub struct DlmStats {
    pub mode: c_int,
    pub base_page: u64,
    pub set_count: u32,
    pub max_set: u32,
    pub local_limit: u64,
    pub resident_bytes: u64,
    pub peak_resident_bytes: u64,
    pub faults: u64,
    pub wp_faults: u64,
    pub fetched_units: u64,
    pub fetched_bytes: u64,
    pub readahead_units: u64,
    pub zero_units: u64,
    pub evictions: u64,
    pub writebacks: u64,
    pub writeback_bytes: u64,
}

fn mode_from_c(m: c_int) -> Option<FaultMode> {
    Some(match m {
        0 => FaultMode::Auto,
        1 => FaultMode::HandlerThread,
        2 => FaultMode::Sigbus,
        3 => FaultMode::Sigsegv,
        _ => return None,
    })
}

fn mode_to_c(m: &str) -> c_int {
    match m {
        "handler_thread" => 1,
        "sigbus" => 2,
        "sigsegv" => 3,
        _ => 0,
    }
}

fn guard(f: impl FnOnce() -> c_int) -> c_int {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(-libc::EFAULT)
}

/// Run `f` on this process's runtime: -ENODEV when none was started, -ECHILD in a child made
/// by fork(2) of the process that started it (its connections and areas are the parent's).
fn with_dlm(f: impl FnOnce(&Dlm) -> c_int) -> c_int {
    guard(|| {
        let g = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
        match g.as_ref() {
            None => -libc::ENODEV,
            Some(d) if !d.owned_here() => -libc::ECHILD,
            Some(d) => f(d),
        }
    })
}

fn config_from_c(cfg: &DlmConfig) -> Result<Config, c_int> {
    let mut c = Config::default();
    if cfg.servers.is_null() {
        return Err(-libc::EINVAL);
    }
    // SAFETY: the caller passes a NUL-terminated string (dlm.h).
    let servers = unsafe { CStr::from_ptr(cfg.servers) }.to_str().map_err(|_| -libc::EINVAL)?;
    c.servers = servers.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
    if cfg.local_mem != 0 {
        c.local_mem = cfg.local_mem;
    }
    if cfg.page_size != 0 {
        c.base_page = cfg.page_size;
    }
    if cfg.max_set != 0 {
        c.max_set = cfg.max_set;
        c.set_count = cfg.max_set;
    }
    if cfg.set_count != 0 {
        c.set_count = cfg.set_count;
    }
    c.fault_mode = mode_from_c(cfg.fault_mode).ok_or(-libc::EINVAL)?;
    if cfg.readahead >= 0 {
        c.readahead = cfg.readahead as usize;
    }
    if !cfg.secret.is_null() {
        // SAFETY: the caller passes NULL or a NUL-terminated string (dlm.h).
        let text = unsafe { CStr::from_ptr(cfg.secret) };
        c.secret = Some(crate::auth::Secret::new(text.to_bytes()).map_err(|e| e.errno())?);
    }
    if !cfg.redundancy.is_null() {
        // SAFETY: the caller passes NULL or a NUL-terminated string (dlm.h).
        let text = unsafe { CStr::from_ptr(cfg.redundancy) }.to_str().map_err(|_| -libc::EINVAL)?;
        c.redundancy = crate::redundancy::Redundancy::parse(text).map_err(|_| -libc::EINVAL)?;
    }
    c.validate().map_err(|e| e.errno())?;
    Ok(c)
}

/// Start the runtime from `cfg`, or from the PAGEWISE_DLM_* environment when `cfg` is NULL.
///
/// # Safety
/// `cfg` is NULL or points at a valid `struct dlm_config`.
#[no_mangle]
pub unsafe extern "C" fn dlm_init(cfg: *const DlmConfig) -> c_int {
    guard(|| {
        let config = if cfg.is_null() {
            match Config::from_env() {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("{e}");
                    return e.errno();
                }
            }
        } else {
            // SAFETY: non-null, valid per the contract.
            match config_from_c(unsafe { &*cfg }) {
                Ok(c) => c,
                Err(e) => return e,
            }
        };
        let mut g = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
        match g.as_ref() {
            // A child made by fork(2) may start a runtime of its own; its parent's is forgotten
            // untouched (`Dlm`'s drop in a child).
            Some(d) if !d.owned_here() => drop(g.take()),
            Some(_) => return -libc::EBUSY,
            None => {}
        }
        match Dlm::init(config) {
            Ok(d) => {
                *g = Some(d);
                0
            }
            Err(e) => {
                eprintln!("{e}");
                e.errno()
            }
        }
    })
}

/// Allocate `len` bytes of DLM memory into `*out`.
///
/// # Safety
/// `out` is a valid pointer to a `void *`.
#[no_mangle]
pub unsafe extern "C" fn dlm_alloc(len: usize, out: *mut *mut c_void) -> c_int {
    if out.is_null() {
        return -libc::EINVAL;
    }
    with_dlm(|d| {
        match d.alloc(len) {
            Ok(p) => {
                // SAFETY: out is valid per the contract.
                unsafe { *out = p as *mut c_void };
                0
            }
            Err(e) => e.errno(),
        }
    })
}

/// Free an area from `dlm_alloc`.
#[no_mangle]
pub extern "C" fn dlm_free(ptr: *mut c_void) -> c_int {
    with_dlm(|d| d.free(ptr as *mut u8).map(|_| 0).unwrap_or_else(|e| e.errno()))
}

/// Change the set count (page size = base page × count).
#[no_mangle]
pub extern "C" fn dlm_set_count(count: c_uint) -> c_int {
    with_dlm(|d| d.set_count(count).map(|_| 0).unwrap_or_else(|e| e.errno()))
}

/// Fill `*out` with the runtime's counters.
///
/// # Safety
/// `out` points at a writable `struct dlm_stats`.
#[no_mangle]
pub unsafe extern "C" fn dlm_stats(out: *mut DlmStats) -> c_int {
    if out.is_null() {
        return -libc::EINVAL;
    }
    with_dlm(|d| {
        let s = d.stats();
        let c = DlmStats {
            mode: mode_to_c(s.mode),
            base_page: s.base_page as u64,
            set_count: s.set_count,
            max_set: s.max_set,
            local_limit: s.local_limit as u64,
            resident_bytes: s.resident_bytes as u64,
            peak_resident_bytes: s.peak_resident_bytes as u64,
            faults: s.faults,
            wp_faults: s.wp_faults,
            fetched_units: s.fetched_units,
            fetched_bytes: s.fetched_bytes,
            readahead_units: s.readahead_units,
            zero_units: s.zero_units,
            evictions: s.evictions,
            writebacks: s.writebacks,
            writeback_bytes: s.writeback_bytes,
        };
        // SAFETY: out is valid per the contract.
        unsafe { out.write(c) };
        0
    })
}

/// Free every area and stop the runtime.
#[no_mangle]
pub extern "C" fn dlm_shutdown() -> c_int {
    guard(|| {
        let mut g = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
        match g.take() {
            Some(d) if !d.owned_here() => {
                // A child's copy of its parent's runtime: forgotten untouched.
                drop(d);
                -libc::ECHILD
            }
            Some(d) => {
                d.shutdown();
                0
            }
            None => -libc::ENODEV,
        }
    })
}

/// Begin measuring compute loop `loop_id` (its own unit size comes into force).
#[no_mangle]
pub extern "C" fn dlm_start(loop_id: u64) -> c_int {
    with_dlm(|d| d.loop_start(loop_id).map(|_| 0).unwrap_or_else(|e| e.errno()))
}

/// End measuring loop `loop_id`: the tuner decides its unit size from now on. Returns the new
/// unit size in KiB (> 0) or a negative errno.
#[no_mangle]
pub extern "C" fn dlm_end(loop_id: u64) -> c_int {
    with_dlm(|d| match d.loop_end(loop_id) {
        Ok(dec) => (dec.new_size >> 10).min(c_int::MAX as usize) as c_int,
        Err(e) => e.errno(),
    })
}

/// Write the tuner's decisions as JSON (NUL-terminated, truncated to `len`) into `buf`;
/// returns the full length without the NUL (call with len 0 to size the buffer).
///
/// # Safety
/// `buf` is NULL with `len` 0, or points at `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn dlm_decisions_json(buf: *mut c_char, len: usize) -> isize {
    let r = std::panic::catch_unwind(|| {
        let g = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
        let Some(d) = g.as_ref().filter(|d| d.owned_here()) else { return -(libc::ENODEV as isize) };
        let json = d.decisions_json();
        if !buf.is_null() && len > 0 {
            let n = json.len().min(len - 1);
            // SAFETY: buf has len bytes per the contract; n + 1 <= len.
            unsafe {
                std::ptr::copy_nonoverlapping(json.as_ptr(), buf as *mut u8, n);
                *buf.add(n) = 0;
            }
        }
        json.len() as isize
    });
    r.unwrap_or(-(libc::EFAULT as isize))
}

/// Make `[addr, addr + n)` DLM memory, n = `len` rounded down to whole largest units, replacing
/// what is mapped there (its content starts as zeros). Returns n or a negative errno.
///
/// # Safety
/// The caller owns `[addr, addr + len)`: nothing else uses or unmaps what is there now.
#[no_mangle]
pub unsafe extern "C" fn dlm_alloc_at(addr: *mut c_void, len: usize) -> isize {
    let r = std::panic::catch_unwind(|| {
        let g = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
        let Some(d) = g.as_ref() else { return -(libc::ENODEV as isize) };
        if !d.owned_here() {
            return -(libc::ECHILD as isize);
        }
        // SAFETY: forwarded contract.
        match unsafe { d.alloc_at(addr as usize, len) } {
            Ok(n) => n as isize,
            Err(e) => e.errno() as isize,
        }
    });
    r.unwrap_or(-(libc::EFAULT as isize))
}

/// The process is about to exit: write the tuner's decisions (PAGEWISE_DLM_DECISIONS). DLM
/// memory stays valid (other threads may still use it until the process ends).
#[no_mangle]
pub extern "C" fn dlm_finish() -> c_int {
    with_dlm(|d| {
        d.write_decisions();
        0
    })
}

/// Turn a `Result` of the range calls into the C convention.
fn status(r: Result<(), crate::DlmError>) -> c_int {
    r.map(|_| 0).unwrap_or_else(|e| e.errno())
}

/// `[addr, addr + len)` reads as zeros from now on (MADV_DONTNEED / MADV_FREE on DLM memory).
#[no_mangle]
pub extern "C" fn dlm_discard(addr: *mut c_void, len: usize) -> c_int {
    with_dlm(|d| status(d.discard(addr as usize, len)))
}

/// Unmap `[addr, addr + len)` (whole base pages) of DLM memory, as munmap(2) of part of an
/// area; an area of which nothing is left is freed.
#[no_mangle]
pub extern "C" fn dlm_unmap(addr: *mut c_void, len: usize) -> c_int {
    with_dlm(|d| status(d.unmap(addr as usize, len)))
}

/// As `dlm_unmap`, but the range stays mapped (plain memory, its pages dropped) for the caller
/// to map over it at once (MAP_FIXED), so that no other thread's mmap can take it in between.
#[no_mangle]
pub extern "C" fn dlm_forget(addr: *mut c_void, len: usize) -> c_int {
    with_dlm(|d| status(d.forget(addr as usize, len)))
}

/// `[addr, addr + len)`, rounded out to whole base pages, leaves DLM with its data: ordinary
/// private anonymous memory at the same address from now on.
#[no_mangle]
pub extern "C" fn dlm_detach(addr: *mut c_void, len: usize) -> c_int {
    with_dlm(|d| status(d.detach(addr as usize, len)))
}

/// Fetch `[addr, addr + len)` ahead of use (MADV_WILLNEED).
#[no_mangle]
pub extern "C" fn dlm_prefetch(addr: *mut c_void, len: usize) -> c_int {
    with_dlm(|d| status(d.prefetch(addr as usize, len)))
}

/// Which 4 KiB pages of `[addr, addr + len)` may hold data (`vec[i]` 1) and which read as
/// zeros for sure (0), one byte a page as mincore(2) gives (`dlm.h`); -EOPNOTSUPP when the
/// base page is larger than 4 KiB.
///
/// # Safety
/// `vec` points to at least `len / 4096` (rounded up) writable bytes.
#[no_mangle]
pub unsafe extern "C" fn dlm_holds_data(addr: *mut c_void, len: usize, vec: *mut u8) -> c_int {
    if vec.is_null() {
        return -libc::EINVAL;
    }
    with_dlm(|d| {
        if d.base_page() != 4096 {
            return -libc::EOPNOTSUPP;
        }
        let pages = len.div_ceil(4096);
        // SAFETY: the caller's buffer of at least that many bytes (dlm.h).
        let out = unsafe { std::slice::from_raw_parts_mut(vec, pages) };
        status(d.holds_data(addr as usize, len, out))
    })
}

/// Read-ahead of the areas overlapping `[addr, addr + len)`: 0 normal, 1 sequential (from the
/// first fault), 2 random (none) — MADV_NORMAL / MADV_SEQUENTIAL / MADV_RANDOM.
#[no_mangle]
pub extern "C" fn dlm_set_access(addr: *mut c_void, len: usize, access: c_int) -> c_int {
    let access = match access {
        0 => crate::Access::Normal,
        1 => crate::Access::Sequential,
        2 => crate::Access::Random,
        _ => return -libc::EINVAL,
    };
    with_dlm(|d| status(d.set_access(addr as usize, len, access)))
}
