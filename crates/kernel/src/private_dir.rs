//! Scratch files that no other user can plant or redirect.
//!
//! A fixed or pid-derived name under /tmp or /var/tmp (`/tmp/pagewise-run-{pid}.json`) can be
//! created first by any user of the host, as a file, a directory or a symlink; a process
//! running as root that then writes there writes where the other user chose, and one that
//! executes a program from such a directory executes the other user's program. So every
//! scratch path of Pagewise lives in a [`PrivateDir`]: made by mkdtemp(3) — a name no one can
//! predict, created with mkdir(2), which fails rather than reuse anything that exists, mode
//! 0700 — and files are created in it with `O_CREAT|O_EXCL|O_NOFOLLOW` ([`create_new_file`]),
//! which never opens what is already there and never follows a symlink.

use std::ffi::{CString, OsString};
use std::fs::File;
use std::os::fd::FromRawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// A directory of this process's own, removed with its contents on drop (unless
/// [`PrivateDir::keep`]).
#[derive(Debug)]
pub struct PrivateDir {
    path: PathBuf,
    keep: bool,
}

impl PrivateDir {
    /// A fresh private directory `pagewise-{tag}.XXXXXX` in the system's temporary directory
    /// (`$TMPDIR`, else /tmp).
    pub fn new(tag: &str) -> Result<Self> {
        Self::new_in(std::env::temp_dir(), tag)
    }

    /// A fresh private directory `pagewise-{tag}.XXXXXX` in `parent` (e.g. /var/tmp, for
    /// files that must be on a disk rather than in tmpfs).
    pub fn new_in(parent: impl AsRef<Path>, tag: &str) -> Result<Self> {
        if tag.contains('/') || tag.contains('\0') {
            return Err(Error::Invalid(format!("scratch directory tag {tag:?} contains '/' or NUL")));
        }
        let template = parent.as_ref().join(format!("pagewise-{tag}.XXXXXX"));
        let mut bytes = CString::new(template.into_os_string().into_vec())
            .map_err(|_| Error::Invalid("scratch directory parent contains NUL".into()))?
            .into_bytes_with_nul();
        // SAFETY: `bytes` is a NUL-terminated template that mkdtemp rewrites in place (only its
        // trailing XXXXXX) and does not keep.
        let made = unsafe { libc::mkdtemp(bytes.as_mut_ptr().cast()) };
        if made.is_null() {
            return Err(Error::last_os("mkdtemp"));
        }
        bytes.pop();
        Ok(PrivateDir { path: PathBuf::from(OsString::from_vec(bytes)), keep: false })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `name` inside the directory (`name` must be a plain file name).
    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Create the file `name` in the directory, exclusively, readable and writable by its
    /// owner only ([`create_new_file`]).
    pub fn create_file(&self, name: &str) -> Result<File> {
        if name.contains('/') || name.is_empty() {
            return Err(Error::Invalid(format!("scratch file name {name:?} is not a plain file name")));
        }
        create_new_file(&self.path.join(name), 0o600)
    }

    /// Leave the directory in place when this is dropped; returns its path.
    pub fn keep(mut self) -> PathBuf {
        self.keep = true;
        self.path.clone()
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Create `path` for writing with `O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC` and `mode`: fails with
/// EEXIST when anything — a file, a directory, a symlink, even a dangling one — is already
/// there, so it never writes into something another user prepared.
pub fn create_new_file(path: &Path, mode: u32) -> Result<File> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| Error::Invalid(format!("path {} contains NUL", path.display())))?;
    // SAFETY: `c` is a valid NUL-terminated path; the mode is passed as the variadic argument
    // open(2) reads with O_CREAT.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(Error::Write {
            path: path.to_path_buf(),
            value: "(new file: open O_CREAT|O_EXCL|O_NOFOLLOW)".into(),
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn directories_are_fresh_private_and_removed() {
        let a = PrivateDir::new("unit").unwrap();
        let b = PrivateDir::new("unit").unwrap();
        assert_ne!(a.path(), b.path());
        let meta = std::fs::symlink_metadata(a.path()).unwrap();
        assert!(meta.is_dir());
        assert_eq!(meta.mode() & 0o7777, 0o700);
        // SAFETY: no preconditions.
        assert_eq!(meta.uid(), unsafe { libc::geteuid() });
        let mut f = a.create_file("x").unwrap();
        f.write_all(b"data").unwrap();
        assert_eq!(std::fs::metadata(a.join("x")).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(a.create_file("x").is_err(), "a second create of the same name must fail");
        assert!(a.create_file("../escape").is_err());
        assert!(PrivateDir::new("a/b").is_err());
        let path = a.path().to_path_buf();
        drop(a);
        assert!(!path.exists());
        let kept = b.keep();
        assert!(kept.exists());
        std::fs::remove_dir_all(kept).unwrap();
    }

    #[test]
    fn create_new_file_never_follows_or_reuses() {
        let d = PrivateDir::new("unit-nofollow").unwrap();
        let victim = d.join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let link = d.join("link");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let err = create_new_file(&link, 0o600).unwrap_err();
        assert_eq!(err.errno(), Some(libc::EEXIST), "{err}");
        // A dangling symlink too: O_EXCL refuses it instead of creating its target.
        let dangling = d.join("dangling");
        std::os::unix::fs::symlink(d.join("would-be-created"), &dangling).unwrap();
        assert!(create_new_file(&dangling, 0o600).is_err());
        assert!(!d.join("would-be-created").exists());
        assert!(create_new_file(&victim, 0o600).is_err());
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    }
}
