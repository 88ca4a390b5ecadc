//! # pagewise-kernel: the one thin OS layer
//!
//! Every memory-related syscall Pagewise makes, and every read or write of /proc, /sys,
//! tracefs and cgroup files, goes through this crate. Policies never call libc.
//!
//! Conventions shared by every module:
//! - Errors name the syscall or the file and carry the errno taken right after the call
//!   ([`Error`]).
//! - Arguments are validated before the unsafe call (alignment, zero lengths, names with `/`).
//! - Any change to a system setting goes through a [`guard::SettingsGuard`], which undoes it.
//! - Parsers are pure functions over text, tested on fixtures from real kernels
//!   (`fixtures/<file>-<kernel>.txt`).

pub mod cgroup;
pub mod colocate;
pub mod cpu;
pub mod error;
pub mod fd;
pub mod features;
pub mod fork;
pub mod guard;
pub mod mem;
pub mod net;
pub mod netns;
pub mod page_idle;
pub mod page_reporting;
pub mod pagecache;
pub mod pagemap_scan;
pub mod private_dir;
pub mod probe;
pub mod procfs;
pub mod shrink;
pub mod signal;
pub mod swap;
pub mod testbed;
pub mod testing;
pub mod thp;
pub mod tmpfs;
pub mod tracefs;
pub mod uffd;

pub use error::{Error, Result};
pub use guard::SettingsGuard;

/// A function the preload shim of `pagewise run` / `pagewise hps run` defines for the runtime
/// (preload/shim.c, preload/fds.c), when the shim is in the process; `None` without it.
pub(crate) fn shim_function(name: &std::ffi::CStr) -> Option<*mut libc::c_void> {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only looks the symbol up.
    let sym = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    (!sym.is_null()).then_some(sym)
}
