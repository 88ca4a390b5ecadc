//! Who gets in (issue 23): a real `pagewise dlm-server` admits only clients that prove the
//! shared secret; requests before the handshake, a wrong secret, a client of protocol
//! version 1 and a connection that never says anything are refused without a byte of memory
//! being reserved; a client refuses a server that cannot prove the secret; and the server takes
//! its secret from a private file or the environment, never from the command line.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{in_child, pagewise_bin, run_child, ServerProc};
use pagewise_dlm::auth::{Secret, NONCE_LEN, PROOF_LEN, SECRET_ENV};
use pagewise_dlm::proto::{Header, Opcode, Status, HEADER_LEN, MAGIC};
use pagewise_dlm::transport::{TcpTransport, HANDSHAKE_TIMEOUT};
use pagewise_dlm::{Config, Dlm};

fn connect(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s
}

fn send(s: &mut TcpStream, h: &Header, payload: &[u8]) {
    s.write_all(&h.encode()).unwrap();
    s.write_all(payload).unwrap();
}

fn reply(s: &mut TcpStream) -> (Header, Vec<u8>) {
    let mut b = [0u8; HEADER_LEN];
    s.read_exact(&mut b).unwrap();
    let h = Header::decode(&b);
    assert_eq!(h.magic, MAGIC);
    let mut p = vec![0u8; h.length as usize];
    s.read_exact(&mut p).unwrap();
    (h, p)
}

fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    matches!(s.read(&mut b), Ok(0) | Err(_))
}

fn alloc_header() -> Header {
    let mut h = Header::request(Opcode::Alloc, 1);
    h.page = 256;
    h.length = 4;
    h
}

/// The server's statistics, through a client that knows the secret.
fn stats(addr: &str) -> pagewise_dlm::server::ServerStats {
    let mut t = TcpTransport::open(addr, Some(common::secret()), Some(Duration::from_secs(10))).unwrap();
    use pagewise_dlm::transport::Transport;
    t.send(&Header::request(Opcode::Stats, 5), &[]).unwrap();
    let h = t.recv_header().unwrap();
    let mut p = vec![0u8; h.length as usize];
    t.recv_payload(&mut p).unwrap();
    serde_json::from_slice(&p).unwrap()
}

#[test]
fn requests_before_the_handshake_are_refused_and_reserve_nothing() {
    let srv = ServerProc::start("64M");
    let mut s = connect(&srv.addr);
    send(&mut s, &alloc_header(), &4096u32.to_le_bytes());
    let (h, msg) = reply(&mut s);
    assert_eq!(Status::from_u16(h.status), Some(Status::Auth), "{}", String::from_utf8_lossy(&msg));
    assert!(String::from_utf8_lossy(&msg).contains("authenticate first"));
    assert!(closed(&mut s));
    // A huge length in a first message is refused without reading (or allocating) it.
    let mut s = connect(&srv.addr);
    let mut hello = Header::request(Opcode::Hello, 1);
    hello.length = 60 << 20;
    send(&mut s, &hello, &[]);
    let (h, _) = reply(&mut s);
    assert_eq!(Status::from_u16(h.status), Some(Status::Auth));
    assert!(closed(&mut s));
    let st = stats(&srv.addr);
    assert_eq!((st.regions, st.resident_bytes), (0, 0), "{st:?}");
    assert!(st.auth_failures >= 2, "{st:?}");
}

#[test]
fn a_wrong_secret_is_refused() {
    let srv = ServerProc::start("64M");
    let wrong = Secret::new("not the secret of these servers").unwrap();
    let err = TcpTransport::open(&srv.addr, Some(&wrong), None).err().expect("a wrong secret must be refused");
    // The server's proof does not check out with the wrong secret: the client stops there.
    assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied, "{err}");
    assert!(err.to_string().contains("does not prove the shared secret"), "{err}");
    // By hand, answering with a proof made from the wrong secret: AUTH refused, then closed.
    let mut s = connect(&srv.addr);
    let client_nonce = [1u8; NONCE_LEN];
    let mut hello = Header::request(Opcode::Hello, 1);
    hello.length = NONCE_LEN as u32;
    send(&mut s, &hello, &client_nonce);
    let (h, body) = reply(&mut s);
    assert_eq!((h.status, body.len()), (0, NONCE_LEN + PROOF_LEN));
    let server_nonce: [u8; NONCE_LEN] = body[..NONCE_LEN].try_into().unwrap();
    let mut auth = Header::request(Opcode::Auth, 2);
    auth.length = PROOF_LEN as u32;
    send(&mut s, &auth, &wrong.client_proof(&client_nonce, &server_nonce));
    let (h, msg) = reply(&mut s);
    assert_eq!(Status::from_u16(h.status), Some(Status::Auth), "{}", String::from_utf8_lossy(&msg));
    assert!(closed(&mut s));
    // Replaying a proof of the right secret made for other nonces fails the same way.
    let mut s = connect(&srv.addr);
    send(&mut s, &hello, &client_nonce);
    let _ = reply(&mut s);
    send(&mut s, &auth, &common::secret().client_proof(&client_nonce, &server_nonce));
    let (h, _) = reply(&mut s);
    assert_eq!(Status::from_u16(h.status), Some(Status::Auth));
    let st = stats(&srv.addr);
    assert!(st.auth_failures >= 3, "{st:?}");
    assert_eq!(st.regions, 0);
}

#[test]
fn a_version_1_client_gets_a_clear_refusal() {
    let srv = ServerProc::start("64M");
    let mut s = connect(&srv.addr);
    let mut h = alloc_header();
    h.version = 1;
    send(&mut s, &h, &4096u32.to_le_bytes());
    let (rep, msg) = reply(&mut s);
    let msg = String::from_utf8_lossy(&msg).into_owned();
    assert_eq!(Status::from_u16(rep.status), Some(Status::BadVersion), "{msg}");
    assert!(msg.contains("version 2") && msg.contains("version 1") && msg.contains("update the client"), "{msg}");
    assert!(closed(&mut s));
}

#[test]
fn a_silent_connection_is_closed_after_the_handshake_timeout() {
    let srv = ServerProc::start("64M");
    let mut s = connect(&srv.addr);
    let start = Instant::now();
    assert!(closed(&mut s), "the server must end a connection that never authenticates");
    let waited = start.elapsed();
    assert!(waited >= HANDSHAKE_TIMEOUT - Duration::from_secs(1), "closed after only {waited:?}");
    assert_eq!(stats(&srv.addr).auth_failures, 1);
}

/// A server that knows no secret: it answers HELLO with a made-up proof.
fn impostor(l: TcpListener) {
    let (mut s, _) = l.accept().unwrap();
    let (hello, _) = reply_of_request(&mut s);
    let body = [0x55u8; NONCE_LEN + PROOF_LEN];
    let _ = s.write_all(&Header::reply_to(&hello, Status::Ok, body.len() as u32).encode());
    let _ = s.write_all(&body);
    // Whatever comes next (nothing should) is swallowed.
    let mut sink = [0u8; 64];
    while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
}

fn reply_of_request(s: &mut TcpStream) -> (Header, Vec<u8>) {
    let mut b = [0u8; HEADER_LEN];
    s.read_exact(&mut b).unwrap();
    let h = Header::decode(&b);
    let mut p = vec![0u8; h.length as usize];
    s.read_exact(&mut p).unwrap();
    (h, p)
}

fn runtime_scenario() {
    let servers = vec![std::env::var("DLM_TEST_SERVERS").unwrap()];
    let secret = std::env::var("DLM_TEST_SECRET").ok().map(|s| Secret::new(s).unwrap());
    let cfg = Config { servers, secret, local_mem: 1 << 20, ..Config::default() };
    match Dlm::init(cfg) {
        Ok(_) => println!("INIT-OK"),
        Err(e) => println!("INIT-ERR errno {} {e}", e.errno()),
    }
}

/// The runtime refuses a server that cannot prove the secret, and a server refuses a runtime
/// with the wrong secret; with no secret at all it says where one goes. Each is an error of
/// `Dlm::init`, before the program has any DLM memory.
#[test]
fn the_runtime_authenticates_both_ways() {
    if in_child() {
        runtime_scenario();
        return;
    }
    let name = "the_runtime_authenticates_both_ways";
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let fake = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || impostor(l));
    let out = run_child(name, &[("DLM_TEST_SERVERS", fake)]);
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(so.contains("INIT-ERR") && so.contains("does not prove the shared secret"), "{so}");
    assert!(so.contains(&format!("errno {}", -libc::EACCES)), "{so}");

    let srv = ServerProc::start("64M");
    let out = run_child(
        name,
        &[("DLM_TEST_SERVERS", srv.addr.clone()), ("DLM_TEST_SECRET", "a wrong secret, long enough".into())],
    );
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(so.contains("INIT-ERR") && so.contains("does not prove the shared secret"), "{so}");

    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env("DLM_CHILD", "1")
        .env("DLM_TEST_SERVERS", &srv.addr)
        .env_remove(SECRET_ENV);
    let so = String::from_utf8_lossy(&cmd.output().unwrap().stdout).into_owned();
    assert!(so.contains("INIT-ERR") && so.contains(&format!("set {SECRET_ENV}")), "{so}");

    let out = run_child(name, &[("DLM_TEST_SERVERS", srv.addr.clone())]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("INIT-OK"), "{out:?}");
}

#[test]
fn the_server_takes_its_secret_from_a_private_file_or_the_environment_only() {
    let bin = pagewise_bin();
    // No secret: refused with a message saying where one goes.
    let out = Command::new(&bin)
        .args(["dlm-server", "--listen", "127.0.0.1:0", "--capacity", "1M"])
        .env_remove(SECRET_ENV)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--secret-file") && err.contains(SECRET_ENV), "{err}");
    // A secret file other users can read: refused.
    let dir = pagewise_kernel::private_dir::PrivateDir::new("auth-test").unwrap();
    let file = dir.join("secret");
    std::fs::write(&file, "0123456789abcdef0123456789\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = Command::new(&bin)
        .args(["dlm-server", "--listen", "127.0.0.1:0", "--capacity", "1M", "--secret-file"])
        .arg(&file)
        .env_remove(SECRET_ENV)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("chmod 600"), "{err}");
    // There is no flag that takes the secret itself.
    let help = Command::new(&bin).args(["dlm-server", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(!help.contains("--secret ") && help.contains("--secret-file"), "{help}");
    // The default address is loopback.
    assert!(help.contains("[default: 127.0.0.1:7001]"), "{help}");
}
