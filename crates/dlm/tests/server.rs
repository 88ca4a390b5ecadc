//! Hostile input to a real `pagewise dlm-server` process, as raw TCP bytes: every malformed
//! request gets the reply PROTOCOL.md promises (or a closed connection), the stream stays in
//! sync after refused payloads, other clients are unaffected, and a client's regions are freed
//! when it vanishes, even mid-message.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::ServerProc;
use pagewise_dlm::auth::{Secret, NONCE_LEN, PROOF_LEN};
use pagewise_dlm::proto::{Header, Opcode, Status, HEADER_LEN, MAGIC, MAX_PAYLOAD};
use pagewise_dlm::server::ServerStats;
use rand::{Rng, SeedableRng};

struct Client(TcpStream);

impl Client {
    /// A connection past the handshake (with the test servers' secret).
    fn connect(addr: &str) -> Self {
        let mut c = Client::raw(addr);
        let status = c.handshake(common::secret());
        assert_eq!(status, Status::Ok, "handshake");
        c
    }
    /// A connection before the handshake.
    fn raw(addr: &str) -> Self {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Client(s)
    }
    /// The client's half of the handshake by hand (PROTOCOL.md); the status of the AUTH reply,
    /// or of the HELLO reply when that is not OK, or AUTH when the server's proof is wrong.
    fn handshake(&mut self, secret: &Secret) -> Status {
        let client_nonce = [9u8; NONCE_LEN];
        let mut hello = Header::request(Opcode::Hello, 1);
        hello.length = NONCE_LEN as u32;
        let (s, _, body) = self.status(&hello, &client_nonce);
        if s != Status::Ok {
            return s;
        }
        let server_nonce: [u8; NONCE_LEN] = body[..NONCE_LEN].try_into().unwrap();
        if !secret.verify_server(&client_nonce, &server_nonce, &body[NONCE_LEN..]) {
            return Status::Auth;
        }
        let mut auth = Header::request(Opcode::Auth, 2);
        auth.length = PROOF_LEN as u32;
        self.status(&auth, &secret.client_proof(&client_nonce, &server_nonce)).0
    }
    fn send(&mut self, h: &Header, payload: &[u8]) {
        self.0.write_all(&h.encode()).unwrap();
        self.0.write_all(payload).unwrap();
    }
    fn reply(&mut self) -> (Header, Vec<u8>) {
        let mut b = [0u8; HEADER_LEN];
        self.0.read_exact(&mut b).unwrap();
        let h = Header::decode(&b);
        assert_eq!(h.magic, MAGIC);
        let mut p = vec![0u8; h.length as usize];
        self.0.read_exact(&mut p).unwrap();
        (h, p)
    }
    fn status(&mut self, h: &Header, payload: &[u8]) -> (Status, Header, Vec<u8>) {
        self.send(h, payload);
        let (r, p) = self.reply();
        (Status::from_u16(r.status).unwrap(), r, p)
    }
    fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.0.read(&mut b), Ok(0) | Err(_))
    }
    fn alloc(&mut self, pages: u64, base: u32) -> (Status, u32) {
        let mut h = Header::request(Opcode::Alloc, 1);
        h.page = pages;
        h.length = 4;
        let (s, r, _) = self.status(&h, &base.to_le_bytes());
        (s, r.region)
    }
    fn stats(&mut self) -> ServerStats {
        let (s, _, p) = self.status(&Header::request(Opcode::Stats, 9), &[]);
        assert_eq!(s, Status::Ok);
        serde_json::from_slice(&p).unwrap()
    }
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(10), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn malformed_requests_get_the_promised_replies() {
    let srv = ServerProc::start("1M");
    let mut c = Client::connect(&srv.addr);

    // Unknown opcode with a payload: BAD_OPCODE, payload swallowed, stream still in sync.
    let mut h = Header::request(Opcode::Stats, 1);
    h.opcode = 77;
    h.length = 1000;
    assert_eq!(c.status(&h, &[0xEE; 1000]).0, Status::BadOpcode);
    c.stats();

    // ALLOC: bad base size, impossible page count, beyond capacity, wrong payload length.
    assert_eq!(c.alloc(4, 5000).0, Status::BadSize);
    assert_eq!(c.alloc(u64::MAX, 4096).0, Status::BadSize);
    assert_eq!(c.alloc(0, 4096).0, Status::BadSize);
    assert_eq!(c.alloc(1 << 20, 4096).0, Status::NoSpace);
    let mut h = Header::request(Opcode::Alloc, 1);
    h.page = 1;
    h.length = 9;
    assert_eq!(c.status(&h, &[1; 9]).0, Status::BadSize);
    let (s, region) = c.alloc(16, 4096);
    assert_eq!(s, Status::Ok);

    // READ/WRITE out of range, zero set count, overflowing page index, wrong WRITE length.
    let rw = |op, page, set, len| {
        let mut h = Header::request(op, 3);
        h.region = region;
        h.page = page;
        h.set_count = set;
        h.length = len;
        h
    };
    assert_eq!(c.status(&rw(Opcode::Read, 15, 2, 0), &[]).0, Status::OutOfRange);
    assert_eq!(c.status(&rw(Opcode::Read, u64::MAX, 2, 0), &[]).0, Status::OutOfRange);
    assert_eq!(c.status(&rw(Opcode::Read, 0, 0, 0), &[]).0, Status::BadSize);
    assert_eq!(c.status(&rw(Opcode::Read, 0, u32::MAX, 0), &[]).0, Status::BadSize);
    assert_eq!(c.status(&rw(Opcode::Write, 0, 1, 100), &[7; 100]).0, Status::BadSize);
    assert_eq!(c.status(&rw(Opcode::Write, 16, 1, 4096), &[7; 4096]).0, Status::OutOfRange);
    let mut other = rw(Opcode::Read, 0, 1, 0);
    other.region = region + 100;
    assert_eq!(c.status(&other, &[]).0, Status::BadRegion);
    // Nothing was written by the refused requests; a good WRITE then READ round-trips.
    let (s, _, p) = c.status(&rw(Opcode::Read, 0, 1, 0), &[]);
    assert_eq!((s, p.iter().all(|&b| b == 0)), (Status::Ok, true));
    assert_eq!(c.status(&rw(Opcode::Write, 3, 2, 8192), &[0x42; 8192]).0, Status::Ok);
    let (s, _, p) = c.status(&rw(Opcode::Read, 2, 4, 0), &[]);
    assert_eq!(s, Status::Ok);
    assert!(p[..4096].iter().all(|&b| b == 0) && p[4096..12288].iter().all(|&b| b == 0x42));

    // Another connection cannot name this connection's region.
    let mut d = Client::connect(&srv.addr);
    assert_eq!(d.status(&rw(Opcode::Read, 0, 1, 0), &[]).0, Status::BadRegion);
    let st = d.stats();
    assert!(st.errors >= 13, "{st:?}");
    assert_eq!(st.resident_bytes, 16 * 4096);

    // FREE returns the capacity.
    let mut f = Header::request(Opcode::Free, 4);
    f.region = region;
    assert_eq!(c.status(&f, &[]).0, Status::Ok);
    assert_eq!(c.status(&f, &[]).0, Status::BadRegion);
    assert_eq!(d.stats().resident_bytes, 0);
}

#[test]
fn stream_breaking_input_closes_only_that_connection() {
    let srv = ServerProc::start("16M");
    let mut good = Client::connect(&srv.addr);
    let (s, _) = good.alloc(8, 4096);
    assert_eq!(s, Status::Ok);

    // Bad magic: error reply, then closed.
    let mut c = Client::connect(&srv.addr);
    // Exactly one header's worth, so no unread bytes turn the close into a reset.
    c.0.write_all(b"GET / HTTP/1.1\r\nHost: examples\r\n").unwrap();
    let (h, _) = c.reply();
    assert_eq!(Status::from_u16(h.status), Some(Status::BadMagic));
    assert!(c.closed());

    // Bad version.
    let mut c = Client::connect(&srv.addr);
    let mut h = Header::request(Opcode::Stats, 1);
    h.version = 9;
    assert_eq!(c.status(&h, &[]).0, Status::BadVersion);
    assert!(c.closed());

    // A payload length beyond MAX_PAYLOAD cannot be swallowed: reply, then closed.
    let mut c = Client::connect(&srv.addr);
    let mut h = Header::request(Opcode::Write, 1);
    h.length = MAX_PAYLOAD + 1;
    assert_eq!(c.status(&h, &[]).0, Status::BadSize);
    assert!(c.closed());

    // Truncated header, and a client vanishing in the middle of a WRITE payload.
    {
        let mut c = Client::connect(&srv.addr);
        c.0.write_all(&Header::request(Opcode::Stats, 1).encode()[..17]).unwrap();
    }
    {
        let mut c = Client::connect(&srv.addr);
        let (s, region) = c.alloc(256, 4096);
        assert_eq!(s, Status::Ok);
        let mut h = Header::request(Opcode::Write, 2);
        h.region = region;
        h.set_count = 64;
        h.length = 64 * 4096;
        c.send(&h, &[1; 5000]);
    }
    // Random garbage from many clients.
    let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
    for _ in 0..50 {
        let mut c = Client::connect(&srv.addr);
        let n = rng.random_range(1..200);
        let junk: Vec<u8> = (0..n).map(|_| rng.random()).collect();
        let _ = c.0.write_all(&junk);
    }
    // The vanished clients' regions are freed; the good client is unaffected.
    wait_for("regions of vanished clients to be freed", || good.stats().resident_bytes == 8 * 4096);
    let mut h = Header::request(Opcode::Read, 5);
    h.region = 1;
    h.set_count = 8;
    let (s, _, p) = good.status(&h, &[]);
    assert_eq!((s, p.len()), (Status::Ok, 8 * 4096));

    // SIGTERM: clean exit with JSON statistics.
    drop(good);
    let (st, json) = srv.terminate();
    assert!(st.success(), "{st}");
    let v: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert!(v["errors"].as_u64().unwrap() >= 3, "{v}");
}

/// Thousands of randomized frames — well-formed headers (right magic and version) with random
/// opcodes, regions, pages, set counts, statuses and lengths, random payloads, and now and
/// then a corrupted magic or version — over a few connections: the server never crashes,
/// answers a fresh client correctly afterwards, and counted the errors.
#[test]
fn thousands_of_random_frames_never_crash_the_server() {
    let srv = ServerProc::start("64M");
    let mut rng = rand::rngs::SmallRng::seed_from_u64(0xD1_5EA5E);
    let mut frames = 0usize;
    while frames < 5000 {
        let c = Client::connect(&srv.addr);
        // Drain replies on another thread so the server never blocks writing to us.
        let mut reader = c.0.try_clone().unwrap();
        let drain = std::thread::spawn(move || {
            let mut sink = vec![0u8; 1 << 16];
            while matches!(reader.read(&mut sink), Ok(n) if n > 0) {}
        });
        let mut w = c.0;
        // A region of our own, so some random requests name a live one.
        let mut h = Header::request(Opcode::Alloc, 1);
        h.page = 64;
        h.length = 4;
        let _ = w.write_all(&h.encode()).and_then(|_| w.write_all(&4096u32.to_le_bytes()));
        for _ in 0..rng.random_range(50..400) {
            let mut h = Header::request(Opcode::Read, rng.random());
            h.opcode = rng.random_range(0..10);
            h.region = rng.random_range(0..4);
            h.page = if rng.random_bool(0.8) { rng.random_range(0..80) } else { rng.random() };
            h.set_count = if rng.random_bool(0.8) { 1 << rng.random_range(0..8) } else { rng.random() };
            h.status = if rng.random_bool(0.9) { 0 } else { rng.random() };
            let len: u32 =
                if rng.random_bool(0.9) { rng.random_range(0..20_000) } else { rng.random_range(0..MAX_PAYLOAD) };
            h.length = len;
            if rng.random_bool(0.01) {
                h.magic = rng.random();
            }
            if rng.random_bool(0.01) {
                h.version = rng.random();
            }
            let payload: Vec<u8> = (0..len.min(20_000)).map(|_| rng.random()).collect();
            frames += 1;
            if w.write_all(&h.encode()).and_then(|_| w.write_all(&payload)).is_err() {
                break; // the server closed this connection (stream-breaking input): a new one
            }
            if len > 20_000 {
                break; // we will not send that much: this connection is out of sync now
            }
        }
        // End our side (the reader's clone keeps the socket open): the server sees EOF, ends
        // the connection, and the drain thread sees it close.
        let _ = w.shutdown(std::net::Shutdown::Write);
        let _ = drain.join();
    }
    let mut fresh = Client::connect(&srv.addr);
    let (s, region) = fresh.alloc(16, 4096);
    assert_eq!(s, Status::Ok);
    let mut h = Header::request(Opcode::Read, 2);
    h.region = region;
    h.set_count = 16;
    let (s, _, p) = fresh.status(&h, &[]);
    assert_eq!((s, p.len()), (Status::Ok, 16 * 4096));
    assert!(p.iter().all(|&b| b == 0));
    let stats = fresh.stats();
    assert!(stats.errors > 100, "{stats:?}");
    drop(fresh);
    let (st, _) = srv.terminate();
    assert!(st.success(), "the server did not survive: {st}");
}

/// The connection bound refuses clients beyond it (others keep working), and a live client
/// that makes no request for several times the dead-peer timeout keeps its connection and its
/// regions: its kernel answers the server's keepalive probes (issue 23: the idle timeout used
/// to end such a client and free its regions).
#[test]
fn connection_bound_and_live_quiet_clients_keep_their_regions() {
    use pagewise_dlm::server::{Server, ServerConfig};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let cfg = ServerConfig {
        max_clients: 2,
        dead_peer_timeout: Some(Duration::from_secs(3)),
        // Every other test's server watches for the next request (the default): this one
        // sleeps at once.
        spin: Duration::ZERO,
        ..ServerConfig::new("127.0.0.1:0", 64 << 20, common::secret().clone())
    };
    let server = Server::bind(&cfg).unwrap();
    let addr = server.local_addr().unwrap().to_string();
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let t = std::thread::spawn(move || server.run(&flag).unwrap());
    let mut a = Client::connect(&addr);
    let mut b = Client::connect(&addr);
    assert_eq!(a.alloc(16, 4096).0, Status::Ok);
    let (s, region) = b.alloc(16, 4096);
    assert_eq!(s, Status::Ok);
    let mut w = Header::request(Opcode::Write, 2);
    w.region = region;
    w.set_count = 1;
    w.length = 4096;
    assert_eq!(b.status(&w, &[0x77; 4096]).0, Status::Ok);
    let mut c = Client::raw(&addr);
    assert!(c.closed(), "a third client must be refused");
    assert_eq!(a.stats().clients, 2);
    // b says nothing for three dead-peer timeouts (a keeps asking): it is alive, so it stays.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        assert!(!b_gone(&mut b), "a live client was disconnected after {:?}", start.elapsed());
        assert_eq!(a.stats().regions, 2, "a live client's region was freed");
        std::thread::sleep(Duration::from_millis(500));
    }
    let mut r = Header::request(Opcode::Read, 3);
    r.region = region;
    r.set_count = 1;
    let (s, _, p) = b.status(&r, &[]);
    assert_eq!(s, Status::Ok);
    assert!(p.iter().all(|&x| x == 0x77), "the quiet client's data");
    // Room again once a client leaves.
    drop(b);
    // Its regions go before its place among the clients (`serve_connection` returns first):
    // both are waited for, or the next client may still be refused.
    wait_for("the departed client's region and place to be freed", || {
        let st = a.stats();
        st.regions == 1 && st.clients == 1
    });
    let mut d = Client::connect(&addr);
    assert_eq!(d.alloc(16, 4096).0, Status::Ok);
    stop.store(true, Ordering::Relaxed);
    let stats = t.join().unwrap();
    assert!(stats.errors >= 1, "the refused connection is counted: {stats:?}");
}

/// Whether `c`'s connection was ended by the server (without blocking on a live one).
fn b_gone(c: &mut Client) -> bool {
    c.0.set_nonblocking(true).unwrap();
    let mut b = [0u8; 1];
    let gone = matches!(c.0.peek(&mut b), Ok(0));
    c.0.set_nonblocking(false).unwrap();
    gone
}
