//! File-descriptor plumbing that is not specific to one memory interface: pipes, poll(2),
//! advisory file locks (flock(2)), and moving a runtime's descriptors out of a program's way.
//!
//! Errors name the syscall ([`Error::Syscall`]); EINTR is retried where a caller could do
//! nothing else with it. [`write_signal_safe`] is the one function here that may be called from
//! a signal handler.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use crate::error::{Error, Result};

/// A pipe (pipe2(2) with O_CLOEXEC): `(read end, write end)`.
pub fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    let mut fds = [-1 as RawFd; 2];
    // SAFETY: fds is a valid out-array of two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(Error::last_os("pipe2"));
    }
    // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Move `fd` to the lowest free number at or above [`out_of_the_way_floor`] (fcntl
/// F_DUPFD_CLOEXEC), closing the original. A runtime inside a program it did not write
/// (`pagewise run`, `pagewise hps run`) would otherwise hold the lowest numbers, the ones a
/// program places its own descriptors on by number: bash's `exec 4>file`, a daemon's dup2
/// onto 3. dup2 closes what it replaces, and for a userfaultfd that unregisters every range
/// with it. Best effort: where nothing up there is free, `fd` is returned as it was.
///
/// When the preload shim is in the process, the descriptor is also registered with it
/// (preload/fds.c): the program's close, close_range, closefrom, dup2 and dup3 then leave it
/// alone, as a daemon closing every descriptor it did not open would otherwise close it too.
pub fn out_of_the_way(fd: OwnedFd) -> OwnedFd {
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor we own returns a new one or -1.
    let moved = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, out_of_the_way_floor()) };
    let fd = if moved < 0 {
        fd
    } else {
        // SAFETY: `moved` is fresh and ours; dropping `fd` closes the original.
        unsafe { OwnedFd::from_raw_fd(moved) }
    };
    keep_from_the_program(fd.as_raw_fd());
    fd
}

/// Register `fd` with the preload shim of `pagewise run` / `pagewise hps run` when it is in
/// the process (`pagewise_runtime_fd`, preload/fds.c); without it, nothing to do.
fn keep_from_the_program(fd: RawFd) {
    if let Some(sym) = crate::shim_function(c"pagewise_runtime_fd") {
        // SAFETY: the shim defines `void pagewise_runtime_fd(int)` (preload/fds.c).
        let keep: extern "C" fn(libc::c_int) =
            unsafe { std::mem::transmute::<*mut libc::c_void, extern "C" fn(libc::c_int)>(sym) };
        keep(fd);
    }
}

/// Where [`out_of_the_way`] starts looking: 128 below the soft RLIMIT_NOFILE, counted from at
/// most 1024 (a larger limit would make the kernel grow the descriptor table that far, and
/// select(2) stops at 1024), or half a limit under 256.
pub fn out_of_the_way_floor() -> RawFd {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: lim is a valid out-struct.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 { lim.rlim_cur } else { 1024 };
    let soft = soft.min(1024) as RawFd;
    if soft >= 256 {
        soft - 128
    } else {
        soft / 2
    }
}

/// read(2) into `buf` once, retrying EINTR. `Ok(0)` is end of file (every write end closed).
pub fn read(fd: impl AsFd, buf: &mut [u8]) -> Result<usize> {
    loop {
        // SAFETY: buf is valid for buf.len() writable bytes; the fd is borrowed, so open.
        let n = unsafe { libc::read(fd.as_fd().as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(Error::Syscall { call: "read", source: e });
        }
    }
}

/// write(2) of `buf` once, retrying EINTR; returns the bytes written.
pub fn write(fd: impl AsFd, buf: &[u8]) -> Result<usize> {
    loop {
        match write_signal_safe(fd.as_fd().as_raw_fd(), buf) {
            Ok(n) => return Ok(n),
            Err(libc::EINTR) => continue,
            Err(errno) => {
                return Err(Error::Syscall { call: "write", source: std::io::Error::from_raw_os_error(errno) })
            }
        }
    }
}

/// write(2) of `buf` to a raw descriptor, once: `Ok(bytes written)` or `Err(errno)`.
/// Async-signal-safe (signal-safety(7) lists write): no allocation, no lock, so a signal
/// handler may call it. A write of at most PIPE_BUF (4096) bytes to a pipe is atomic
/// (pipe(7)), so a reader never sees it torn. A closed or invalid `fd` gives `Err(EBADF)`.
pub fn write_signal_safe(fd: RawFd, buf: &[u8]) -> std::result::Result<usize, i32> {
    // SAFETY: buf is valid for buf.len() readable bytes; write(2) on an fd that is not open
    // fails with EBADF and touches no memory of ours.
    let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
    if n < 0 {
        // SAFETY: __errno_location returns this thread's errno slot; reading it is signal-safe.
        return Err(unsafe { *libc::__errno_location() });
    }
    Ok(n as usize)
}

/// Wait up to `timeout` for `fd` to become readable (poll(2) with POLLIN). `Ok(true)` when it
/// is readable (or hung up: a read will then say so), `Ok(false)` on timeout or when a signal
/// interrupted the wait (the caller loops and re-checks its own state either way).
pub fn poll_readable(fd: impl AsFd, timeout: Duration) -> Result<bool> {
    let mut pfd = libc::pollfd { fd: fd.as_fd().as_raw_fd(), events: libc::POLLIN, revents: 0 };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: pfd is one valid pollfd for the duration of the call.
    let n = unsafe { libc::poll(&mut pfd, 1, ms) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EINTR) {
            return Ok(false);
        }
        return Err(Error::Syscall { call: "poll", source: e });
    }
    if n > 0 && pfd.revents & libc::POLLNVAL != 0 {
        return Err(Error::Syscall { call: "poll", source: std::io::Error::from_raw_os_error(libc::EBADF) });
    }
    Ok(n > 0)
}

/// Take an exclusive advisory lock on `file` (flock(2) LOCK_EX), waiting for it; EINTR is
/// retried. The lock belongs to the open file description and is released when the last
/// descriptor of it closes (flock(2)), so dropping the `File` unlocks.
pub fn lock_exclusive(file: &File) -> Result<()> {
    loop {
        // SAFETY: flock on a descriptor the borrowed File keeps open.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(Error::Syscall { call: "flock", source: e });
        }
    }
}

/// Take an exclusive advisory lock on `file` if no other open file description holds one
/// (flock(2) LOCK_EX|LOCK_NB): `Ok(false)` when one does. Released as [`lock_exclusive`]'s is.
pub fn try_lock_exclusive(file: &File) -> Result<bool> {
    loop {
        // SAFETY: flock on a descriptor the borrowed File keeps open.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) => return Ok(false),
            Some(libc::EINTR) => continue,
            _ => return Err(Error::Syscall { call: "flock", source: e }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_descriptor_moved_out_of_the_way_is_the_same_file_high_up_and_close_on_exec() {
        let (r, w) = pipe().unwrap();
        let w = out_of_the_way(w);
        let floor = out_of_the_way_floor();
        assert!(w.as_raw_fd() >= floor && floor > 2, "moved to {} (floor {floor})", w.as_raw_fd());
        // SAFETY: F_GETFD on a descriptor we own only reads its flags.
        assert_eq!(unsafe { libc::fcntl(w.as_raw_fd(), libc::F_GETFD) } & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        assert_eq!(write(&w, b"x").unwrap(), 1);
        let mut buf = [0u8; 1];
        assert_eq!(read(&r, &mut buf).unwrap(), 1);
        assert_eq!(&buf, b"x");
    }

    #[test]
    fn a_pipe_carries_bytes_and_reports_end_of_file() {
        let (r, w) = pipe().unwrap();
        assert!(!poll_readable(&r, Duration::from_millis(1)).unwrap(), "empty pipe is not readable");
        assert_eq!(write(&w, &42u64.to_ne_bytes()).unwrap(), 8);
        assert!(poll_readable(&r, Duration::from_secs(5)).unwrap());
        let mut buf = [0u8; 8];
        assert_eq!(read(&r, &mut buf).unwrap(), 8);
        assert_eq!(u64::from_ne_bytes(buf), 42);
        drop(w);
        assert!(poll_readable(&r, Duration::from_secs(5)).unwrap(), "hang-up wakes poll");
        assert_eq!(read(&r, &mut buf).unwrap(), 0);
    }

    #[test]
    fn a_write_to_a_closed_descriptor_gives_ebadf() {
        let (r, w) = pipe().unwrap();
        let raw = w.as_raw_fd();
        drop(r);
        drop(w);
        assert_eq!(write_signal_safe(raw, b"x"), Err(libc::EBADF));
    }

    #[test]
    fn an_exclusive_lock_excludes_another_open_file_until_it_is_closed() {
        let scratch = crate::private_dir::PrivateDir::new("flock-test").unwrap();
        let path = scratch.join("lock");
        let a = File::create(&path).unwrap();
        lock_exclusive(&a).unwrap();
        let b = File::open(&path).unwrap();
        assert!(!try_lock_exclusive(&b).unwrap(), "the second open file must not get the lock");
        drop(a);
        assert!(try_lock_exclusive(&b).unwrap());
        std::fs::remove_file(&path).unwrap();
    }
}
