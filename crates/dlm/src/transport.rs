//! How messages travel between a client and a memory server. The runtime only needs an ordered,
//! reliable stream of (header, payload) messages in each direction; [`Transport`] is that and
//! nothing more, so an MPI transport can implement it next to [`TcpTransport`].

use std::io::{self, IoSlice, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use crate::auth::{Secret, NONCE_LEN, PROOF_LEN, SECRET_ENV};
use crate::proto::{Header, Opcode, Status, HEADER_LEN, REPLY_BIT, VERSION};

/// One client-to-server channel. Replies arrive in request order (PROTOCOL.md), so a caller may
/// send several requests before receiving.
pub trait Transport: Send {
    /// Send one message: the header followed by `payload`.
    fn send(&mut self, header: &Header, payload: &[u8]) -> io::Result<()>;
    /// Send several payload-less messages (READ requests) at once: one system call where the
    /// transport allows, so a batch of read-ahead requests costs the peer one wake-up.
    fn send_headers(&mut self, headers: &[Header]) -> io::Result<()> {
        headers.iter().try_for_each(|h| self.send(h, &[]))
    }
    /// Receive the next message's header (its payload must be taken with
    /// [`Transport::recv_payload`] or [`Transport::discard`] before the next header).
    fn recv_header(&mut self) -> io::Result<Header>;
    /// Receive a reply header, doing `work` while waiting for it: `work` does a small piece
    /// of useful work (a few µs) and returns false once it has none left. A transport that
    /// cannot look without blocking simply receives.
    fn recv_header_working(&mut self, work: &mut dyn FnMut() -> bool) -> io::Result<Header> {
        let _ = work;
        self.recv_header()
    }
    /// Receive exactly `buf.len()` payload bytes.
    fn recv_payload(&mut self, buf: &mut [u8]) -> io::Result<()>;
    /// Bytes that have arrived and can be received without waiting; 0 where the transport
    /// cannot tell (then nothing is taken early).
    fn arrived(&self) -> usize {
        0
    }
    /// Skip `len` payload bytes.
    fn discard(&mut self, mut len: usize) -> io::Result<()> {
        let mut sink = [0u8; 4096];
        while len > 0 {
            let n = len.min(sink.len());
            self.recv_payload(&mut sink[..n])?;
            len -= n;
        }
        Ok(())
    }
    /// The peer, for messages.
    fn peer(&self) -> String;
}

/// TCP with Nagle off (each request is one small message that must leave now).
///
/// Receiving a header first polls the socket without blocking for up to `spin` before it
/// sleeps: a reply that arrives within a few tens of microseconds is then taken without the
/// wake-up of a sleeping thread, which on this VM costs about as much as the transfer itself
/// (see dlm-fault). Between polls the caller's work runs (`recv_header_working`), or the thread
/// yields, so a server sharing the core still runs.
pub struct TcpTransport {
    stream: TcpStream,
    peer: String,
    spin: Duration,
    /// Encoded headers of a batch (allocated once: the fault path may run in a signal handler).
    batch: Vec<u8>,
}

/// Headers [`TcpTransport::send_headers`] encodes per system call.
const BATCH_HEADERS: usize = 64;

/// Default busy-poll budget of [`TcpTransport`].
pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);

/// How long the handshake may wait for the server, whatever the fault timeout.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

impl TcpTransport {
    /// Connect to the server at `addr`, prove the shared secret (`secret`, or when `None` the
    /// one in [`SECRET_ENV`]) and check the server's proof ([`client_handshake`]), then apply
    /// `timeout` ([`TcpTransport::with_timeout`]). The way every client opens a connection.
    pub fn open(addr: &str, secret: Option<&Secret>, timeout: Option<Duration>) -> io::Result<Self> {
        let mut t = Self::connect(addr)?;
        let from_env;
        let secret = match secret {
            Some(s) => s,
            None => {
                from_env =
                    Secret::from_env().map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
                from_env.as_ref().ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("no shared secret for the memory servers: set {SECRET_ENV} (or the config's secret)"),
                    )
                })?
            }
        };
        pagewise_kernel::net::set_recv_timeout(t.stream.as_raw_fd(), Some(HANDSHAKE_TIMEOUT))
            .map_err(|e| io::Error::other(e.to_string()))?;
        client_handshake(&mut t, secret)?;
        t.with_timeout(timeout)
    }

    /// A TCP connection without the handshake: [`TcpTransport::open`] is what clients use.
    pub fn connect(addr: &str) -> io::Result<Self> {
        let addrs: Vec<SocketAddr> = addr.to_socket_addrs()?.collect();
        // A program's own descriptors are placed by number: keep the connection off them.
        let stream = TcpStream::from(pagewise_kernel::fd::out_of_the_way(TcpStream::connect(&addrs[..])?.into()));
        stream.set_nodelay(true)?;
        Ok(TcpTransport {
            stream,
            peer: addr.to_string(),
            spin: DEFAULT_SPIN,
            batch: Vec::with_capacity(BATCH_HEADERS * HEADER_LEN),
        })
    }

    /// Fail a receive that waits longer than `timeout` for the server (ErrorKind::TimedOut),
    /// and let TCP itself give up on a dead or partitioned peer within about `timeout`
    /// (keepalive, TCP_USER_TIMEOUT). A stopped server still acknowledges at the TCP level,
    /// so the receive timeout is what catches it.
    pub fn with_timeout(self, timeout: Option<Duration>) -> io::Result<Self> {
        let fd = self.stream.as_raw_fd();
        let io = |e: pagewise_kernel::Error| io::Error::other(e.to_string());
        if let Some(t) = timeout {
            pagewise_kernel::net::set_dead_peer_timeout(fd, t).map_err(io)?;
        }
        pagewise_kernel::net::set_recv_timeout(fd, timeout).map_err(io)?;
        Ok(self)
    }

    /// Set the busy-poll budget (zero: always block).
    pub fn with_spin(mut self, spin: Duration) -> Self {
        self.spin = spin;
        self
    }

    /// Non-blocking receive into `buf`; Ok(0) when nothing is there yet.
    fn try_recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        pagewise_kernel::net::recv_nonblocking(self.stream.as_raw_fd(), buf)
    }
}

/// Longest message a handshake or error reply may carry.
const MAX_MESSAGE: u32 = 4096;

/// The client's half of the handshake (PROTOCOL.md, "Handshake"): send HELLO with a fresh
/// nonce, check the server's proof of the secret, answer with ours in AUTH. Any failure is an
/// error naming what went wrong (ErrorKind::PermissionDenied when a secret was refused), and
/// the connection must be dropped.
pub fn client_handshake(t: &mut dyn Transport, secret: &Secret) -> io::Result<()> {
    let peer = t.peer();
    let broken = |what: String| io::Error::new(io::ErrorKind::InvalidData, format!("handshake with {peer}: {what}"));
    let denied =
        |what: String| io::Error::new(io::ErrorKind::PermissionDenied, format!("handshake with {peer}: {what}"));
    let client_nonce = crate::auth::nonce().map_err(|e| io::Error::other(e.to_string()))?;
    let mut hello = Header::request(Opcode::Hello, 1);
    hello.length = NONCE_LEN as u32;
    t.send(&hello, &client_nonce)?;
    let rep = t.recv_header()?;
    let expect = |rep: &Header, op: Opcode, id: u32| -> Result<(), String> {
        if rep.magic != crate::proto::MAGIC {
            Err(format!("bad magic {:#010x} (is this a DLM memory server?)", rep.magic))
        } else if rep.opcode != op as u8 | REPLY_BIT || rep.request_id != id {
            Err(format!("unexpected reply (opcode {:#x}, request id {})", rep.opcode, rep.request_id))
        } else if rep.length > MAX_MESSAGE {
            Err(format!("reply of {} bytes (at most {MAX_MESSAGE} expected)", rep.length))
        } else {
            Ok(())
        }
    };
    let refused = |t: &mut dyn Transport, rep: &Header| -> io::Error {
        let mut msg = vec![0u8; rep.length.min(MAX_MESSAGE) as usize];
        let text = match t.recv_payload(&mut msg) {
            Ok(()) => String::from_utf8_lossy(&msg).into_owned(),
            Err(e) => format!("(message lost: {e})"),
        };
        let name = Status::from_u16(rep.status).map(|s| s.name()).unwrap_or("unknown status");
        if rep.status == Status::Auth as u16 {
            denied(format!("{name}: {text}"))
        } else {
            broken(format!("{name}: {text}"))
        }
    };
    // A server of another version answers (BAD_VERSION) before anything else is checked.
    if rep.magic == crate::proto::MAGIC && rep.version != VERSION {
        return Err(if rep.length <= MAX_MESSAGE && rep.status != 0 {
            let e = refused(t, &rep);
            broken(format!("the server speaks protocol version {}, this client {VERSION}: {e}", rep.version))
        } else {
            broken(format!("the server speaks protocol version {}, this client {VERSION}", rep.version))
        });
    }
    expect(&rep, Opcode::Hello, 1).map_err(broken)?;
    if rep.status != Status::Ok as u16 {
        return Err(refused(t, &rep));
    }
    if rep.length as usize != NONCE_LEN + PROOF_LEN {
        return Err(broken(format!("HELLO reply of {} bytes, expected {}", rep.length, NONCE_LEN + PROOF_LEN)));
    }
    let mut body = [0u8; NONCE_LEN + PROOF_LEN];
    t.recv_payload(&mut body)?;
    let mut server_nonce = [0u8; NONCE_LEN];
    server_nonce.copy_from_slice(&body[..NONCE_LEN]);
    if !secret.verify_server(&client_nonce, &server_nonce, &body[NONCE_LEN..]) {
        return Err(denied(
            "the server does not prove the shared secret (another secret, or not the server meant)".into(),
        ));
    }
    let mut auth = Header::request(Opcode::Auth, 2);
    auth.length = PROOF_LEN as u32;
    t.send(&auth, &secret.client_proof(&client_nonce, &server_nonce))?;
    let rep = t.recv_header()?;
    expect(&rep, Opcode::Auth, 2).map_err(broken)?;
    if rep.status != Status::Ok as u16 {
        return Err(refused(t, &rep));
    }
    if rep.length != 0 {
        return Err(broken(format!("AUTH reply of {} bytes, expected none", rep.length)));
    }
    Ok(())
}

/// Write `head` then `body` with as few syscalls as the kernel allows (one `writev` normally).
/// Allocation-free: the fault path may run in a signal handler.
pub fn write_two(w: &mut impl Write, head: &[u8], body: &[u8]) -> io::Result<()> {
    let total = head.len() + body.len();
    let mut done = 0usize;
    while done < total {
        let r = if done < head.len() {
            w.write_vectored(&[IoSlice::new(&head[done..]), IoSlice::new(body)])
        } else {
            w.write(&body[done - head.len()..])
        };
        match r {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "connection closed while sending")),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// SO_RCVTIMEO expiring shows as EAGAIN: call it what it is (no allocation).
fn timed_out(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::WouldBlock {
        io::ErrorKind::TimedOut.into()
    } else {
        e
    }
}

impl Transport for TcpTransport {
    fn send(&mut self, header: &Header, payload: &[u8]) -> io::Result<()> {
        write_two(&mut self.stream, &header.encode(), payload)
    }

    fn send_headers(&mut self, headers: &[Header]) -> io::Result<()> {
        for chunk in headers.chunks(BATCH_HEADERS) {
            self.batch.clear();
            chunk.iter().for_each(|h| self.batch.extend_from_slice(&h.encode()));
            self.stream.write_all(&self.batch)?;
        }
        Ok(())
    }

    fn recv_header(&mut self) -> io::Result<Header> {
        self.recv_header_working(&mut || false)
    }

    fn recv_header_working(&mut self, work: &mut dyn FnMut() -> bool) -> io::Result<Header> {
        let mut b = [0u8; HEADER_LEN];
        let mut got = 0;
        if !self.spin.is_zero() {
            let start = Instant::now();
            while got < HEADER_LEN && start.elapsed() < self.spin {
                let n = self.try_recv(&mut b[got..])?;
                if n == 0 && !work() {
                    std::thread::yield_now();
                }
                got += n;
            }
        }
        self.stream.read_exact(&mut b[got..]).map_err(timed_out)?;
        Ok(Header::decode(&b))
    }

    fn recv_payload(&mut self, buf: &mut [u8]) -> io::Result<()> {
        self.stream.read_exact(buf).map_err(timed_out)
    }

    fn arrived(&self) -> usize {
        pagewise_kernel::net::bytes_readable(self.stream.as_raw_fd()).unwrap_or(0)
    }

    fn peer(&self) -> String {
        self.peer.clone()
    }
}
