//! Run a closure in a forked child process that has one thread, and get its result back.
//!
//! For measurements of code whose behaviour depends on the process having one thread (the DLM
//! runtime moves received pages in only then: `crates/dlm/src/runtime/frames.rs`) from a
//! process that has several (an experiment's progress thread, the test harness).

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::error::{Error, Result};

/// Run `f` in a child made by fork(2) — whose only thread is the calling one — and return the
/// bytes it produced. A panic in the child, or a child killed by a signal, is an error naming
/// it.
///
/// The child must not take locks another thread of this process may have held at the fork
/// (printing to a shared stdout, say); glibc's malloc is safe to use there (it prepares for
/// fork).
pub fn in_single_threaded_child(f: impl FnOnce() -> Vec<u8>) -> Result<Vec<u8>> {
    let mut fds = [0; 2];
    // SAFETY: fds has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(Error::last_os("pipe2"));
    }
    // SAFETY: both descriptors are fresh and owned here.
    let (read_end, write_end) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the child only runs `f`, writes its bytes and _exits (module doc).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(Error::last_os("fork"));
    }
    if pid == 0 {
        drop(read_end);
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        let code = match out {
            Ok(bytes) => {
                let mut rest = &bytes[..];
                while !rest.is_empty() {
                    // SAFETY: writing our own buffer to our own pipe.
                    let n = unsafe { libc::write(write_end.as_raw_fd(), rest.as_ptr().cast(), rest.len()) };
                    if n <= 0 {
                        break;
                    }
                    rest = &rest[n as usize..];
                }
                if rest.is_empty() {
                    0
                } else {
                    2
                }
            }
            Err(_) => 1,
        };
        // SAFETY: ends the child without running the parent's exit handlers.
        unsafe { libc::_exit(code) };
    }
    drop(write_end);
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
        1 => Err(Error::Invalid("the forked child panicked (its message is on stderr)".into())),
        c => Err(Error::Invalid(format!("the forked child exited with status {c}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_child_has_one_thread_and_its_bytes_come_back() {
        let _other = std::thread::spawn(|| std::thread::sleep(std::time::Duration::from_secs(2)));
        let out = in_single_threaded_child(|| {
            let n = crate::procfs::ThreadCount::open().unwrap().get().unwrap();
            n.to_string().into_bytes()
        })
        .unwrap();
        assert_eq!(out, b"1");
    }

    #[test]
    fn a_panicking_child_is_an_error() {
        let err = in_single_threaded_child(|| panic!("on purpose")).unwrap_err();
        assert!(err.to_string().contains("panicked"), "{err}");
    }
}
