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
//!
//! A process killed by SIGKILL runs no destructor, so its directory stays behind (an
//! experiment that stops a program's whole process group at its time budget leaves one per
//! run). Each directory is therefore held, with flock(2) on it, for as long as the process
//! that made it lives; [`sweep_abandoned`] removes the ones whose maker is gone.

use std::ffi::{CString, OsString};
use std::fs::File;
use std::os::fd::FromRawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Error, Result};

/// A directory of this process's own, removed with its contents on drop (unless
/// [`PrivateDir::keep`]).
#[derive(Debug)]
pub struct PrivateDir {
    path: PathBuf,
    keep: bool,
    /// The directory, open (close-on-exec: the programs this process starts do not inherit
    /// it) and flock(2)ed while this value lives: taken by no one else, it is abandoned.
    _held: File,
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
        let path = PathBuf::from(OsString::from_vec(bytes));
        let held = hold(&path).inspect_err(|_| {
            let _ = std::fs::remove_dir(&path);
        })?;
        Ok(PrivateDir { path, keep: false, _held: held })
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

    /// Leave the directory in place when this is dropped, no longer held (a kept directory
    /// must not have a tag [`sweep_abandoned`] is called with); returns its path.
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

/// Open directory `path` (never through a symlink) and lock it with flock(2), without waiting:
/// `Ok(None)` when another open file holds it.
fn try_hold(path: &Path) -> Result<Option<File>> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| Error::Invalid(format!("path {} contains NUL", path.display())))?;
    // SAFETY: `c` is a valid NUL-terminated path; no mode argument without O_CREAT.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(Error::last_os("open(O_DIRECTORY|O_NOFOLLOW)"));
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    let dir = unsafe { File::from_raw_fd(fd) };
    Ok(crate::fd::try_lock_exclusive(&dir)?.then_some(dir))
}

/// Hold a directory this process just made (nobody else can hold it yet).
fn hold(path: &Path) -> Result<File> {
    try_hold(path)?.ok_or_else(|| Error::Invalid(format!("{} is locked by another process", path.display())))
}

/// Remove the directories `pagewise-{tag}.` + six characters (mkdtemp) in the temporary directory that
/// this user made with [`PrivateDir::new`] and no live process holds: their maker was killed
/// before it could remove them. Only directories (never a symlink) owned by this user, of
/// mode 0700, last changed more than `grace` ago (the instant between mkdtemp and flock in
/// [`PrivateDir::new_in`]); a directory being swept is held, so two sweeps never collide.
/// A process the killed maker started may still be running: a file it reads later from
/// there is gone (a preload shim for the programs it starts then is not found, and ld.so
/// runs them without it). Returns how many were removed.
pub fn sweep_abandoned(tag: &str, grace: Duration) -> usize {
    sweep_abandoned_in(&std::env::temp_dir(), tag, grace)
}

fn sweep_abandoned_in(parent: &Path, tag: &str, grace: Duration) -> usize {
    use std::os::unix::fs::MetadataExt;
    let prefix = format!("pagewise-{tag}.");
    let Ok(entries) = std::fs::read_dir(parent) else { return 0 };
    // SAFETY: no preconditions.
    let me = unsafe { libc::geteuid() };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(suffix) = name.to_str().and_then(|n| n.strip_prefix(&prefix)) else { continue };
        if suffix.len() != 6 {
            continue;
        }
        let path = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
        let old_enough = meta.modified().ok().and_then(|m| m.elapsed().ok()).is_some_and(|age| age >= grace);
        if !meta.is_dir() || meta.uid() != me || meta.mode() & 0o7777 != 0o700 || !old_enough {
            continue;
        }
        if let Ok(Some(_held)) = try_hold(&path) {
            if std::fs::remove_dir_all(&path).is_ok() {
                removed += 1;
            }
        }
    }
    removed
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
    fn a_sweep_removes_only_abandoned_directories_of_its_tag() {
        let parent = PrivateDir::new("sweep-parent").unwrap();
        let live = PrivateDir::new_in(parent.path(), "swept").unwrap();
        let abandoned = PrivateDir::new_in(parent.path(), "swept").unwrap();
        std::fs::write(abandoned.join("shim.so"), b"x").unwrap();
        let abandoned = abandoned.keep(); // as a SIGKILLed maker leaves it: in place, unheld
        let other_tag = PrivateDir::new_in(parent.path(), "kept").unwrap().keep();
        // Not ours to judge: a symlink to an abandoned directory, and a directory others may read.
        let target = PrivateDir::new_in(parent.path(), "target").unwrap().keep();
        std::os::unix::fs::symlink(&target, parent.join("pagewise-swept.linkxx")).unwrap();
        let open = PrivateDir::new_in(parent.path(), "swept").unwrap().keep();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();

        assert_eq!(sweep_abandoned_in(parent.path(), "swept", Duration::from_secs(3600)), 0, "all too young");
        assert_eq!(sweep_abandoned_in(parent.path(), "swept", Duration::ZERO), 1);
        assert!(!abandoned.exists());
        for kept in [live.path(), other_tag.as_path(), target.as_path(), open.as_path()] {
            assert!(kept.is_dir(), "{} was removed", kept.display());
        }
        assert!(parent.join("pagewise-swept.linkxx").symlink_metadata().is_ok());
        drop(live);
        assert_eq!(sweep_abandoned_in(parent.path(), "swept", Duration::ZERO), 0, "dropped: removed by its maker");
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
