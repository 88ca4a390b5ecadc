//! Run a little async-signal-safe work in a forked child, whose only thread is the caller's,
//! and get its bytes back.
//!
//! fork(2) in a process with several threads copies only the calling thread; locks the others
//! held stay held in the child, and data they were changing stays half-changed. Until it
//! execs, such a child may therefore only do what signal-safety(7) allows. That is the
//! contract of [`in_single_threaded_child`], which is `unsafe` for it (issue 23: it used to run
//! arbitrary code, a whole DLM runtime, there). Work that needs more than that — a DLM client
//! measured in a process with one thread — runs in a fresh process instead (exec), as
//! `pagewise eval dlm-fault` and the DLM tests do.

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::error::{Error, Result};

/// Ends a child whose work unwinds, without running anything of the parent's.
struct ExitOnUnwind;

impl Drop for ExitOnUnwind {
    fn drop(&mut self) {
        // SAFETY: _exit is async-signal-safe and ends only this (child) process.
        unsafe { libc::_exit(101) };
    }
}

/// Fork; in the child run `f` on a buffer of `out_len` bytes (allocated before the fork),
/// send the first bytes it says it wrote (its return value) back and `_exit`; in the parent
/// return those bytes. A child that unwinds or is killed by a signal is an error naming it.
///
/// # Safety
/// `f` runs in the child of a fork of a process that may have other threads. Until it returns
/// it may only do what signal-safety(7) allows there: async-signal-safe functions (plain
/// system calls such as open, fstat, read, write, close) on memory that existed before the
/// fork, and writes into its buffer. No allocation, no lock (printing, a `Mutex`, reading the
/// environment), no panic: any of them may wait forever for a lock another thread held at the
/// fork, or find its data half-changed.
pub unsafe fn in_single_threaded_child(out_len: usize, f: impl FnOnce(&mut [u8]) -> usize) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; out_len];
    let mut fds = [0; 2];
    // SAFETY: fds has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(Error::last_os("pipe2"));
    }
    // SAFETY: both descriptors are fresh and owned here.
    let (read_end, write_end) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the child runs only `f` (async-signal-safe by the caller's contract), write(2)
    // and _exit(2).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(Error::last_os("fork"));
    }
    if pid == 0 {
        let guard = ExitOnUnwind;
        let n = f(&mut buf).min(buf.len());
        std::mem::forget(guard);
        let mut rest = &buf[..n];
        while !rest.is_empty() {
            // SAFETY: writing our own buffer to our own pipe.
            let w = unsafe { libc::write(write_end.as_raw_fd(), rest.as_ptr().cast(), rest.len()) };
            if w <= 0 {
                // SAFETY: as above.
                unsafe { libc::_exit(2) };
            }
            rest = &rest[w as usize..];
        }
        // SAFETY: ends the child without running the parent's exit handlers.
        unsafe { libc::_exit(0) };
    }
    drop(write_end);
    drop(buf);
    let mut bytes = Vec::new();
    let read = std::fs::File::from(read_end).read_to_end(&mut bytes);
    let mut status = 0;
    // SAFETY: waiting for our own child.
    if unsafe { libc::waitpid(pid, &mut status, 0) } != pid {
        return Err(Error::last_os("waitpid"));
    }
    read.map_err(|source| Error::Read { path: "pipe from the forked child".into(), source })?;
    if libc::WIFSIGNALED(status) {
        return Err(Error::Invalid(format!("the forked child was killed by signal {}", libc::WTERMSIG(status))));
    }
    match libc::WEXITSTATUS(status) {
        0 => Ok(bytes),
        101 => Err(Error::Invalid("the forked child's work unwound (a panic: its message is on stderr)".into())),
        c => Err(Error::Invalid(format!("the forked child exited with status {c}"))),
    }
}

/// The threads of the calling process, from the link count of /proc/self/task, with
/// async-signal-safe calls only (for a forked child); None when it cannot be read.
#[cfg(test)]
fn thread_count_signal_safe() -> Option<u64> {
    // SAFETY: a NUL-terminated path; the descriptor is closed below.
    let fd = unsafe { libc::open(c"/proc/self/task".as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: a zeroed stat for fstat to fill.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open; st is writable.
    let rc = unsafe { libc::fstat(fd, &mut st) };
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
    (rc == 0).then(|| st.st_nlink.saturating_sub(2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_child_has_one_thread_and_its_bytes_come_back() {
        let _other = std::thread::spawn(|| std::thread::sleep(std::time::Duration::from_secs(2)));
        // SAFETY: the closure makes only open/fstat/close calls and writes into its buffer.
        let out = unsafe {
            in_single_threaded_child(8, |buf| {
                buf.copy_from_slice(&thread_count_signal_safe().unwrap_or(0).to_le_bytes());
                8
            })
        }
        .unwrap();
        assert_eq!(u64::from_le_bytes(out.try_into().unwrap()), 1);
    }

    #[test]
    fn a_child_that_fails_is_an_error() {
        // SAFETY: the closure only calls _exit.
        let err = unsafe { in_single_threaded_child(1, |_| libc::_exit(7)) }.unwrap_err();
        assert!(err.to_string().contains("status 7"), "{err}");
    }
}
