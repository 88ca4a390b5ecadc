//! The memory server: holds the master copy of the pages homed on it (PROTOCOL.md).
//!
//! One thread per client connection; each connection owns its regions, each region one
//! contiguous anonymous mapping so that a unit of any set count is one slice of memory and one
//! message. Capacity is reserved before a region is mapped, so a request beyond capacity gets
//! `NO_SPACE` instead of driving the host into the OOM killer. Bad input is answered per
//! PROTOCOL.md and never panics; a connection's regions are unmapped when it ends, however it
//! ends. Clients are bounded (`ServerConfig::max_clients`), dead ones are found by TCP
//! keepalive, idle ones can be ended (`idle_timeout`), and a region id is never that of a live
//! region, also after the id counter wraps.

use std::collections::HashMap;
use std::io::{self, Read};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use pagewise_kernel::mem::{madvise, Advice, MapOptions, Mapping};
use serde::Serialize;

use crate::proto::{Header, Opcode, Status, HEADER_LEN, MAX_BASE_PAGE, MAX_PAYLOAD, MIN_BASE_PAGE};
use crate::transport::write_two;

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
    /// End a connection (freeing its regions) after this long without a byte from the client;
    /// `None`: never. Dead clients are found anyway through TCP keepalive.
    pub idle_timeout: Option<std::time::Duration>,
}

impl ServerConfig {
    /// A server on `listen` holding at most `capacity` bytes, with the default limits (256
    /// clients, no idle timeout).
    pub fn new(listen: impl Into<String>, capacity: u64) -> Self {
        ServerConfig { listen: listen.into(), capacity, verbose: false, max_clients: 256, idle_timeout: None }
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
}

struct Shared {
    counters: Counters,
    capacity: u64,
    verbose: bool,
    max_clients: usize,
    idle_timeout: Option<std::time::Duration>,
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
                idle_timeout: cfg.idle_timeout,
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
    // A client that vanished without a FIN (host down, link cut) is found by keepalive.
    let _ = pagewise_kernel::net::set_dead_peer_timeout(fd, std::time::Duration::from_secs(60));
    if let Err(e) = pagewise_kernel::net::set_recv_timeout(fd, shared.idle_timeout) {
        return format!("cannot set the idle timeout: {e}");
    }
    let mut conn = Conn { stream, regions: HashMap::new(), next_region: 1, shared };
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
            let mut b = [0u8; HEADER_LEN];
            match read_full(&mut self.stream, &mut b) {
                Ok(0) => return "closed".into(),
                Ok(n) if n < HEADER_LEN => return format!("truncated header ({n} bytes)"),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut => {
                    return "idle timeout".into()
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
                if !base.is_power_of_two() || !(MIN_BASE_PAGE..=MAX_BASE_PAGE).contains(&base) {
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
                // Base pages are whole pages (MIN_BASE_PAGE), so the range is page-aligned:
                // MADV_DONTNEED frees it and it reads as zeros again.
                if let Err(e) = madvise(r.mem.addr() + off as usize, len, Advice::DontNeed) {
                    return self.error(h, Status::Server, &e.to_string(), false);
                }
                self.reply(h, Status::Ok, &[])?;
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
