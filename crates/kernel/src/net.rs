//! Sockets and descriptors as the DLM runtime and memory server use them: waiting for input,
//! a non-blocking receive, the TCP options that detect a dead peer, and the process calls of a
//! spawned server (parent-death signal, termination).
//!
//! Shared preconditions: descriptors are open and owned by the caller. Errors name the call
//! and carry the errno taken right after it.

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

use crate::error::{Error, Result};

/// Wait up to `timeout` for `fd` to become readable (or hung up). `Ok(false)` on timeout and on
/// EINTR (a signal: the caller re-checks its stop flag and waits again).
pub fn poll(fd: RawFd, timeout: Duration) -> Result<bool> {
    let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd; poll only reads and writes it.
    let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(Error::Syscall { call: "poll", source: e });
    }
    Ok(rc > 0)
}

/// Receive without blocking into `buf` (recv(2) with MSG_DONTWAIT): `Ok(n)` bytes, `Ok(0)` when
/// nothing is there yet (EAGAIN, EINTR), an UnexpectedEof error when the peer closed. Returns
/// `io::Error` because callers sit on `io::Read`-style paths; allocation-free, also on errors.
pub fn recv_nonblocking(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: buf is writable for its length; MSG_DONTWAIT never blocks.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), libc::MSG_DONTWAIT) };
    if n > 0 {
        return Ok(n as usize);
    }
    if n == 0 {
        // From a kind: no allocation (callers may be in a signal handler).
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    let e = io::Error::last_os_error();
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(0),
        _ => Err(e),
    }
}

/// Bytes that can be received from socket `fd` right now without blocking (ioctl FIONREAD,
/// tcp(7) SIOCINQ). Allocation-free, also on errors.
pub fn bytes_readable(fd: RawFd) -> Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int to the pointer given.
    if unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) } != 0 {
        return Err(Error::last_os("ioctl(FIONREAD)"));
    }
    Ok(n.max(0) as usize)
}

fn setsockopt_int(fd: RawFd, level: i32, name: i32, value: i32, call: &'static str) -> Result<()> {
    // SAFETY: value is a valid int for the option's length.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &value as *const i32 as *const libc::c_void,
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(Error::last_os(call));
    }
    Ok(())
}

/// Detect a dead or partitioned TCP peer within about `timeout`: keepalive probes start after
/// `timeout / 3` of silence, three probes `timeout / 9` apart (SO_KEEPALIVE, TCP_KEEPIDLE,
/// TCP_KEEPINTVL, TCP_KEEPCNT), and data left unacknowledged for `timeout` fails the
/// connection (TCP_USER_TIMEOUT, tcp(7), Linux 2.6.37). A peer that is alive but stopped
/// (SIGSTOP) still acknowledges at the TCP level: only a receive timeout catches that
/// ([`set_recv_timeout`]).
pub fn set_dead_peer_timeout(fd: RawFd, timeout: Duration) -> Result<()> {
    let secs = (timeout.as_secs() as i32).max(3);
    setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1, "setsockopt(SO_KEEPALIVE)")?;
    setsockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, (secs / 3).max(1), "setsockopt(TCP_KEEPIDLE)")?;
    setsockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, (secs / 9).max(1), "setsockopt(TCP_KEEPINTVL)")?;
    setsockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3, "setsockopt(TCP_KEEPCNT)")?;
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    setsockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, ms, "setsockopt(TCP_USER_TIMEOUT)")
}

/// Make blocking receives on `fd` fail with EAGAIN after `timeout` without data (SO_RCVTIMEO;
/// `None`: wait forever).
pub fn set_recv_timeout(fd: RawFd, timeout: Option<Duration>) -> Result<()> {
    let t = timeout.unwrap_or(Duration::ZERO);
    let tv = libc::timeval { tv_sec: t.as_secs() as libc::time_t, tv_usec: t.subsec_micros() as libc::suseconds_t };
    // SAFETY: tv is a valid timeval for the option's length.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &tv as *const libc::timeval as *const libc::c_void,
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(Error::last_os("setsockopt(SO_RCVTIMEO)"));
    }
    Ok(())
}

/// Ask for `sig` when the parent thread dies (prctl PR_SET_PDEATHSIG). Async-signal-safe: may
/// run between fork and exec.
pub fn set_parent_death_signal(sig: i32) -> Result<()> {
    // SAFETY: PR_SET_PDEATHSIG takes a signal number and touches no memory of ours.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong) } != 0 {
        return Err(Error::last_os("prctl(PR_SET_PDEATHSIG)"));
    }
    Ok(())
}

/// Send `sig` to process `pid` (kill(2)).
pub fn kill(pid: i32, sig: i32) -> Result<()> {
    if pid <= 0 {
        return Err(Error::Invalid(format!("kill: pid {pid} names no single process")));
    }
    // SAFETY: kill touches no memory of ours.
    if unsafe { libc::kill(pid, sig) } != 0 {
        return Err(Error::last_os("kill"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    #[test]
    fn poll_and_recv_see_data_and_eof() {
        let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut buf = [0u8; 8];
        assert!(!poll(a.as_raw_fd(), Duration::from_millis(10)).unwrap());
        assert_eq!(recv_nonblocking(a.as_raw_fd(), &mut buf).unwrap(), 0);
        assert_eq!(bytes_readable(a.as_raw_fd()).unwrap(), 0);
        b.write_all(b"hey").unwrap();
        assert!(poll(a.as_raw_fd(), Duration::from_secs(5)).unwrap());
        assert_eq!(bytes_readable(a.as_raw_fd()).unwrap(), 3);
        assert_eq!(recv_nonblocking(a.as_raw_fd(), &mut buf).unwrap(), 3);
        assert_eq!(bytes_readable(a.as_raw_fd()).unwrap(), 0);
        assert_eq!(&buf[..3], b"hey");
        drop(b);
        let e = recv_nonblocking(a.as_raw_fd(), &mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn socket_options_apply_to_tcp_and_fail_on_a_bad_fd() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let s = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        set_dead_peer_timeout(s.as_raw_fd(), Duration::from_secs(9)).unwrap();
        set_recv_timeout(s.as_raw_fd(), Some(Duration::from_millis(1500))).unwrap();
        assert_eq!(s.read_timeout().unwrap(), Some(Duration::from_millis(1500)));
        let e = set_recv_timeout(-1, None).unwrap_err();
        assert_eq!(e.errno(), Some(libc::EBADF));
        assert!(e.to_string().contains("SO_RCVTIMEO"));
        assert!(bytes_readable(-1).unwrap_err().to_string().contains("FIONREAD"));
        assert!(kill(0, 0).is_err());
    }
}
