//! The error convention of the kernel layer.
//!
//! Every failure names what failed — the syscall, or the file and what was done to it — and
//! carries the `io::Error` taken right after the call (`io::Error::last_os_error()`), so the
//! errno is never lost or reinterpreted.

use std::io;
use std::path::PathBuf;

/// A failed kernel interaction.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `{call}` failed: {source}
    #[error("{call} failed: {source}")]
    Syscall {
        call: &'static str,
        #[source]
        source: io::Error,
    },
    /// reading `{path}` failed: {source}
    #[error("reading {path} failed: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// writing `{value}` to `{path}` failed: {source}
    #[error("writing {value:?} to {path} failed: {source}")]
    Write {
        path: PathBuf,
        value: String,
        #[source]
        source: io::Error,
    },
    /// a memory cgroup's limit, lowered to reclaim, could not be put back: the group is left
    /// with less memory than its owner gave it until the settings guard restores it.
    #[error("the limit of {path} was lowered to reclaim and could not be restored to {value}: {source}")]
    LimitNotRestored {
        path: PathBuf,
        value: String,
        #[source]
        source: io::Error,
    },
    /// a kernel file had a shape this parser does not understand.
    #[error("cannot parse {what}: {detail}")]
    Parse { what: String, detail: String },
    /// an argument was rejected before any syscall was made.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// a system tool (iproute2's `ip` or `tc`) could not be run or reported a failure.
    #[error("`{command}` failed: {detail}")]
    Command { command: String, detail: String },
}

/// The layer's result type.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// Build a [`Error::Syscall`] from `errno` as it is right now. Call immediately after the
    /// failing syscall, before anything else can overwrite errno.
    pub fn last_os(call: &'static str) -> Self {
        Error::Syscall { call, source: io::Error::last_os_error() }
    }

    pub(crate) fn parse(what: impl Into<String>, detail: impl Into<String>) -> Self {
        Error::Parse { what: what.into(), detail: detail.into() }
    }

    /// The raw errno, when the failure came from the kernel.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Syscall { source, .. }
            | Error::Read { source, .. }
            | Error::Write { source, .. }
            | Error::LimitNotRestored { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// True when the failure means the file or feature does not exist on this kernel.
    pub fn is_not_found(&self) -> bool {
        matches!(self.errno(), Some(libc::ENOENT) | Some(libc::ENODEV) | Some(libc::ENOSYS))
    }
}

/// Read a whole kernel file as text.
pub fn read_file(path: impl Into<PathBuf>) -> Result<String> {
    let path = path.into();
    std::fs::read_to_string(&path).map_err(|source| Error::Read { path, source })
}

/// Read a kernel file holding one value and trim it.
pub fn read_trimmed(path: impl Into<PathBuf>) -> Result<String> {
    Ok(read_file(path)?.trim().to_string())
}

/// Read a kernel file holding one unsigned integer.
pub fn read_u64(path: impl Into<PathBuf>) -> Result<u64> {
    let path = path.into();
    let text = read_trimmed(path.clone())?;
    text.parse().map_err(|_| Error::parse(path.display().to_string(), format!("not an integer: {text:?}")))
}

/// Write a value to a kernel file. Use [`crate::guard::SettingsGuard`] instead for system
/// settings, so the change is undone.
pub fn write_file(path: impl Into<PathBuf>, value: &str) -> Result<()> {
    let path = path.into();
    std::fs::write(&path, value).map_err(|source| Error::Write { path, value: value.to_string(), source })
}

/// Set the calling thread's errno: how a C API function that returns a null pointer reports
/// why. Async-signal-safe.
pub fn set_errno(errno: i32) {
    // SAFETY: __errno_location returns this thread's errno slot, valid for the thread's life.
    unsafe { *libc::__errno_location() = errno };
}
