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
        if g.is_some() {
            return -libc::EBUSY;
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
    guard(|| {
        if out.is_null() {
            return -libc::EINVAL;
        }
        let g = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
        let Some(d) = g.as_ref() else { return -libc::ENODEV };
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
    guard(|| {
        let g = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
        let Some(d) = g.as_ref() else { return -libc::ENODEV };
        d.free(ptr as *mut u8).map(|_| 0).unwrap_or_else(|e| e.errno())
    })
}

/// Change the set count (page size = base page × count).
#[no_mangle]
pub extern "C" fn dlm_set_count(count: c_uint) -> c_int {
    guard(|| {
        let g = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
        let Some(d) = g.as_ref() else { return -libc::ENODEV };
        d.set_count(count).map(|_| 0).unwrap_or_else(|e| e.errno())
    })
}

/// Fill `*out` with the runtime's counters.
///
/// # Safety
/// `out` points at a writable `struct dlm_stats`.
#[no_mangle]
pub unsafe extern "C" fn dlm_stats(out: *mut DlmStats) -> c_int {
    guard(|| {
        if out.is_null() {
            return -libc::EINVAL;
        }
        let g = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
        let Some(d) = g.as_ref() else { return -libc::ENODEV };
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
    guard(|| {
        let g = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
        let Some(d) = g.as_ref() else { return -libc::ENODEV };
        d.loop_start(loop_id).map(|_| 0).unwrap_or_else(|e| e.errno())
    })
}

/// End measuring loop `loop_id`: the tuner decides its unit size from now on. Returns the new
/// unit size in KiB (> 0) or a negative errno.
#[no_mangle]
pub extern "C" fn dlm_end(loop_id: u64) -> c_int {
    guard(|| {
        let g = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
        let Some(d) = g.as_ref() else { return -libc::ENODEV };
        match d.loop_end(loop_id) {
            Ok(dec) => (dec.new_size >> 10).min(c_int::MAX as usize) as c_int,
            Err(e) => e.errno(),
        }
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
        let Some(d) = g.as_ref() else { return -(libc::ENODEV as isize) };
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
    guard(|| {
        let g = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
        let Some(d) = g.as_ref() else { return -libc::ENODEV };
        d.write_decisions();
        0
    })
}
