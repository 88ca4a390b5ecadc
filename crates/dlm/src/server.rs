//! The memory server: holds the master copy of the pages homed on it (PROTOCOL.md).
//!
//! One thread per client connection; each connection owns its regions, each region one
//! contiguous anonymous mapping so that a unit of any set count is one slice of memory and one
//! message. Capacity is reserved before a region is mapped, so a request beyond capacity gets
//! `NO_SPACE` instead of driving the host into the OOM killer. Bad input is answered per
//! PROTOCOL.md and never panics; a connection's regions are unmapped when it ends, however it
//! ends. Only clients that prove the shared secret get past the handshake (PROTOCOL.md,
//! "Handshake"; `auth.rs`), within [`HANDSHAKE_TIMEOUT`]. Clients are bounded
//! (`ServerConfig::max_clients`); a client whose host stops answering is found by TCP
//! keepalive, which the client's kernel answers however long its program goes without a
//! request, so a live client keeps its regions and a dead one loses them within
//! `dead_peer_timeout` (PROTOCOL.md, "Lifetime"). A region id is never that of a live region,
//! also after the id counter wraps.

use std::collections::HashMap;
use std::io::{self, Read};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use pagewise_kernel::mem::{madvise, Advice, MapOptions, Mapping};
use serde::Serialize;

use crate::auth::{Secret, NONCE_LEN, PROOF_LEN};
use crate::proto::{Header, Opcode, Status, HEADER_LEN, MAX_BASE_PAGE, MAX_PAYLOAD, MIN_GRANULE};
use crate::transport::{write_two, HANDSHAKE_TIMEOUT};

/// How long a client's host may go without answering before its connection ends, when
/// `ServerConfig::dead_peer_timeout` is not given.
pub const DEFAULT_DEAD_PEER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Default of `ServerConfig::spin`.
pub const DEFAULT_SPIN: std::time::Duration = std::time::Duration::from_micros(50);

/// How to run a server.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// ADDR:PORT to listen on (port 0: any free port, printed on stderr).
    pub listen: String,
    /// Bytes of client pages this server may hold.
    pub capacity: u64,
    /// Log each connection on stderr.
    pub verbose: bool,
    /// Most clients connected at once; a connection beyond it is closed at once (and counted
    /// as an error), so a flood of connections cannot exhaust threads or memory.
    pub max_clients: usize,
    /// End a connection (freeing its regions) once the client's host has not answered TCP
    /// keepalive probes for about this long (at least 3 s; `None`:
    /// [`DEFAULT_DEAD_PEER_TIMEOUT`]). A live client that makes no request keeps its regions:
    /// its kernel answers the probes.
    pub dead_peer_timeout: Option<std::time::Duration>,
    /// After answering, watch the connection this long for the client's next request before
    /// sleeping (zero: sleep at once). A request that finds its server thread asleep waits for
    /// a wake-up on the server's CPU — on a VM a halted vCPU the host must wake — and a
    /// program paging at full speed sends its next request within tens of microseconds.
    pub spin: std::time::Duration,
    /// The secret clients must prove at connect.
    pub secret: Secret,
}

impl ServerConfig {
    /// A server on `listen` holding at most `capacity` bytes for clients that know `secret`,
    /// with the default limits (256 clients, [`DEFAULT_DEAD_PEER_TIMEOUT`]).
    pub fn new(listen: impl Into<String>, capacity: u64, secret: Secret) -> Self {
        ServerConfig {
            listen: listen.into(),
            capacity,
            verbose: false,
            max_clients: 256,
            dead_peer_timeout: None,
            spin: DEFAULT_SPIN,
            secret,
        }
    }
}

/// Counters of the whole server.
#[derive(Debug, Default)]
pub struct Counters {
    pub requests: AtomicU64,
    pub errors: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub resident_bytes: AtomicU64,
    pub clients: AtomicU64,
    pub regions: AtomicU64,
    pub auth_failures: AtomicU64,
}

/// A snapshot of [`Counters`], as STATS and `--json` report it.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct ServerStats {
    pub requests: u64,
    pub errors: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub resident_bytes: u64,
    pub capacity_bytes: u64,
    pub clients: u64,
    pub regions: u64,
    /// Connections that failed or skipped the handshake.
    #[serde(default)]
    pub auth_failures: u64,
}

struct Shared {
    counters: Counters,
    capacity: u64,
    verbose: bool,
    max_clients: usize,
    dead_peer_timeout: std::time::Duration,
    spin: std::time::Duration,
    secret: Secret,
}

impl Shared {
    fn snapshot(&self) -> ServerStats {
        let c = &self.counters;
        ServerStats {
            requests: c.requests.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            bytes_in: c.bytes_in.load(Ordering::Relaxed),
            bytes_out: c.bytes_out.load(Ordering::Relaxed),
            resident_bytes: c.resident_bytes.load(Ordering::Relaxed),
            capacity_bytes: self.capacity,
            clients: c.clients.load(Ordering::Relaxed),
            regions: c.regions.load(Ordering::Relaxed),
            auth_failures: c.auth_failures.load(Ordering::Relaxed),
        }
    }

    /// Reserve `bytes` of capacity; false when it would exceed it.
    fn reserve(&self, bytes: u64) -> bool {
        self.counters
            .resident_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                cur.checked_add(bytes).filter(|&n| n <= self.capacity)
            })
            .is_ok()
    }

    fn release(&self, bytes: u64) {
        self.counters.resident_bytes.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// A listening server. [`Server::run`] serves until `shutdown` becomes true.
pub struct Server {
    listener: TcpListener,
    shared: Arc<Shared>,
}

impl Server {
    pub fn bind(cfg: &ServerConfig) -> io::Result<Self> {
        let listener = TcpListener::bind(&cfg.listen)?;
        listener.set_nonblocking(true)?;
        Ok(Server {
            listener,
            shared: Arc::new(Shared {
                counters: Counters::default(),
                capacity: cfg.capacity,
                verbose: cfg.verbose,
                max_clients: cfg.max_clients,
                dead_peer_timeout: cfg.dead_peer_timeout.unwrap_or(DEFAULT_DEAD_PEER_TIMEOUT),
                spin: cfg.spin,
                secret: cfg.secret.clone(),
            }),
        })
    }

    pub fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.listener.local_addr()
    }

    pub fn stats(&self) -> ServerStats {
        self.shared.snapshot()
    }

    /// Accept and serve clients until `shutdown` is set (checked every 100 ms).
    pub fn run(&self, shutdown: &AtomicBool) -> io::Result<ServerStats> {
        while !shutdown.load(Ordering::Relaxed) {
            // Timeout or EINTR (a signal): re-check the flag.
            if !pagewise_kernel::net::poll(self.listener.as_raw_fd(), std::time::Duration::from_millis(100))
                .map_err(io::Error::other)?
            {
                continue;
            }
            match self.listener.accept() {
                Ok((stream, peer)) => {
                    if self.shared.counters.clients.load(Ordering::Relaxed) as usize >= self.shared.max_clients {
                        self.shared.counters.errors.fetch_add(1, Ordering::Relaxed);
                        eprintln!(
                            "dlm-server: refusing {peer}: already {} clients (--max-clients)",
                            self.shared.max_clients
                        );
                        drop(stream);
                        continue;
                    }
                    // Counted here, before the thread starts, so a burst cannot overshoot.
                    self.shared.counters.clients.fetch_add(1, Ordering::Relaxed);
                    let shared = Arc::clone(&self.shared);
                    let spawned = std::thread::Builder::new().name(format!("dlm-conn-{peer}")).spawn(move || {
                        if shared.verbose {
                            eprintln!("dlm-server: client {peer} connected");
                        }
                        let why = serve_connection(stream, &shared);
                        shared.counters.clients.fetch_sub(1, Ordering::Relaxed);
                        if shared.verbose {
                            eprintln!("dlm-server: client {peer} gone ({why})");
                        }
                    });
                    if let Err(e) = spawned {
                        self.shared.counters.clients.fetch_sub(1, Ordering::Relaxed);
                        eprintln!("dlm-server: cannot start a thread for {peer}: {e}");
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => eprintln!("dlm-server: accept: {e}"),
            }
        }
        Ok(self.shared.snapshot())
    }
}

struct Region {
    mem: Mapping,
    base_page: u64,
    pages: u64,
}

/// Serve one connection until it ends; returns why it ended. Its regions are dropped (unmapped
/// and their capacity released) on every way out.
fn serve_connection(stream: TcpStream, shared: &Shared) -> String {
    let _ = stream.set_nodelay(true);
    let fd = stream.as_raw_fd();
    // A client that vanished without a FIN (host down, link cut) is found by keepalive: the
    // kernel probes an idle connection and ends it when the probes go unanswered. A live
    // client's kernel answers them, however long its program goes without a request, so no
    // receive timeout applies once the client is in (issue 23: an idle timeout on requests
    // freed the regions of live programs busy with their local pages).
    if let Err(e) = pagewise_kernel::net::set_dead_peer_timeout(fd, shared.dead_peer_timeout) {
        return format!("cannot enable keepalive: {e}");
    }
    if let Err(e) = pagewise_kernel::net::set_recv_timeout(fd, Some(HANDSHAKE_TIMEOUT)) {
        return format!("cannot set the handshake timeout: {e}");
    }
    let mut conn = Conn { stream, regions: HashMap::new(), next_region: 1, shared };
    if let Err(why) = conn.handshake() {
        shared.counters.auth_failures.fetch_add(1, Ordering::Relaxed);
        return format!("handshake failed: {why}");
    }
    if let Err(e) = pagewise_kernel::net::set_recv_timeout(fd, None) {
        return format!("cannot clear the handshake timeout: {e}");
    }
    let why = conn.serve();
    for (_, r) in conn.regions.drain() {
        shared.release(r.mem.len() as u64);
        shared.counters.regions.fetch_sub(1, Ordering::Relaxed);
    }
    why
}

struct Conn<'a> {
    stream: TcpStream,
    regions: HashMap<u32, Region>,
    next_region: u32,
    shared: &'a Shared,
}

/// What to do after answering a request.
enum After {
    Continue,
    Close,
}

impl Conn<'_> {
    fn serve(&mut self) -> String {
        loop {
            self.await_briefly();
            let mut b = [0u8; HEADER_LEN];
            match read_full(&mut self.stream, &mut b) {
                Ok(0) => return "closed".into(),
                Ok(n) if n < HEADER_LEN => return format!("truncated header ({n} bytes)"),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                    return "the client's host stopped answering (keepalive)".into()
                }
                Err(e) => return format!("read error: {e}"),
            }
            let h = Header::decode(&b);
            self.shared.counters.requests.fetch_add(1, Ordering::Relaxed);
            self.shared.counters.bytes_in.fetch_add(HEADER_LEN as u64, Ordering::Relaxed);
            match self.handle(&h) {
                Ok(After::Continue) => {}
                Ok(After::Close) => return "closed after a stream-breaking error".into(),
                Err(e) => return format!("i/o error: {e}"),
            }
        }
    }

    /// Watch the connection for up to `spin` (`ServerConfig::spin`), yielding the CPU between
    /// looks so that other threads sharing it still run.
    fn await_briefly(&self) {
        let spin = self.shared.spin;
        if spin.is_zero() {
            return;
        }
        let fd = self.stream.as_raw_fd();
        let start = std::time::Instant::now();
        while pagewise_kernel::net::bytes_readable(fd).is_ok_and(|n| n == 0) && start.elapsed() < spin {
            std::thread::yield_now();
        }
    }

    /// The server's half of the handshake (PROTOCOL.md, "Handshake"). Nothing but HELLO and
    /// then AUTH is accepted, nothing the client sends is swallowed or allocated for, and any
    /// failure ends the connection (after a reply saying why, where one can be sent).
    fn handshake(&mut self) -> Result<(), String> {
        let (hello, client_nonce) = self.handshake_message::<NONCE_LEN>(Opcode::Hello)?;
        let server_nonce = crate::auth::nonce().map_err(|e| e.to_string())?;
        let mut body = [0u8; NONCE_LEN + PROOF_LEN];
        body[..NONCE_LEN].copy_from_slice(&server_nonce);
        body[NONCE_LEN..].copy_from_slice(&self.shared.secret.server_proof(&client_nonce, &server_nonce));
        self.reply(&hello, Status::Ok, &body).map_err(|e| e.to_string())?;
        let (auth, proof) = self.handshake_message::<PROOF_LEN>(Opcode::Auth)?;
        if !self.shared.secret.verify_client(&client_nonce, &server_nonce, &proof) {
            self.shared.counters.errors.fetch_add(1, Ordering::Relaxed);
            let _ = self.reply(&auth, Status::Auth, b"wrong secret");
            return Err("wrong secret".into());
        }
        self.reply(&auth, Status::Ok, &[]).map_err(|e| e.to_string())
    }

    /// Read handshake message `op` with its payload of exactly N bytes.
    fn handshake_message<const N: usize>(&mut self, op: Opcode) -> Result<(Header, [u8; N]), String> {
        let mut b = [0u8; HEADER_LEN];
        match read_full(&mut self.stream, &mut b) {
            Ok(n) if n == HEADER_LEN => {}
            Ok(n) => return Err(format!("closed during the handshake ({n} header bytes)")),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut => {
                return Err(format!("no handshake within {HANDSHAKE_TIMEOUT:?}"))
            }
            Err(e) => return Err(format!("read error: {e}")),
        }
        let h = Header::decode(&b);
        self.shared.counters.requests.fetch_add(1, Ordering::Relaxed);
        self.shared.counters.bytes_in.fetch_add(HEADER_LEN as u64, Ordering::Relaxed);
        let refuse = |conn: &mut Self, status: Status, msg: String| {
            conn.shared.counters.errors.fetch_add(1, Ordering::Relaxed);
            let _ = conn.reply(&h, status, msg.as_bytes());
            Err(msg)
        };
        if let Err((status, msg)) = h.check() {
            return refuse(self, status, msg);
        }
        if h.opcode != op as u8 {
            let msg = format!("expected {op:?} (opcode {}), got opcode {}: authenticate first", op as u8, h.opcode);
            return refuse(self, Status::Auth, msg);
        }
        if h.length as usize != N {
            return refuse(self, Status::Auth, format!("{op:?} payload must be {N} bytes, not {}", h.length));
        }
        let mut payload = [0u8; N];
        self.stream.read_exact(&mut payload).map_err(|e| format!("read error: {e}"))?;
        self.shared.counters.bytes_in.fetch_add(N as u64, Ordering::Relaxed);
        Ok((h, payload))
    }

    fn error(&mut self, req: &Header, status: Status, msg: &str, swallow: bool) -> io::Result<After> {
        self.shared.counters.errors.fetch_add(1, Ordering::Relaxed);
        if swallow && req.length > 0 {
            self.swallow(req.length as usize)?;
        }
        self.reply(req, status, msg.as_bytes())?;
        Ok(After::Continue)
    }

    fn swallow(&mut self, mut len: usize) -> io::Result<()> {
        let mut sink = [0u8; 8192];
        while len > 0 {
            let n = len.min(sink.len());
            self.stream.read_exact(&mut sink[..n])?;
            self.shared.counters.bytes_in.fetch_add(n as u64, Ordering::Relaxed);
            len -= n;
        }
        Ok(())
    }

    fn reply(&mut self, req: &Header, status: Status, payload: &[u8]) -> io::Result<()> {
        let h = Header::reply_to(req, status, payload.len() as u32);
        write_two(&mut self.stream, &h.encode(), payload)?;
        self.shared.counters.bytes_out.fetch_add((HEADER_LEN + payload.len()) as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Validate a READ/WRITE page range: Ok((region id, byte offset, byte length)).
    fn range(&self, h: &Header) -> Result<(u64, usize), (Status, String)> {
        let r = self.regions.get(&h.region).ok_or((Status::BadRegion, format!("no region {}", h.region)))?;
        if h.set_count == 0 {
            return Err((Status::BadSize, "set count 0".into()));
        }
        let bytes = (h.set_count as u64).checked_mul(r.base_page).filter(|&b| b <= MAX_PAYLOAD as u64);
        let Some(bytes) = bytes else {
            return Err((Status::BadSize, format!("set count {} too large", h.set_count)));
        };
        let end = h.page.checked_add(h.set_count as u64);
        if end.is_none_or(|e| e > r.pages) {
            return Err((
                Status::OutOfRange,
                format!("pages {}+{} outside region {} of {} pages", h.page, h.set_count, h.region, r.pages),
            ));
        }
        Ok((h.page * r.base_page, bytes as usize))
    }

    fn handle(&mut self, h: &Header) -> io::Result<After> {
        if let Err((status, msg)) = h.check() {
            self.shared.counters.errors.fetch_add(1, Ordering::Relaxed);
            self.reply(h, status, msg.as_bytes())?;
            return Ok(After::Close);
        }
        let Some(op) = Opcode::from_u8(h.opcode) else {
            return self.error(h, Status::BadOpcode, &format!("unknown opcode {}", h.opcode), true);
        };
        match op {
            Opcode::Alloc => {
                if h.length != 4 {
                    return self.error(h, Status::BadSize, "ALLOC payload must be 4 bytes", true);
                }
                let mut b = [0u8; 4];
                self.stream.read_exact(&mut b)?;
                self.shared.counters.bytes_in.fetch_add(4, Ordering::Relaxed);
                let base = u32::from_le_bytes(b);
                if !base.is_power_of_two() || !(MIN_GRANULE..=MAX_BASE_PAGE).contains(&base) {
                    return self.error(h, Status::BadSize, &format!("bad base page size {base}"), false);
                }
                let bytes = h.page.checked_mul(base as u64).filter(|&b| b > 0 && b <= (1u64 << 47));
                let Some(bytes) = bytes else {
                    return self.error(h, Status::BadSize, &format!("impossible region of {} pages", h.page), false);
                };
                if !self.shared.reserve(bytes) {
                    let msg = format!(
                        "region of {bytes} bytes exceeds capacity ({} of {} in use)",
                        self.shared.counters.resident_bytes.load(Ordering::Relaxed),
                        self.shared.capacity
                    );
                    return self.error(h, Status::NoSpace, &msg, false);
                }
                let mem =
                    match Mapping::anonymous(bytes as usize, &MapOptions { noreserve: true, ..Default::default() }) {
                        Ok(m) => m,
                        Err(e) => {
                            self.shared.release(bytes);
                            return self.error(h, Status::Server, &e.to_string(), false);
                        }
                    };
                // Never hand out the id of a live region, also after the counter wraps.
                let mut id = self.next_region;
                while self.regions.contains_key(&id) {
                    id = id.wrapping_add(1).max(1);
                }
                self.next_region = id.wrapping_add(1).max(1);
                self.regions.insert(id, Region { mem, base_page: base as u64, pages: h.page });
                self.shared.counters.regions.fetch_add(1, Ordering::Relaxed);
                let mut rep = *h;
                rep.region = id;
                self.reply(&rep, Status::Ok, &[])?;
            }
            Opcode::Free => {
                if h.length != 0 {
                    return self.error(h, Status::BadSize, "FREE takes no payload", true);
                }
                match self.regions.remove(&h.region) {
                    Some(r) => {
                        self.shared.release(r.mem.len() as u64);
                        self.shared.counters.regions.fetch_sub(1, Ordering::Relaxed);
                        self.reply(h, Status::Ok, &[])?;
                    }
                    None => return self.error(h, Status::BadRegion, &format!("no region {}", h.region), false),
                }
            }
            Opcode::Read => {
                if h.length != 0 {
                    return self.error(h, Status::BadSize, "READ takes no payload", true);
                }
                let (off, len) = match self.range(h) {
                    Ok(x) => x,
                    Err((s, m)) => return self.error(h, s, &m, false),
                };
                let r = &self.regions[&h.region];
                // SAFETY: off+len lies inside the region (checked by range()); only this
                // connection's thread touches its regions.
                let data = unsafe { std::slice::from_raw_parts(r.mem.as_ptr().add(off as usize), len) };
                let rep = Header::reply_to(h, Status::Ok, len as u32);
                write_two(&mut self.stream, &rep.encode(), data)?;
                self.shared.counters.bytes_out.fetch_add((HEADER_LEN + len) as u64, Ordering::Relaxed);
            }
            Opcode::Write => {
                let (off, len) = match self.range(h) {
                    Ok(x) => x,
                    Err((s, m)) => return self.error(h, s, &m, true),
                };
                if h.length as usize != len {
                    let m = format!("WRITE payload {} bytes, set count needs {len}", h.length);
                    return self.error(h, Status::BadSize, &m, true);
                }
                let r = &self.regions[&h.region];
                // SAFETY: as for READ; exclusive to this thread.
                let data = unsafe { std::slice::from_raw_parts_mut(r.mem.as_ptr().add(off as usize), len) };
                self.stream.read_exact(data)?;
                self.shared.counters.bytes_in.fetch_add(len as u64, Ordering::Relaxed);
                self.reply(h, Status::Ok, &[])?;
            }
            Opcode::Discard => {
                if h.length != 0 {
                    return self.error(h, Status::BadSize, "DISCARD takes no payload", true);
                }
                let (off, len) = match self.range(h) {
                    Ok(x) => x,
                    Err((s, m)) => return self.error(h, s, &m, false),
                };
                let r = &self.regions[&h.region];
                // The whole pages inside the range are freed (MADV_DONTNEED: they read as zeros
                // again); granules below a page (pieces of a page under erasure coding) leave
                // partial pages at its ends, which are zeroed.
                let (start, end) = (r.mem.addr() + off as usize, r.mem.addr() + off as usize + len);
                let page = pagewise_kernel::mem::page_size();
                let (inner_start, inner_end) = (start.next_multiple_of(page), end / page * page);
                let zero = |from: usize, to: usize| {
                    // SAFETY: [from, to) lies inside the region (checked by range()), which
                    // only this connection's thread touches.
                    unsafe { std::ptr::write_bytes(from as *mut u8, 0, to - from) };
                };
                if inner_start >= inner_end {
                    zero(start, end);
                } else {
                    zero(start, inner_start);
                    zero(inner_end, end);
                    if let Err(e) = madvise(inner_start, inner_end - inner_start, Advice::DontNeed) {
                        return self.error(h, Status::Server, &e.to_string(), false);
                    }
                }
                self.reply(h, Status::Ok, &[])?;
            }
            Opcode::Hello | Opcode::Auth => {
                return self.error(
                    h,
                    Status::BadOpcode,
                    "the handshake is over: HELLO and AUTH come first, once",
                    true,
                );
            }
            Opcode::Stats => {
                if h.length != 0 {
                    return self.error(h, Status::BadSize, "STATS takes no payload", true);
                }
                let json = serde_json::to_vec(&self.shared.snapshot()).unwrap_or_default();
                self.reply(h, Status::Ok, &json)?;
            }
        }
        Ok(After::Continue)
    }
}

/// Read until `buf` is full or the peer closes; returns the bytes read.
fn read_full(s: &mut TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match s.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}
