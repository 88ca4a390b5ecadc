//! The network side: an acceptor thread and `-t` worker threads, each running a mio (epoll)
//! event loop over its connections, as memcached's libevent workers do.
//!
//! Why mio and not a thread per connection: measured on this 2-core VM (kvcache-load, 200,000
//! records, 3 interleaved rounds, machine shared with other builds) the two were within noise
//! of each other — 2 connections × 32 pipelined gets: mio 385k/306k/157k ops/s, thread per
//! connection 267k/353k/229k; 8 connections × 1 get: 45k/36k/25k vs 43k/40k/44k — so the
//! choice falls to what bounds resources: with `-c 1024` a thread per connection means up to
//! a thousand threads on 2 cores, an event loop means `-t`. tokio would add a runtime the
//! cache's one mutex and memcpy-under-lock design does not use.
//!
//! Per connection: bytes are read into a buffer, complete commands are executed against the
//! cache (one mutex; see [`crate::cache`]), replies collect in an output buffer that is written
//! when the loop gets to it. Fairness and hostile clients:
//! - a connection gets at most [`READS_PER_TURN`] reads per turn, then goes to the back of the
//!   worker's ready queue, so one pipelining client cannot starve the others;
//! - a client that does not read its replies stops being read once its output exceeds
//!   [`OUT_MAX`] (back-pressure, as memcached stops reading while it cannot write);
//! - a line longer than [`LINE_MAX`](crate::proto::LINE_MAX) closes the connection after
//!   `CLIENT_ERROR line too long` (no way to find the next command);
//! - EOF after a partial command closes the connection (after flushing replies).
//!
//! An idle worker of a server confined to some of the CPUs polls `epoll` for a while before it
//! sleeps in it ([`crate::idle`]: up to `--poll-us`, adapted to the gaps between requests,
//! stopped when another task wants the core). On a virtual machine the wake-up of a
//! worker asleep on an idle vCPU is paid by the client, inside its `send`: under YCSB's Java
//! client (4 threads on one core, the server on the other) a request's `write` took 15 µs when
//! the worker slept and 3 µs when it was awake (ftrace), and each wake-up avoided saved the
//! client about 30 µs of CPU in all (getrusage over 40,000 operations; 0.70 wake-ups per
//! operation sleeping at once, 0.45 polling up to 50 µs, 0.11 up to 100 µs). memcached's
//! workers always sleep at once; `--poll-us 0` does the same.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token, Waker};

use crate::cache::{push_num, ArithResult, Cache, StoreResult};
use crate::idle::IdlePoll;
use crate::proto::{self, Command, Retrieve, StatsKind};
use crate::stats::{self, ServerStats};

/// Reads per connection per turn of the event loop.
const READS_PER_TURN: usize = 4;
/// Size of a connection's input buffer (grown for longer lines and larger data blocks).
const READ_CHUNK: usize = 64 * 1024;
/// Least room offered to a read: less and the unconsumed input moves or the buffer grows.
const READ_MIN: usize = 16 * 1024;
/// Output bytes above which a connection is not read until its client catches up.
const OUT_MAX: usize = 4 << 20;
const WAKER: Token = Token(usize::MAX);

/// Server settings (memcached's flag names where the meaning is the same).
#[derive(Clone, Debug)]
pub struct Settings {
    pub port: u16,
    pub listen: String,
    pub threads: usize,
    pub max_conns: usize,
    /// The longest an idle worker polls before it sleeps ([`crate::idle`]; zero: never).
    pub poll: Duration,
}

/// What a command-line handler needs from the whole server.
pub struct Shared {
    pub cache: Arc<Mutex<Cache>>,
    pub settings: Settings,
    pub stats: ServerStats,
    pub curr_conns: AtomicUsize,
    pub total_conns: AtomicU64,
    pub rejected_conns: AtomicU64,
    pub stop: AtomicBool,
    /// The level `verbosity` last set (`-v` at start); `stats settings` shows it.
    pub verbosity: AtomicU32,
    pub hps: Option<Arc<crate::hpsrun::HpsControl>>,
}

/// A running server.
pub struct Server {
    pub shared: Arc<Shared>,
    pub addr: SocketAddr,
    threads: Vec<std::thread::JoinHandle<()>>,
    wakers: Vec<Arc<Waker>>,
}

impl Server {
    /// Bind and start the acceptor and the workers.
    pub fn start(shared: Arc<Shared>) -> anyhow::Result<Self> {
        let s = &shared.settings;
        let listener = TcpListener::bind((s.listen.as_str(), s.port))
            .map_err(|e| anyhow::anyhow!("bind {}:{}: {e}", s.listen, s.port))?;
        let addr = listener.local_addr()?;
        let mut threads = Vec::new();
        let mut senders = Vec::new();
        let mut wakers = Vec::new();
        for i in 0..s.threads.max(1) {
            let poll = Poll::new()?;
            let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
            let (tx, rx) = channel::<std::net::TcpStream>();
            let sh = shared.clone();
            threads
                .push(std::thread::Builder::new().name(format!("kv-worker-{i}")).spawn(move || worker(sh, poll, rx))?);
            senders.push(tx);
            wakers.push(waker);
        }
        let sh = shared.clone();
        let w = wakers.clone();
        listener.set_nonblocking(true)?;
        threads.push(
            std::thread::Builder::new().name("kv-accept".into()).spawn(move || acceptor(sh, listener, senders, w))?,
        );
        Ok(Server { shared, addr, threads, wakers })
    }

    /// Stop accepting, close every connection and join the threads.
    pub fn shutdown(mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for w in &self.wakers {
            let _ = w.wake();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }

    /// Block until the stop flag is set (by a signal handler thread).
    pub fn wait(self) {
        while !self.shared.stop.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(100));
        }
        self.shutdown();
    }
}

fn acceptor(
    shared: Arc<Shared>,
    listener: TcpListener,
    senders: Vec<Sender<std::net::TcpStream>>,
    wakers: Vec<Arc<Waker>>,
) {
    let mut next = 0;
    // A blocking accept could not see the stop flag; poll the listener instead.
    let mut poll = match Poll::new() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("kvcache: epoll_create for the listener: {e}");
            shared.stop.store(true, Ordering::Release);
            return;
        }
    };
    let mut l = mio::net::TcpListener::from_std(listener);
    if let Err(e) = poll.registry().register(&mut l, Token(0), Interest::READABLE) {
        eprintln!("kvcache: epoll_ctl for the listener: {e}");
        shared.stop.store(true, Ordering::Release);
        return;
    }
    let mut events = Events::with_capacity(16);
    while !shared.stop.load(Ordering::Acquire) {
        if poll.poll(&mut events, Some(Duration::from_millis(100))).is_err() {
            continue;
        }
        loop {
            match l.accept() {
                Ok((stream, _)) => {
                    shared.total_conns.fetch_add(1, Ordering::Relaxed);
                    let std_stream = std::net::TcpStream::from(stream);
                    if shared.curr_conns.load(Ordering::Acquire) >= shared.settings.max_conns {
                        // memcached: "ERROR Too many open connections", then close.
                        shared.rejected_conns.fetch_add(1, Ordering::Relaxed);
                        let mut s = std_stream;
                        let _ = s.write_all(b"ERROR Too many open connections\r\n");
                        continue;
                    }
                    shared.curr_conns.fetch_add(1, Ordering::AcqRel);
                    let _ = std_stream.set_nodelay(true);
                    if senders[next].send(std_stream).is_ok() {
                        let _ = wakers[next].wake();
                    }
                    next = (next + 1) % senders.len();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // EMFILE and friends: back off a little rather than spin.
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(10));
                    break;
                }
            }
        }
    }
}

/// What the connection waits for.
enum State {
    /// A command line.
    Line,
    /// A storage command's data block (`bytes` + 2) whose line is kept in `pending`.
    Data { bytes: usize },
    /// Dropping this many bytes of a refused data block.
    Swallow(usize),
}

struct Conn {
    stream: TcpStream,
    /// Input: `rbuf[rpos..rend]` is unconsumed. The buffer keeps its length (its bytes stay
    /// initialised) from one read to the next, so a read never clears memory first: clearing
    /// 64 KiB before each read was 7.6% of the server's CPU time under request/response gets
    /// (perf, cpu-clock samples).
    rbuf: Vec<u8>,
    rpos: usize,
    rend: usize,
    out: Vec<u8>,
    opos: usize,
    state: State,
    /// The command line of a storage command waiting for its data.
    pending: Vec<u8>,
    /// Close once `out` is flushed.
    closing: bool,
    /// Peer sent EOF.
    eof: bool,
    /// An event said the peer closed its side: a short read no longer means the socket is
    /// drained, since the FIN may have come with the data under one edge and raise no other.
    peer_closed: bool,
    /// Registered for WRITABLE.
    want_write: bool,
    /// Reading paused for back-pressure.
    paused: bool,
}

impl Conn {
    fn new(stream: TcpStream) -> Self {
        Conn {
            stream,
            rbuf: Vec::new(),
            rpos: 0,
            rend: 0,
            out: Vec::new(),
            opos: 0,
            state: State::Line,
            pending: Vec::new(),
            closing: false,
            eof: false,
            peer_closed: false,
            want_write: false,
            paused: false,
        }
    }

    /// Make at least [`READ_MIN`] bytes of room after the unconsumed input: move it to the
    /// front, or grow the buffer (a long line or a large data block).
    fn make_room(&mut self) {
        if self.rpos == self.rend {
            self.rpos = 0;
            self.rend = 0;
            // A large request made the buffer grow: give the memory back once it is consumed.
            if self.rbuf.len() > 4 * READ_CHUNK {
                self.rbuf = Vec::new();
            }
        }
        if self.rbuf.len() - self.rend >= READ_MIN {
            return;
        }
        if self.rpos > 0 {
            self.rbuf.copy_within(self.rpos..self.rend, 0);
            self.rend -= self.rpos;
            self.rpos = 0;
        }
        if self.rbuf.len() - self.rend < READ_MIN {
            let len = (self.rbuf.len() * 2).max(READ_CHUNK);
            self.rbuf.resize(len, 0);
        }
    }
}

fn worker(shared: Arc<Shared>, mut poll: Poll, rx: Receiver<std::net::TcpStream>) {
    let mut conns: HashMap<usize, Conn> = HashMap::new();
    let mut next_token = 0usize;
    let mut events = Events::with_capacity(256);
    let mut ready: VecDeque<usize> = VecDeque::new();
    let mut idle = IdlePoll::new(shared.settings.poll);
    while !shared.stop.load(Ordering::Acquire) {
        let polled = if ready.is_empty() {
            // Nothing to do: poll for the window, then sleep until an event (no timeout:
            // `Server::shutdown` wakes every worker).
            let since = Instant::now();
            match poll_for(&mut poll, &mut events, idle.window()) {
                Ok(Polled::Event) => {
                    idle.woke_after(since.elapsed());
                    Ok(())
                }
                Ok(Polled::Nothing) => {
                    let r = poll.poll(&mut events, None);
                    idle.woke_after(since.elapsed());
                    r
                }
                // The gap says nothing about the requests then: another task held the core.
                Ok(Polled::Shared) => {
                    idle.core_shared();
                    poll.poll(&mut events, None)
                }
                Err(e) => Err(e),
            }
        } else {
            poll.poll(&mut events, Some(Duration::ZERO))
        };
        if let Err(e) = polled {
            if e.kind() != io::ErrorKind::Interrupted {
                eprintln!("kvcache: epoll_wait: {e}");
            }
            continue;
        }
        for ev in events.iter() {
            if ev.token() == WAKER {
                while let Ok(s) = rx.try_recv() {
                    let _ = s.set_nonblocking(true);
                    let mut stream = TcpStream::from_std(s);
                    let tok = next_token;
                    next_token = next_token.wrapping_add(1) % (usize::MAX - 1);
                    if poll.registry().register(&mut stream, Token(tok), Interest::READABLE).is_err() {
                        shared.curr_conns.fetch_sub(1, Ordering::AcqRel);
                        continue;
                    }
                    conns.insert(tok, Conn::new(stream));
                    ready.push_back(tok);
                }
                continue;
            }
            if ev.is_read_closed() {
                if let Some(c) = conns.get_mut(&ev.token().0) {
                    c.peer_closed = true;
                }
            }
            if !ready.contains(&ev.token().0) {
                ready.push_back(ev.token().0);
            }
        }
        // One turn for every connection that had an event or has more to do.
        for _ in 0..ready.len() {
            let Some(tok) = ready.pop_front() else { break };
            let Some(c) = conns.get_mut(&tok) else { continue };
            let more = serve(&shared, c);
            let done = c.closing && c.opos == c.out.len() || c.eof && c.opos == c.out.len();
            if done {
                let mut c = conns.remove(&tok).expect("conn");
                let _ = poll.registry().deregister(&mut c.stream);
                shared.curr_conns.fetch_sub(1, Ordering::AcqRel);
                continue;
            }
            let want_write = c.opos < c.out.len();
            if want_write != c.want_write {
                let interest = if want_write { Interest::READABLE | Interest::WRITABLE } else { Interest::READABLE };
                let _ = poll.registry().reregister(&mut c.stream, Token(tok), interest);
                c.want_write = want_write;
            }
            if more {
                ready.push_back(tok);
            }
        }
    }
    for (_, mut c) in conns.drain() {
        let _ = poll.registry().deregister(&mut c.stream);
        shared.curr_conns.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How [`poll_for`] ended.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Polled {
    /// An event arrived.
    Event,
    /// The window passed without one.
    Nothing,
    /// Another task ran on this core meanwhile.
    Shared,
}

/// A yield that took longer than this let another task run.
const YIELDED: Duration = Duration::from_micros(5);

/// Poll for events without sleeping until one arrives, `window` has passed, or another task
/// wants this core (it runs, and polling stops: a client sharing the core must not wait for
/// the window to end).
fn poll_for(poll: &mut Poll, events: &mut Events, window: Duration) -> io::Result<Polled> {
    if window.is_zero() {
        return Ok(Polled::Nothing);
    }
    let start = Instant::now();
    loop {
        poll.poll(events, Some(Duration::ZERO))?;
        if !events.is_empty() {
            return Ok(Polled::Event);
        }
        if start.elapsed() >= window {
            return Ok(Polled::Nothing);
        }
        let before = Instant::now();
        std::thread::yield_now();
        if before.elapsed() > YIELDED {
            return Ok(Polled::Shared);
        }
    }
}

/// Serve a connection for one turn; returns whether it has more to do right away.
fn serve(shared: &Shared, c: &mut Conn) -> bool {
    flush(c);
    let mut more = false;
    if !c.closing && !c.eof {
        let mut reads = 0;
        loop {
            if c.out.len() - c.opos > OUT_MAX {
                c.paused = true;
                break;
            }
            c.paused = false;
            if reads == READS_PER_TURN {
                more = true;
                break;
            }
            reads += 1;
            c.make_room();
            let room = c.rbuf.len() - c.rend;
            match c.stream.read(&mut c.rbuf[c.rend..]) {
                Ok(0) => {
                    c.eof = true;
                    break;
                }
                Ok(n) => {
                    c.rend += n;
                    shared.stats.bytes_read.fetch_add(n as u64, Ordering::Relaxed);
                    process(shared, c);
                    flush(c);
                    // A short read emptied the socket: epoll(7), "if you call read(2) by
                    // asking to read a certain amount of data and read(2) returns a lower
                    // number of bytes, you can be sure of having exhausted the read I/O space
                    // for the file descriptor", and data arriving later raises a new
                    // edge-triggered event. Reading again would only fetch EAGAIN: a wasted
                    // syscall per request for a client that waits for each reply. Not once the
                    // peer closed: its FIN raises no edge of its own if it came with the data.
                    if c.closing || n < room && !c.peer_closed {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    c.closing = true;
                    c.out.truncate(c.opos);
                    break;
                }
            }
        }
    }
    flush(c);
    // A paused connection resumes once its output drained: the WRITABLE event brings it back.
    if c.paused && c.out.len() - c.opos <= OUT_MAX {
        more = true;
    }
    more
}

fn flush(c: &mut Conn) {
    while c.opos < c.out.len() {
        match c.stream.write(&c.out[c.opos..]) {
            Ok(0) => break,
            Ok(n) => c.opos += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(_) => {
                // The peer is gone: nothing more will be delivered.
                c.opos = c.out.len();
                c.closing = true;
                break;
            }
        }
    }
    if c.opos == c.out.len() {
        c.out.clear();
        c.opos = 0;
    } else if c.opos > (1 << 20) {
        c.out.drain(..c.opos);
        c.opos = 0;
    }
}

/// Execute every complete command in the input buffer.
fn process(shared: &Shared, c: &mut Conn) {
    // The input is taken out of the connection while its commands run, so that a command line
    // is a slice of it (no copy) while the command writes to the rest of the connection.
    let rbuf = std::mem::take(&mut c.rbuf);
    let end = c.rend;
    loop {
        if c.closing {
            break;
        }
        let input = &rbuf[c.rpos..end];
        match c.state {
            State::Swallow(n) => {
                let k = n.min(input.len());
                c.rpos += k;
                if k < n {
                    c.state = State::Swallow(n - k);
                    break;
                }
                c.state = State::Line;
            }
            State::Data { bytes } => {
                if input.len() < bytes + 2 {
                    break;
                }
                let (data, block_end) = (&input[..bytes], &input[bytes..bytes + 2]);
                let ok_end = block_end == b"\r\n";
                let reply = if ok_end { store(shared, &c.pending, data) } else { Some(proto::BAD_CHUNK) };
                if let Some(r) = reply {
                    c.out.extend_from_slice(r.as_bytes());
                }
                if !ok_end {
                    shared.stats.errors.fetch_add(1, Ordering::Relaxed);
                }
                c.rpos += bytes + 2;
                c.state = State::Line;
            }
            State::Line => {
                let Some(nl) = input.iter().position(|&b| b == b'\n') else {
                    if input.len() > proto::LINE_MAX {
                        c.out.extend_from_slice(proto::LINE_TOO_LONG.as_bytes());
                        shared.stats.errors.fetch_add(1, Ordering::Relaxed);
                        c.closing = true;
                    }
                    break;
                };
                let line_end = if nl > 0 && input[nl - 1] == b'\r' { nl - 1 } else { nl };
                if line_end > proto::LINE_MAX {
                    c.out.extend_from_slice(proto::LINE_TOO_LONG.as_bytes());
                    shared.stats.errors.fetch_add(1, Ordering::Relaxed);
                    c.closing = true;
                    break;
                }
                c.rpos += nl + 1;
                command(shared, c, &input[..line_end]);
            }
        }
    }
    c.rbuf = rbuf;
}

fn command(shared: &Shared, c: &mut Conn, line: &[u8]) {
    let cmd = match proto::parse(line) {
        Ok(cmd) => cmd,
        Err(e) => {
            shared.stats.errors.fetch_add(1, Ordering::Relaxed);
            if !e.noreply {
                c.out.extend_from_slice(e.reply.as_bytes());
            }
            if e.swallow > 0 {
                c.state = State::Swallow(e.swallow);
            }
            return;
        }
    };
    let out = &mut c.out;
    match cmd {
        Command::Store { bytes, .. } => {
            c.pending.clear();
            c.pending.extend_from_slice(line);
            c.state = State::Data { bytes };
        }
        Command::Retrieve { verb, keys } => {
            let (with_cas, touch) = match verb {
                Retrieve::Get => (false, None),
                Retrieve::Gets => (true, None),
                Retrieve::Gat(e) => (false, Some(e)),
                Retrieve::Gats(e) => (true, Some(e)),
            };
            let mut cache = shared.cache.lock().expect("cache lock");
            for k in keys {
                cache.get(k, with_cas, touch, out);
            }
            drop(cache);
            out.extend_from_slice(b"END\r\n");
        }
        Command::Delete { key, noreply } => {
            let hit = shared.cache.lock().expect("cache lock").delete(key);
            reply(out, noreply, if hit { "DELETED\r\n" } else { "NOT_FOUND\r\n" });
        }
        Command::Arith { incr, key, delta, noreply } => {
            let r = shared.cache.lock().expect("cache lock").arith(key, incr, delta);
            if noreply {
                return;
            }
            match r {
                ArithResult::Value(v) => {
                    push_num(out, v);
                    out.extend_from_slice(b"\r\n");
                }
                ArithResult::NotFound => out.extend_from_slice(b"NOT_FOUND\r\n"),
                ArithResult::NonNumeric => out.extend_from_slice(proto::NON_NUMERIC.as_bytes()),
                ArithResult::OutOfMemory => out.extend_from_slice(proto::OUT_OF_MEMORY.as_bytes()),
            }
        }
        Command::Touch { key, exptime, noreply } => {
            let hit = shared.cache.lock().expect("cache lock").touch(key, exptime);
            reply(out, noreply, if hit { "TOUCHED\r\n" } else { "NOT_FOUND\r\n" });
        }
        Command::FlushAll { delay, noreply } => {
            shared.cache.lock().expect("cache lock").flush_all(delay);
            reply(out, noreply, "OK\r\n");
        }
        Command::Stats(kind) => {
            match kind {
                StatsKind::General => stats::general(shared, out),
                StatsKind::Slabs => shared.cache.lock().expect("cache lock").slab_stats(out),
                StatsKind::Items => shared.cache.lock().expect("cache lock").item_stats(out),
                StatsKind::Settings => stats::settings(shared, out),
                StatsKind::Reset => {
                    shared.cache.lock().expect("cache lock").counters = Default::default();
                    out.extend_from_slice(b"RESET\r\n");
                    return;
                }
            }
            out.extend_from_slice(b"END\r\n");
        }
        Command::Version => {
            out.extend_from_slice(format!("VERSION {}\r\n", env!("CARGO_PKG_VERSION")).as_bytes());
        }
        Command::Verbosity { level, noreply } => {
            shared.verbosity.store(level, Ordering::Relaxed);
            reply(out, noreply, "OK\r\n");
        }
        Command::Quit => {
            c.closing = true;
        }
    }
}

fn reply(out: &mut Vec<u8>, noreply: bool, r: &str) {
    if !noreply {
        out.extend_from_slice(r.as_bytes());
    }
}

/// A storage command whose data block arrived; returns the reply (None for noreply).
fn store(shared: &Shared, line: &[u8], data: &[u8]) -> Option<&'static str> {
    let Ok(Command::Store { verb, key, flags, exptime, cas, noreply, .. }) = proto::parse(line) else {
        unreachable!("the line parsed as a storage command before");
    };
    let r = shared.cache.lock().expect("cache lock").store(verb, key, flags, exptime, data, cas);
    let text = match r {
        StoreResult::Stored => "STORED\r\n",
        StoreResult::NotStored => "NOT_STORED\r\n",
        StoreResult::Exists => "EXISTS\r\n",
        StoreResult::NotFound => "NOT_FOUND\r\n",
        StoreResult::TooLarge => proto::TOO_LARGE,
        StoreResult::OutOfMemory => proto::OUT_OF_MEMORY,
    };
    (!noreply).then_some(text)
}
