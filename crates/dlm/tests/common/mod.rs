//! Shared by the integration tests: real `pagewise dlm-server` processes and child processes
//! running one scenario each (the DLM runtime is one per process and installs signal handlers).
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Once;

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
    pub fn start_with(mut cmd: Command, listen: &str, capacity: &str) -> Self {
        let mut child = cmd
            .args(["dlm-server", "--listen", listen, "--capacity", capacity, "--json", "--verbose"])
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
    cmd.args(["--exact", name, "--nocapture", "--test-threads=1"]).env("DLM_CHILD", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("running the child")
}

pub fn in_child() -> bool {
    std::env::var_os("DLM_CHILD").is_some()
}

/// Run `scenario` as test `name`: the test starts a memory server (64 MiB) and runs itself
/// again in a child process (`run_child`) with the server's address in `DLM_TEST_SERVER`; the
/// child runs `scenario` and says SCENARIO-OK when it returns.
pub fn with_server(name: &str, scenario: impl FnOnce()) {
    if in_child() {
        scenario();
        println!("SCENARIO-OK");
        return;
    }
    let server = ServerProc::start("64M");
    let out = run_child(name, &[("DLM_TEST_SERVER", server.addr.clone())]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stdout.contains("SCENARIO-OK"), "child failed:\n{stdout}\n{stderr}");
}
