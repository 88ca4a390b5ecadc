//! Compile tests/dlm_test.c with `cc` against libpagewise.a and run it against two real
//! `pagewise dlm-server` processes, in each userfaultfd fault mode and the SIGSEGV fallback.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(|d| d.parent()).unwrap().to_path_buf()
}

struct Server(Child, String);

/// The secret of this test's servers, handed to them and to the C program in the environment.
fn secret() -> &'static pagewise_dlm::auth::Secret {
    static S: std::sync::OnceLock<pagewise_dlm::auth::Secret> = std::sync::OnceLock::new();
    S.get_or_init(|| pagewise_dlm::auth::Secret::generate().unwrap())
}

impl Server {
    fn start() -> Self {
        let bin = target_dir().join("pagewise");
        if !bin.exists() {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            assert!(Command::new(cargo).args(["build", "--release", "-p", "pagewise-cli"]).status().unwrap().success());
        }
        let mut c = Command::new(bin)
            .args(["dlm-server", "--listen", "127.0.0.1:0", "--capacity", "1G"])
            .env(pagewise_dlm::auth::SECRET_ENV, secret().as_env_value())
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let mut err = BufReader::new(c.stderr.take().unwrap());
        let mut line = String::new();
        err.read_line(&mut line).unwrap();
        let addr = line.split("listening on ").nth(1).unwrap().split_whitespace().next().unwrap().to_string();
        std::thread::spawn(move || {
            let mut s = Vec::new();
            let _ = err.read_to_end(&mut s);
        });
        Server(c, addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn c_program_uses_the_dlm_api() {
    let dir = target_dir();
    let lib = dir.join("libpagewise.a");
    assert!(lib.exists(), "{} missing", lib.display());
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let exe = dir.join("dlm_c_test");
    let out = Command::new("cc")
        .arg("-O2")
        .arg("-Wall")
        .arg("-I")
        .arg(root.join("include"))
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/dlm_test.c"))
        .arg(&lib)
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&exe)
        .output()
        .expect("cc");
    assert!(out.status.success(), "cc failed: {}", String::from_utf8_lossy(&out.stderr));
    let servers = [Server::start(), Server::start()];
    let addrs = format!("{},{}", servers[0].1, servers[1].1);
    for mode in ["thread", "sigbus", "sigsegv"] {
        let out = Command::new(&exe)
            .env("PAGEWISE_DLM_SERVERS", &addrs)
            .env(pagewise_dlm::auth::SECRET_ENV, secret().as_env_value())
            .env("PAGEWISE_DLM_LOCAL_MEM", "4M")
            .env("PAGEWISE_DLM_PAGE_SIZE", "16K")
            .env("PAGEWISE_DLM_MAX_SET", "8")
            .env("PAGEWISE_DLM_FAULT_MODE", mode)
            .output()
            .unwrap();
        let so = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && so.contains("C-DLM-OK"),
            "mode {mode}: {so}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
