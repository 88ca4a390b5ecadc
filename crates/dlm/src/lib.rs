//! # pagewise-dlm: distributed large memory
//!
//! A sequential program gets memory areas larger than its host's memory: the pages live on
//! memory servers (`pagewise dlm-server`) on other hosts, each page with a fixed home, and the
//! host keeps copies of at most `local_mem` bytes of them. The paging unit is a *page set*:
//! base page B × set count s, changeable while the program runs (seed 003; spec
//! `shared/spec/dlm.md`; wire format in `PROTOCOL.md`).
//!
//! - [`server`]: the memory server.
//! - [`runtime`]: the client runtime ([`Dlm`]): fault handling (userfaultfd handler thread,
//!   userfaultfd SIGBUS, or the SIGSEGV fallback), eviction (CLOCK with sampled reference
//!   bits, see below), write-back, read-ahead.
//! - [`clock`], [`layout`], [`config`]: the pure parts (policy, home arithmetic, parsing).
//! - [`transport`]: the message channel (TCP), behind a trait so MPI can follow.
//! - [`capi`]: the `dlm_*` C ABI.
//! - [`tune`] (policy) and `measure` (what the runtime records for it): the page-size tuner.
//!
//! Eviction is a CLOCK over resident units. Reads of a resident unit do not fault, so the
//! reference bit is sampled: when the hand clears a unit's bit it also unmaps the unit from the
//! program's view, keeping its pages, and the unit's next access — a fault — sets the bit
//! again (`runtime.rs`, "Reference bits"). A unit the program keeps reading therefore outlives
//! units read once, which plain FIFO by fault time (what a CLOCK that sees only faults
//! amounts to) would not do.

pub mod auth;
pub mod capi;
pub mod clock;
pub mod config;
pub mod layout;
mod measure;
pub mod process;
pub mod proto;
pub mod redundancy;
pub mod runtime;
pub mod sampling;
pub mod server;
mod signals;
pub mod transport;
pub mod tune;

pub use config::{parse_size, Config, FaultMode};
pub use redundancy::Redundancy;
pub use runtime::{Access, Dlm, Stats, PROGRAM_CPUS_ENV};

/// Errors of the DLM runtime's API (fault-path failures stop the program instead).
#[derive(Debug, thiserror::Error)]
pub enum DlmError {
    /// a bad configuration or argument
    #[error("dlm: {0}")]
    Config(String),
    /// connecting to a memory server failed
    #[error("dlm: connecting to memory server {server} failed: {source}")]
    Connect {
        server: String,
        #[source]
        source: std::io::Error,
    },
    /// a memory server refused or failed a request
    #[error("dlm: memory server {server}: {detail}")]
    Server { server: String, detail: String },
    /// a kernel interface failed
    #[error("dlm: {0}")]
    Kernel(#[from] pagewise_kernel::Error),
    /// starting the fault-handler thread failed
    #[error("dlm: starting the fault handler thread failed: {0}")]
    Thread(std::io::Error),
    /// installing the fault signal handler failed
    #[error("dlm: sigaction failed: {0}")]
    Signal(std::io::Error),
    /// a runtime already exists in this process
    #[error("dlm: already initialised in this process")]
    AlreadyInitialised,
    /// the runtime belongs to the parent of this process (a child made by fork(2))
    #[error("dlm: the runtime belongs to this process's parent (fork); start one of its own")]
    NotOwner,
}

impl DlmError {
    /// The negative errno the C ABI returns for this error.
    pub fn errno(&self) -> i32 {
        -match self {
            DlmError::Config(_) => libc::EINVAL,
            DlmError::Connect { source, .. } => source.raw_os_error().unwrap_or(match source.kind() {
                std::io::ErrorKind::PermissionDenied => libc::EACCES,
                std::io::ErrorKind::InvalidInput => libc::EINVAL,
                _ => libc::ECONNREFUSED,
            }),
            DlmError::Server { .. } => libc::EIO,
            DlmError::Kernel(e) => e.errno().unwrap_or(libc::EINVAL),
            DlmError::Thread(e) | DlmError::Signal(e) => e.raw_os_error().unwrap_or(libc::EAGAIN),
            DlmError::AlreadyInitialised => libc::EBUSY,
            DlmError::NotOwner => libc::ECHILD,
        }
    }
}

/// Stop the program: a DLM page can no longer be served correctly. Writes the message to
/// stderr without allocating (this may run in a signal handler) and aborts.
pub(crate) fn fatal(args: std::fmt::Arguments<'_>) -> ! {
    note(args);
    std::process::abort()
}

/// Print one line to stderr without allocating (it may run in a signal handler).
pub(crate) fn note(args: std::fmt::Arguments<'_>) {
    struct Buf {
        b: [u8; 1024],
        n: usize,
    }
    impl std::fmt::Write for Buf {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            let k = s.len().min(self.b.len() - self.n);
            self.b[self.n..self.n + k].copy_from_slice(&s.as_bytes()[..k]);
            self.n += k;
            Ok(())
        }
    }
    let mut buf = Buf { b: [0; 1024], n: 0 };
    let _ = std::fmt::write(&mut buf, args);
    let _ = std::fmt::Write::write_str(&mut buf, "\n");
    // SAFETY: writing our own buffer to fd 2.
    unsafe { libc::write(2, buf.b.as_ptr() as *const libc::c_void, buf.n) };
}

/// What DLM offers a user and the kernel capabilities each part uses (`pagewise doctor`).
pub const FEATURES: &[pagewise_kernel::features::Feature] = &[
    pagewise_kernel::features::Feature {
        name: "dlm_* C API",
        needs: &[pagewise_kernel::features::Capability::Userfaultfd],
    },
    // Unmodified programs: handler-thread faults (not user-mode-only userfaultfd), so the
    // kernel's own accesses (read(2) into DLM memory) are served too.
    pagewise_kernel::features::Feature {
        name: "pagewise run",
        needs: &[pagewise_kernel::features::Capability::Userfaultfd],
    },
];
