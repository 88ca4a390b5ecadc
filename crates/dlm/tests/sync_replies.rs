//! The synchronous calls — ALLOC (`Dlm::alloc`), FREE (`Dlm::free`), STATS
//! (`Dlm::server_stats`) — check each reply against its request as READ and WRITE do, and never
//! allocate what a server's length field asks for: a broken or hostile server (here a real TCP
//! listener in this test that answers with bad replies and then keeps the connection open,
//! sending nothing more) gets a clear error at once, not a wait for bytes that never come and
//! not an allocation of gigabytes (issue 23).

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;

use common::in_child;
use pagewise_dlm::proto::{Header, Opcode, Status, HEADER_LEN};
use pagewise_dlm::{Config, Dlm};

/// How the bad server answers the request it misbehaves on.
#[derive(Clone, Copy)]
enum Bad {
    /// ALLOC answered with another request id.
    AllocOtherId,
    /// ALLOC answered OK with a 4 GiB - 1 payload announced.
    AllocHugeLength,
    /// ALLOC refused (NO_SPACE) with a 4 GiB - 1 message announced.
    AllocHugeError,
    /// FREE answered as if it were a STATS.
    FreeOtherOpcode,
    /// STATS answered with 60 MiB announced (under the protocol's 64 MiB payload bound, far
    /// over any STATS reply).
    StatsHuge,
}

impl Bad {
    fn parse(s: &str) -> Self {
        match s {
            "alloc-other-id" => Bad::AllocOtherId,
            "alloc-huge-length" => Bad::AllocHugeLength,
            "alloc-huge-error" => Bad::AllocHugeError,
            "free-other-opcode" => Bad::FreeOtherOpcode,
            "stats-huge" => Bad::StatsHuge,
            _ => panic!("unknown case {s}"),
        }
    }
}

/// Serve one client: the handshake, then good replies except for the `bad` one, after which
/// nothing more is sent (the connection stays open until the client leaves).
fn bad_server(l: TcpListener, bad: Bad) {
    let (mut s, _) = l.accept().unwrap();
    common::accept_handshake(&mut s);
    loop {
        let mut b = [0u8; HEADER_LEN];
        if s.read_exact(&mut b).is_err() {
            return;
        }
        let h = Header::decode(&b);
        let mut payload = vec![0u8; h.length as usize];
        if s.read_exact(&mut payload).is_err() {
            return;
        }
        let op = Opcode::from_u8(h.opcode);
        let mut rep = Header::reply_to(&h, Status::Ok, 0);
        let mut body = Vec::new();
        let mut last = true;
        match (op, bad) {
            (Some(Opcode::Alloc), Bad::AllocOtherId) => rep.request_id = rep.request_id.wrapping_add(5),
            (Some(Opcode::Alloc), Bad::AllocHugeLength) => rep.length = u32::MAX,
            (Some(Opcode::Alloc), Bad::AllocHugeError) => {
                rep.status = Status::NoSpace as u16;
                rep.length = u32::MAX;
            }
            (Some(Opcode::Free), Bad::FreeOtherOpcode) => rep.opcode = Opcode::Stats as u8 | 0x80,
            (Some(Opcode::Stats), Bad::StatsHuge) => rep.length = 60 << 20,
            (Some(Opcode::Alloc), _) => {
                rep.region = 3;
                last = false;
            }
            (Some(Opcode::Stats), _) => {
                body = b"{}".to_vec();
                rep.length = 2;
                last = false;
            }
            _ => last = false,
        }
        if s.write_all(&rep.encode()).and_then(|_| s.write_all(&body)).is_err() {
            return;
        }
        if last {
            // Keep the connection open and silent: a client that believed the length would
            // wait here for bytes that never come.
            let mut sink = [0u8; 64];
            while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
            return;
        }
    }
}

fn scenario() {
    let bad = Bad::parse(&std::env::var("DLM_TEST_CASE").unwrap());
    let servers = vec![std::env::var("DLM_TEST_SERVERS").unwrap()];
    // A fault timeout far beyond the test's patience: an error must not come from it.
    let cfg = Config {
        servers,
        local_mem: 1 << 20,
        fault_timeout: Some(std::time::Duration::from_secs(600)),
        ..Config::default()
    };
    let dlm = Dlm::init(cfg).unwrap();
    let err = match bad {
        Bad::AllocOtherId | Bad::AllocHugeLength | Bad::AllocHugeError => dlm.alloc(4 << 20).err(),
        Bad::FreeOtherOpcode => {
            let p = dlm.alloc(4 << 20).unwrap();
            dlm.free(p).err()
        }
        Bad::StatsHuge => dlm.server_stats(0).err(),
    };
    match err {
        Some(e) => println!("CALL-ERR {e}"),
        None => println!("CALL-OK"),
    }
    // The runtime's drop would FREE the area on the broken connection: leave without it.
    std::mem::forget(dlm);
    std::process::exit(0);
}

fn run(case: &str) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let bad = Bad::parse(case);
    std::thread::spawn(move || bad_server(l, bad));
    let name = format!("case_{}", case.replace('-', "_"));
    let (so, se) = run_bounded(&name, &[("DLM_TEST_SERVERS", addr), ("DLM_TEST_CASE", case.to_string())]);
    assert!(so.contains("CALL-ERR"), "the bad reply was taken:\n{so}\n{se}");
    so
}

/// Run this binary's test `name` in a child (`common::run_child`'s way); a child still running
/// after 60 s — waiting for bytes the server announced and never sends — fails the test.
fn run_bounded(name: &str, env: &[(&str, String)]) -> (String, String) {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env("DLM_CHILD", "1")
        .env(pagewise_dlm::auth::SECRET_ENV, common::secret().as_env_value())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > std::time::Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{name}: the call waited for a reply the server never sends");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let (mut so, mut se) = (String::new(), String::new());
    child.stdout.take().unwrap().read_to_string(&mut so).unwrap();
    child.stderr.take().unwrap().read_to_string(&mut se).unwrap();
    (so, se)
}

macro_rules! case {
    ($name:ident, $case:literal, $expect:literal) => {
        #[test]
        fn $name() {
            if in_child() {
                scenario();
                return;
            }
            let so = run($case);
            assert!(so.contains($expect), "{so}");
        }
    };
}

case!(case_alloc_other_id, "alloc-other-id", "reply to another request id");
case!(case_alloc_huge_length, "alloc-huge-length", "reply longer than its request allows");
case!(case_alloc_huge_error, "alloc-huge-error", "message longer than 4 KiB");
case!(case_free_other_opcode, "free-other-opcode", "reply to another operation");
case!(case_stats_huge, "stats-huge", "reply longer than its request allows");
