//! The launcher's key-value exchange (PMIx), through `pmix/pmix_exchange.c`: a shared object
//! carried in this binary, written to a file and loaded with dlopen(3) when `pagewise mpi`
//! starts, so only `pagewise mpi` needs libpmix.so.2 and no other subcommand does.

use std::ffi::{c_char, c_int, c_void, CStr, CString};

use anyhow::{anyhow, bail, Context, Result};

use crate::run::EmbeddedFile;

/// pmix/pmix_exchange.c, compiled by build.rs.
static PMIX_EXCHANGE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libpagewise_pmix.so"));

/// PMIX_ERR_NOT_FOUND (pmix_common.h).
const NOT_FOUND: c_int = -46;
/// PMIX_ERR_BAD_PARAM (pmix_common.h): here, the buffer was too small.
const BAD_PARAM: c_int = -27;

type InitFn = unsafe extern "C" fn(*mut u32, *mut u32) -> c_int;
type LocalSizeFn = unsafe extern "C" fn(*mut u32) -> c_int;
type PutFn = unsafe extern "C" fn(*const c_char, *const c_char) -> c_int;
type FenceFn = unsafe extern "C" fn() -> c_int;
type GetFn = unsafe extern "C" fn(u32, *const c_char, *mut c_char, usize, *mut usize) -> c_int;
type FinalizeFn = unsafe extern "C" fn() -> c_int;
type ErrorFn = unsafe extern "C" fn(c_int) -> *const c_char;

/// A connection to the launcher's PMIx server. The library stays loaded for the life of the
/// process (PMIx runs threads of its own), so the functions are plain pointers and the
/// exchange may be used from any thread (PMIx is thread-safe).
pub struct Pmix {
    local_size: LocalSizeFn,
    put: PutFn,
    fence: FenceFn,
    get: GetFn,
    finalize: FinalizeFn,
    error: ErrorFn,
    /// This process's rank in the job.
    pub rank: u32,
    /// Processes in the job.
    pub size: u32,
}

fn dlerror_text() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated message valid until the next dl* call.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: as above.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// Look `name` up in `handle`.
///
/// # Safety
/// `T` must be the function pointer type of the C function `name` in pmix_exchange.c.
unsafe fn symbol<T: Copy>(handle: *mut c_void, name: &str) -> Result<T> {
    let c = CString::new(name).expect("no NUL in symbol names");
    // SAFETY: handle came from dlopen and is never closed.
    let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
    if p.is_null() {
        bail!("the PMIx exchange has no symbol {name}: {}", dlerror_text());
    }
    assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: the caller names the right function type; both are pointer-sized.
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
}

impl Pmix {
    /// Load the exchange and connect to the launcher's PMIx server.
    pub fn init() -> Result<Self> {
        let file = EmbeddedFile::write(PMIX_EXCHANGE, "pmix_exchange.so")?;
        let path = CString::new(file.path.as_os_str().as_encoded_bytes()).context("temporary path with a NUL")?;
        // SAFETY: path is NUL-terminated; the object's constructors are PMIx's own.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        // The mapping outlives the file.
        drop(file);
        if handle.is_null() {
            bail!(
                "cannot load PMIx ({}): pagewise mpi needs libpmix.so.2 (Debian: libpmix2, installed with openmpi-bin)",
                dlerror_text()
            );
        }
        // SAFETY: each name is paired with its type from pmix_exchange.c.
        let (init, local_size, put, fence, get, finalize, error) = unsafe {
            (
                symbol::<InitFn>(handle, "pw_pmix_init")?,
                symbol::<LocalSizeFn>(handle, "pw_pmix_local_size")?,
                symbol::<PutFn>(handle, "pw_pmix_put")?,
                symbol::<FenceFn>(handle, "pw_pmix_fence")?,
                symbol::<GetFn>(handle, "pw_pmix_get")?,
                symbol::<FinalizeFn>(handle, "pw_pmix_finalize")?,
                symbol::<ErrorFn>(handle, "pw_pmix_error")?,
            )
        };
        let (mut rank, mut size) = (0u32, 0u32);
        // SAFETY: both pointers are valid u32s.
        let rc = unsafe { init(&mut rank, &mut size) };
        let pmix = Pmix { local_size, put, fence, get, finalize, error, rank, size };
        if rc != 0 {
            bail!("PMIx_Init failed: {} (is a PMIx server running for this job?)", pmix.status_text(rc));
        }
        Ok(pmix)
    }

    fn status_text(&self, rc: c_int) -> String {
        // SAFETY: PMIx_Error_string returns a static string for any status.
        let p = unsafe { (self.error)(rc) };
        if p.is_null() {
            return format!("status {rc}");
        }
        // SAFETY: as above.
        format!("{} ({rc})", unsafe { CStr::from_ptr(p) }.to_string_lossy())
    }

    fn check(&self, rc: c_int, what: &str) -> Result<()> {
        if rc != 0 {
            bail!("{what} failed: {}", self.status_text(rc));
        }
        Ok(())
    }

    /// How many processes of this job run on this node.
    pub fn local_size(&self) -> Result<u32> {
        let mut n = 0u32;
        // SAFETY: n is a valid u32.
        let rc = unsafe { (self.local_size)(&mut n) };
        self.check(rc, "PMIx_Get(PMIX_LOCAL_SIZE)")?;
        Ok(n.max(1))
    }

    /// Publish `key` = `value` to every rank of the job, from the next fence on.
    pub fn put(&self, key: &str, value: &str) -> Result<()> {
        let k = CString::new(key).context("a PMIx key with a NUL")?;
        let v = CString::new(value).context("a PMIx value with a NUL")?;
        // SAFETY: both are NUL-terminated and outlive the call (PMIx copies them).
        let rc = unsafe { (self.put)(k.as_ptr(), v.as_ptr()) };
        self.check(rc, &format!("PMIx_Put({key})"))
    }

    /// Wait for every rank of the job here; what each put before is then visible to all.
    pub fn fence(&self, what: &str) -> Result<()> {
        // SAFETY: no arguments.
        let rc = unsafe { (self.fence)() };
        self.check(rc, &format!("PMIx_Fence ({what})"))
    }

    /// What rank `rank` put under `key` (None: nothing).
    pub fn get(&self, rank: u32, key: &str) -> Result<Option<String>> {
        let k = CString::new(key).context("a PMIx key with a NUL")?;
        let mut buf = vec![0u8; 4096];
        loop {
            let mut needed = 0usize;
            // SAFETY: buf is writable for its length; k is NUL-terminated.
            let rc = unsafe { (self.get)(rank, k.as_ptr(), buf.as_mut_ptr() as *mut c_char, buf.len(), &mut needed) };
            match rc {
                0 => {
                    buf.truncate(needed);
                    return String::from_utf8(buf).map(Some).map_err(|_| anyhow!("rank {rank} put {key} not in UTF-8"));
                }
                NOT_FOUND => return Ok(None),
                BAD_PARAM if needed >= buf.len() => buf = vec![0u8; needed + 1],
                _ => self.check(rc, &format!("PMIx_Get(rank {rank}, {key})"))?,
            }
        }
    }

    /// Disconnect from the launcher (the last call of a rank that ends normally).
    pub fn finalize(self) -> Result<()> {
        // SAFETY: no arguments.
        let rc = unsafe { (self.finalize)() };
        self.check(rc, "PMIx_Finalize")
    }
}
