//! Hostile and broken clients never crash the server, block other clients or touch other
//! items.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::Shutdown;
use std::time::Duration;

use common::Server;
use rand::{Rng, SeedableRng};

fn canary_ok(srv: &Server) {
    let mut c = srv.connect();
    c.exchange(b"get canary\r\n", b"VALUE canary 42 6\r\nintact\r\nEND\r\n");
}

fn with_canary(args: &[&str]) -> Server {
    canary(Server::start(args))
}

fn canary(srv: Server) -> Server {
    srv.connect().exchange(b"set canary 42 0 6\r\nintact\r\n", b"STORED\r\n");
    srv
}

#[test]
fn overlong_line_gets_an_error_and_a_close() {
    let srv = with_canary(&["-m", "8"]);
    let mut c = srv.connect();
    c.send(&vec![b'a'; 70 * 1024]);
    assert_eq!(c.read_to_close(), b"CLIENT_ERROR line too long\r\n");
    canary_ok(&srv);
}

#[test]
fn a_client_that_never_reads_does_not_block_others() {
    never_reads(with_canary(&["-m", "64", "-t", "1"]));
}

/// The same on a server confined to one CPU, whose idle worker polls before it sleeps.
#[test]
fn a_client_that_never_reads_does_not_block_others_of_a_polling_server() {
    never_reads(canary(Server::start_confined(&["-m", "64", "-t", "1"])));
}

fn never_reads(srv: Server) {
    let mut c = srv.connect();
    let value = vec![b'z'; 200_000];
    c.exchange(&[b"set big 0 0 200000\r\n".to_vec(), value, b"\r\n".to_vec()].concat(), b"STORED\r\n");
    // Flood gets of a 200 KB value and never read a byte of the replies.
    let mut flood = srv.connect();
    flood.s.set_write_timeout(Some(Duration::from_secs(3))).unwrap();
    let req = b"get big\r\n".repeat(1000);
    // 9 KB of requests per write; 2000 writes (18 MB) are far more than the socket buffers
    // hold (net.ipv4.tcp_rmem/wmem max 6 MB / 4 MB by default), so a server that keeps reading
    // would have answered with gigabytes by then.
    let mut sent = 0usize;
    while sent < 2000 {
        if flood.s.write_all(&req).is_err() {
            break; // the server stopped reading: back-pressure reached the socket
        }
        sent += 1;
    }
    assert!(sent < 2000, "the server kept reading from a client that reads nothing");
    // The same worker thread still serves everyone else.
    for i in 0..50 {
        c.exchange(format!("set k{i} 0 0 1\r\nx\r\n").as_bytes(), b"STORED\r\n");
    }
    canary_ok(&srv);
    drop(flood);
    canary_ok(&srv);
}

#[test]
fn slow_and_half_closed_clients() {
    slow_and_half_closed(with_canary(&["-m", "8", "-t", "1"]));
}

/// The same on a server confined to one CPU, whose idle worker polls before it sleeps.
#[test]
fn slow_and_half_closed_clients_of_a_polling_server() {
    slow_and_half_closed(canary(Server::start_confined(&["-m", "8", "-t", "1"])));
}

fn slow_and_half_closed(mut srv: Server) {
    // A request trickling in byte by byte, with other clients served in between.
    let mut slow = srv.connect();
    let req = b"set slow 0 0 5\r\nhello\r\n";
    for (i, b) in req.iter().enumerate() {
        slow.send(&[*b]);
        if i % 5 == 0 {
            canary_ok(&srv);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut r = BufReader::new(slow.s.try_clone().unwrap());
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert_eq!(line, "STORED\r\n");
    // Half-closed: the replies to everything sent before the FIN still arrive.
    let mut h = srv.connect();
    h.send(b"get slow\r\nset hc 0 0 1\r\nx\r\nget hc\r\n");
    h.s.shutdown(Shutdown::Write).unwrap();
    assert_eq!(h.read_to_close(), b"VALUE slow 0 5\r\nhello\r\nEND\r\nSTORED\r\nVALUE hc 0 1\r\nx\r\nEND\r\n");
    // A data block cut short by a close stores nothing.
    let mut p = srv.connect();
    p.send(b"set part 0 0 10\r\nabc");
    drop(p);
    let mut c = srv.connect();
    c.exchange(b"get part\r\n", b"END\r\n");
    canary_ok(&srv);
    assert!(srv.alive());
}

/// A request and the FIN after it can reach the server as one readiness event: the reply still
/// comes, and the close, however the two arrive (many tries, each with its own timing).
#[test]
fn a_request_and_its_fin_together_are_answered_and_closed() {
    for srv in [Server::start(&["-m", "8", "-t", "1"]), Server::start_confined(&["-m", "8", "-t", "1"])] {
        for i in 0..300 {
            let mut c = srv.connect();
            // Let the server take the connection in first, so the two land on a socket it
            // already watches.
            std::thread::sleep(Duration::from_millis(2));
            c.send(b"get none\r\n");
            c.s.shutdown(Shutdown::Write).unwrap();
            assert_eq!(c.read_to_close(), b"END\r\n", "try {i}");
        }
    }
}

#[test]
fn connection_limit_refuses_with_an_error() {
    let srv = Server::start(&["-m", "8", "-c", "2"]);
    let mut a = srv.connect();
    let mut b = srv.connect();
    a.exchange(b"set canary 42 0 6\r\nintact\r\n", b"STORED\r\n");
    b.exchange(b"get x\r\n", b"END\r\n");
    let mut c = srv.connect();
    assert_eq!(c.read_to_close(), b"ERROR Too many open connections\r\n");
    drop(a);
    // The slot is given back once the server saw the close.
    let mut ok = false;
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(20));
        let mut d = srv.connect();
        d.send(b"get canary\r\n");
        let got = d.read_to_close_or(b"END\r\n");
        if got.starts_with(b"VALUE canary") {
            ok = true;
            break;
        }
    }
    assert!(ok, "a closed connection's slot was not reused");
}

#[test]
fn random_garbage_never_crashes_or_corrupts() {
    let mut srv = with_canary(&["-m", "16", "-t", "2"]);
    let mut rng = rand::rngs::SmallRng::seed_from_u64(10);
    let words: [&[u8]; 16] = [
        b"get",
        b"set",
        b"cas",
        b"incr",
        b"decr",
        b"gat",
        b"touch",
        b"delete",
        b"append",
        b"prepend",
        b"stats",
        b"flush_all 100000",
        b"noreply",
        b"18446744073709551616",
        b"-1",
        b"4294967296",
    ];
    for round in 0..300 {
        let mut buf = Vec::new();
        for _ in 0..rng.random_range(1..20) {
            match rng.random_range(0..4) {
                0 => buf.extend((0..rng.random_range(1..300)).map(|_| rng.random::<u8>())),
                1 => buf.extend_from_slice(words[rng.random_range(0..words.len())]),
                2 => buf.extend_from_slice(rng.random_range(0..2_000_000u64).to_string().as_bytes()),
                _ => buf.extend_from_slice(if rng.random() { b" " } else { b"\r\n" }),
            }
        }
        let mut c = srv.connect();
        c.s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let _ = c.s.write_all(&buf);
        if round % 2 == 0 {
            let _ = c.s.shutdown(Shutdown::Write);
        }
        drop(c);
        if round % 50 == 0 {
            assert!(srv.alive(), "server died at round {round}");
            canary_ok(&srv);
        }
    }
    assert!(srv.alive());
    // No garbage names the canary, so it is exactly as stored (a pending flush_all would
    // only fire in 100000 s).
    canary_ok(&srv);
}

trait ReadOr {
    fn read_to_close_or(&mut self, end: &[u8]) -> Vec<u8>;
}

impl ReadOr for common::Client {
    /// Read until the server closes or the reply ends with `end`.
    fn read_to_close_or(&mut self, end: &[u8]) -> Vec<u8> {
        use std::io::Read;
        let mut out = Vec::new();
        let mut buf = [0u8; 1024];
        while !out.ends_with(end) {
            match self.s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
        out
    }
}
