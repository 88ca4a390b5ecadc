//! `pagewise run` and `pagewise hps run` keep their program as a foreground job: SIGTERM to
//! the wrapper reaches the program and the wrapper still cleans up (the shim's private
//! directory, the servers it spawned), SIGINT to the wrapper alone is ignored, as system(3)
//! does while it waits.

#[allow(dead_code)] // Its C-program helpers are for the other tests.
mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{ensure_libpagewise, pagewise};

/// The program: prints where its preload shim is and its own pid, then waits for a signal.
const PROGRAM: &str = r#"echo "$LD_PRELOAD $$"; exec sleep 60"#;

struct Started {
    child: std::process::Child,
    shim: PathBuf,
    program: i32,
}

fn start(sub: &[&str]) -> Started {
    ensure_libpagewise();
    let mut child = Command::new(pagewise())
        .args(sub)
        .args(["--", "/bin/sh", "-c", PROGRAM])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let mut words = line.split_whitespace();
    let shim = PathBuf::from(words.next().unwrap_or_else(|| panic!("no output from the program: {line:?}")));
    let program = words.next().unwrap().parse().unwrap();
    assert!(shim.exists(), "{} exists while the program runs", shim.display());
    Started { child, shim, program }
}

fn alive(pid: i32) -> bool {
    pagewise_kernel::signal::process_alive(pid) && !zombie(pid)
}

fn zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit(')').next().unwrap().trim_start().starts_with('Z'))
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) takes no pointers.
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0);
}

/// SIGTERM to the wrapper: the program ends by it, the wrapper says so with 128+15 and
/// leaves nothing behind.
fn term_reaches_the_program_and_the_wrapper_cleans_up(sub: &[&str]) {
    let s = start(sub);
    signal(s.child.id(), libc::SIGTERM);
    let out = s.child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + libc::SIGTERM), "{err}");
    assert!(err.contains("killed by signal 15"), "{err}");
    assert!(!alive(s.program), "the program ended");
    assert!(!s.shim.parent().unwrap().exists(), "{} removed", s.shim.parent().unwrap().display());
}

/// SIGINT to the wrapper alone: ignored, the program runs on; SIGTERM then ends both.
fn int_to_the_wrapper_alone_is_ignored(sub: &[&str]) {
    let mut s = start(sub);
    signal(s.child.id(), libc::SIGINT);
    let until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < until {
        assert!(s.child.try_wait().unwrap().is_none(), "the wrapper ended on SIGINT");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(alive(s.program), "the program runs on");
    signal(s.child.id(), libc::SIGTERM);
    assert_eq!(s.child.wait().unwrap().code(), Some(128 + libc::SIGTERM));
    assert!(!s.shim.parent().unwrap().exists());
}

const RUN: &[&str] = &["run", "--spawn-servers", "1", "--local-mem", "8M"];
const HPS_RUN: &[&str] = &["hps", "run"];

#[test]
fn run_passes_sigterm_on_and_cleans_up() {
    term_reaches_the_program_and_the_wrapper_cleans_up(RUN);
}

#[test]
fn run_ignores_sigint_sent_to_it_alone() {
    int_to_the_wrapper_alone_is_ignored(RUN);
}

#[test]
fn hps_run_passes_sigterm_on_and_cleans_up() {
    term_reaches_the_program_and_the_wrapper_cleans_up(HPS_RUN);
}

#[test]
fn hps_run_ignores_sigint_sent_to_it_alone() {
    int_to_the_wrapper_alone_is_ignored(HPS_RUN);
}
