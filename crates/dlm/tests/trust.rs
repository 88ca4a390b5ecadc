//! A runtime that never hangs or installs wrong bytes: a stopped server (SIGSTOP) ends the
//! program with a message naming it, its address and the range within the fault timeout, in
//! both fault modes; a reply that does not match its request ends the program before a byte
//! of it is installed.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{in_child, ServerProc};
use pagewise_dlm::proto::{Header, Opcode, Status, HEADER_LEN};
use pagewise_dlm::{Config, Dlm, FaultMode};

fn config(mode: FaultMode) -> Config {
    Config {
        servers: vec![std::env::var("DLM_TEST_SERVERS").unwrap()],
        local_mem: 1 << 20,
        fault_mode: mode,
        readahead: 0,
        fault_timeout: Some(Duration::from_secs(1)),
        ..Config::default()
    }
}

/// Write a page, send it home, then fault on it again (the fetch meets the server).
fn refetch(dlm: &Dlm) -> *mut u8 {
    let base = dlm.alloc(4 << 20).unwrap();
    // SAFETY: inside the area.
    unsafe { base.add(12345).write_volatile(0x5a) };
    dlm.evict_all();
    base
}

fn stopped_scenario(mode: FaultMode) {
    let dlm = Dlm::init(config(mode)).unwrap();
    let base = refetch(&dlm);
    let pid: i32 = std::env::var("DLM_TEST_SERVER_PID").unwrap().parse().unwrap();
    pagewise_kernel::net::kill(pid, libc::SIGSTOP).unwrap();
    // kill(2) returns before the stop takes effect: wait until every thread is stopped.
    let all_stopped = || {
        std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().all(|t| {
            let stat = std::fs::read_to_string(t.unwrap().path().join("stat")).unwrap_or_default();
            stat.rsplit(") ").next().is_some_and(|r| r.starts_with('T'))
        })
    };
    let start = Instant::now();
    while !all_stopped() {
        assert!(start.elapsed() < Duration::from_secs(10), "the server did not stop");
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: inside the area; the fetch must time out and stop the program.
    let v = unsafe { base.add(12345).read_volatile() };
    println!("READ-RETURNED {v}");
}

fn mismatch_scenario() {
    let dlm = Dlm::init(config(FaultMode::HandlerThread)).unwrap();
    let base = refetch(&dlm);
    // SAFETY: inside the area; the reply is bogus and must stop the program.
    let v = unsafe { base.add(12345).read_volatile() };
    println!("READ-RETURNED {v}");
}

/// Run this test binary's `name` in a child with `env`; kill it after 60 s (a hang fails).
fn run_bounded(name: &str, env: &[(&str, String)]) -> (bool, String, String) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env("DLM_CHILD", "1")
        .env(pagewise_dlm::auth::SECRET_ENV, common::secret().as_env_value());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("{name}: the program hung instead of stopping");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (mut out, mut err) = (String::new(), String::new());
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    (status.success(), out, err)
}

fn stopped(name: &str, mode: FaultMode) {
    if in_child() {
        stopped_scenario(mode);
        return;
    }
    let mut s = ServerProc::start("64M");
    let pid = s.child.id();
    let (ok, out, err) =
        run_bounded(name, &[("DLM_TEST_SERVERS", s.addr.clone()), ("DLM_TEST_SERVER_PID", pid.to_string())]);
    let _ = pagewise_kernel::net::kill(pid as i32, libc::SIGCONT);
    s.kill();
    assert!(!ok && !out.contains("READ-RETURNED"), "{out}\n{err}");
    assert!(err.contains("no reply within") && err.contains(&s.addr) && err.contains("home of pages"), "{err}");
}

#[test]
fn a_stopped_server_stops_the_program_handler_thread() {
    stopped("a_stopped_server_stops_the_program_handler_thread", FaultMode::HandlerThread);
}

#[test]
fn a_stopped_server_stops_the_program_sigbus() {
    stopped("a_stopped_server_stops_the_program_sigbus", FaultMode::Sigbus);
}

/// A server that answers READs with the wrong request id (and 0xAB bytes), everything else
/// correctly.
fn lying_server(l: TcpListener) {
    let (mut s, _) = l.accept().unwrap();
    common::accept_handshake(&mut s);
    let mut pages: u64 = 0;
    loop {
        let mut b = [0u8; HEADER_LEN];
        if s.read_exact(&mut b).is_err() {
            return;
        }
        let h = Header::decode(&b);
        let mut payload = vec![0u8; h.length as usize];
        s.read_exact(&mut payload).unwrap();
        let (rep, body) = match Opcode::from_u8(h.opcode) {
            Some(Opcode::Alloc) => {
                pages = h.page;
                let mut r = Header::reply_to(&h, Status::Ok, 0);
                r.region = 7;
                (r, vec![])
            }
            Some(Opcode::Read) => {
                let len = h.set_count as usize * (16 << 10);
                let mut r = Header::reply_to(&h, Status::Ok, len as u32);
                r.request_id = r.request_id.wrapping_add(1);
                (r, vec![0xAB; len])
            }
            _ => (Header::reply_to(&h, Status::Ok, 0), vec![]),
        };
        let _ = pages;
        if s.write_all(&rep.encode()).and_then(|_| s.write_all(&body)).is_err() {
            return;
        }
    }
}

#[test]
fn a_mismatched_reply_stops_the_program_before_installing() {
    if in_child() {
        mismatch_scenario();
        return;
    }
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || lying_server(l));
    let (ok, out, err) =
        run_bounded("a_mismatched_reply_stops_the_program_before_installing", &[("DLM_TEST_SERVERS", addr)]);
    assert!(!ok && !out.contains("READ-RETURNED"), "{out}\n{err}");
    assert!(err.contains("reply to another request id"), "{err}");
}
