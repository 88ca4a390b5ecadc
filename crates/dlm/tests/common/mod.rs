//! Shared by the integration tests: real `pagewise dlm-server` processes and child processes
//! running one scenario each (the DLM runtime is one per process and installs signal handlers).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Once, OnceLock};

use pagewise_dlm::auth::{Secret, NONCE_LEN, PROOF_LEN, SECRET_ENV};
use pagewise_dlm::proto::{Header, Opcode, Status, HEADER_LEN};

/// The shared secret of this test process's servers and clients (handed to both through the
/// environment, as `pagewise run` does).
pub fn secret() -> &'static Secret {
    static SECRET: OnceLock<Secret> = OnceLock::new();
    SECRET.get_or_init(|| Secret::generate().expect("getrandom"))
}

/// The server's half of the handshake, for the tests' own misbehaving servers: answer HELLO
/// with a proof of [`secret`] and accept the client's AUTH. Panics on anything else.
pub fn accept_handshake(s: &mut TcpStream) {
    let read_msg = |s: &mut TcpStream, op: Opcode| -> (Header, Vec<u8>) {
        let mut b = [0u8; HEADER_LEN];
        s.read_exact(&mut b).expect("handshake header");
        let h = Header::decode(&b);
        assert_eq!(h.opcode, op as u8, "expected {op:?}");
        let mut p = vec![0u8; h.length as usize];
        s.read_exact(&mut p).expect("handshake payload");
        (h, p)
    };
    let (hello, client_nonce) = read_msg(s, Opcode::Hello);
    let client_nonce: [u8; NONCE_LEN] = client_nonce.try_into().expect("nonce");
    let server_nonce = [7u8; NONCE_LEN];
    let mut body = server_nonce.to_vec();
    body.extend_from_slice(&secret().server_proof(&client_nonce, &server_nonce));
    s.write_all(&Header::reply_to(&hello, Status::Ok, body.len() as u32).encode()).unwrap();
    s.write_all(&body).unwrap();
    let (auth, proof) = read_msg(s, Opcode::Auth);
    assert_eq!(proof.len(), PROOF_LEN);
    assert!(secret().verify_client(&client_nonce, &server_nonce, &proof), "the client's proof");
    s.write_all(&Header::reply_to(&auth, Status::Ok, 0).encode()).unwrap();
}

/// target/release/pagewise next to the test binary (built on first use if missing).
pub fn pagewise_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir").to_path_buf();
    let bin = dir.join("pagewise");
    static BUILD: Once = Once::new();
    BUILD.call_once(|| {
        if !bin.exists() {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let st = Command::new(cargo).args(["build", "--release", "-p", "pagewise-cli"]).status().expect("cargo");
            assert!(st.success(), "building pagewise failed");
        }
    });
    bin
}

/// A running memory server.
pub struct ServerProc {
    pub child: Child,
    pub addr: String,
    /// Everything the server logged on stderr after its banner.
    pub log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl ServerProc {
    pub fn start(capacity: &str) -> Self {
        Self::start_with(Command::new(pagewise_bin()), "127.0.0.1:0", capacity)
    }

    /// Start through `cmd` (e.g. `ip netns exec NS pagewise`), listening on `listen`.
    pub fn start_with(cmd: Command, listen: &str, capacity: &str) -> Self {
        Self::start_with_args(cmd, listen, capacity, &[])
    }

    /// As [`ServerProc::start_with`], with more `dlm-server` flags.
    pub fn start_with_args(mut cmd: Command, listen: &str, capacity: &str, extra: &[&str]) -> Self {
        let mut child = cmd
            .args(["dlm-server", "--listen", listen, "--capacity", capacity, "--json", "--verbose"])
            .args(extra)
            .env(SECRET_ENV, secret().as_env_value())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn pagewise dlm-server");
        let mut err = BufReader::new(child.stderr.take().expect("stderr"));
        let mut line = String::new();
        err.read_line(&mut line).expect("server's first line");
        let addr = line
            .split("listening on ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or_else(|| panic!("unexpected server banner {line:?}"))
            .to_string();
        // Keep draining stderr so the server never blocks on a full pipe.
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = std::sync::Arc::clone(&log);
        std::thread::spawn(move || {
            let mut l = String::new();
            while err.read_line(&mut l).map(|n| n > 0).unwrap_or(false) {
                sink.lock().unwrap().push(std::mem::take(&mut l));
            }
        });
        ServerProc { child, addr, log }
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then the JSON stats it printed.
    pub fn terminate(mut self) -> (std::process::ExitStatus, String) {
        // SAFETY: signalling our own child by pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let mut out = String::new();
        use std::io::Read;
        self.child.stdout.take().expect("stdout").read_to_string(&mut out).unwrap();
        let st = self.child.wait().unwrap();
        (st, out)
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Run test `name` of this test binary in a child process with `env` (the test sees
/// `DLM_CHILD=1` and runs its scenario).
pub fn run_child(name: &str, env: &[(&str, String)]) -> Output {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env("DLM_CHILD", "1")
        .env(SECRET_ENV, secret().as_env_value());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("running the child")
}

/// Scenarios that need a process with one thread (the runtime receives into the program's view
/// and hashes, or pins the program, only then): not a test of the harness, which has two
/// threads. Each runs in the test binary started again with `DLM_SCENARIO` naming it, before
/// `main` (before libtest starts any thread), from an `.init_array` entry of the test file
/// calling [`scenario_before_main`]. (A fork of the harness would have one thread too, but
/// after fork(2) in a threaded process only async-signal-safe work is allowed: `kernel::fork`.)
pub type Scenarios = &'static [(&'static str, fn())];

/// Declare a test file's [`Scenarios`] and the `.init_array` entry that runs the one
/// `DLM_SCENARIO` names before `main` ([`scenario_before_main`]).
#[macro_export]
macro_rules! scenarios {
    ($($name:literal => $f:expr),* $(,)?) => {
        const SCENARIOS: common::Scenarios = &[$(($name, $f)),*];

        #[used]
        #[link_section = ".init_array"]
        static SCENARIO_BEFORE_MAIN: extern "C" fn() = scenario_before_main;

        extern "C" fn scenario_before_main() {
            common::scenario_before_main(SCENARIOS);
        }
    };
}

/// Run the scenario `DLM_SCENARIO` names, if it is set, and exit: SCENARIO-OK on stdout and
/// status 0 when it returns, status 1 when it panics.
pub fn scenario_before_main(scenarios: Scenarios) {
    let Some(name) = std::env::var_os("DLM_SCENARIO") else { return };
    let Some(&(_, scenario)) = scenarios.iter().find(|(n, _)| std::ffi::OsStr::new(n) == name) else {
        eprintln!("unknown scenario {name:?}");
        std::process::exit(2);
    };
    let ok = std::panic::catch_unwind(scenario).is_ok();
    if ok {
        println!("SCENARIO-OK");
    }
    let _ = std::io::stdout().flush();
    std::process::exit(if ok { 0 } else { 1 });
}

/// Start a memory server (64 MiB) and run `scenario` in this test binary started again
/// ([`scenario_before_main`]), with the server's address in `DLM_TEST_SERVER` and `env`;
/// panics with its output unless it said SCENARIO-OK.
pub fn run_scenario(scenario: &str, env: &[(&str, String)]) {
    let server = ServerProc::start("64M");
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.env("DLM_SCENARIO", scenario).env("DLM_TEST_SERVER", &server.addr).env(SECRET_ENV, secret().as_env_value());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && so.contains("SCENARIO-OK"),
        "scenario {scenario}: {so}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn in_child() -> bool {
    std::env::var_os("DLM_CHILD").is_some()
}

/// Run `scenario` as test `name`: the test starts a memory server (64 MiB) and runs itself
/// again in a child process (`run_child`) with the server's address in `DLM_TEST_SERVER`; the
/// child runs `scenario` and says SCENARIO-OK when it returns.
pub fn with_server(name: &str, scenario: impl FnOnce()) {
    with_server_stderr(name, scenario);
}

/// As [`with_server`]; returns what the child printed to stderr (None in the child).
pub fn with_server_stderr(name: &str, scenario: impl FnOnce()) -> Option<String> {
    if in_child() {
        scenario();
        println!("SCENARIO-OK");
        return None;
    }
    let server = ServerProc::start("64M");
    let out = run_child(name, &[("DLM_TEST_SERVER", server.addr.clone())]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stdout.contains("SCENARIO-OK"), "child failed:\n{stdout}\n{stderr}");
    Some(stderr.into_owned())
}
