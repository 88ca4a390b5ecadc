//! `pagewise run --redundancy` on an unmodified C program (issue 24 item 3): a memory server
//! SIGKILLed at a random point of the run, and the program's output is the same as on its
//! own. The servers are real `pagewise dlm-server` processes the test starts (`--servers`), so
//! it can kill one; the point is a random fraction of a run of the same command without a
//! failure, measured first. Also: too few servers for the redundancy asked is refused before
//! the program starts.

mod common;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{compile, ensure_libpagewise, pagewise, tempdir};
use pagewise_dlm::auth::{Secret, SECRET_ENV};
use pagewise_dlm::process::ServerProcess;

/// Run `prog args` under `pagewise run --redundancy scheme` on `servers` fresh servers; with
/// `kill` = Some((server, after)), that server is SIGKILLed `after` into the run. The output
/// and how long the run took.
fn run(
    scheme: &str,
    servers: usize,
    kill: Option<(usize, Duration)>,
    prog: &std::path::Path,
    args: &[&str],
) -> (Output, Duration) {
    let secret = Secret::generate().unwrap();
    let procs: Vec<ServerProcess> =
        (0..servers).map(|_| ServerProcess::spawn(&pagewise(), "1G", &secret).expect("a memory server")).collect();
    let addrs: Vec<&str> = procs.iter().map(|p| p.addr.as_str()).collect();
    let start = Instant::now();
    let child = Command::new(pagewise())
        .args([
            "run",
            "--servers",
            &addrs.join(","),
            "--redundancy",
            scheme,
            "--local-mem",
            "1M",
            "--min-alloc",
            "256K",
        ])
        .args(["--page-size", "auto", "--fault-timeout", "10", "--"])
        .arg(prog)
        .args(args)
        .env(SECRET_ENV, secret.as_env_value())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("pagewise run");
    if let Some((victim, after)) = kill {
        std::thread::sleep(after);
        // SAFETY: signalling a server process this test started.
        unsafe { libc::kill(procs[victim].pid() as i32, libc::SIGKILL) };
    }
    let out = child.wait_with_output().expect("pagewise run");
    (out, start.elapsed())
}

fn survives(scheme: &str, servers: usize, seeds: std::ops::Range<u64>) {
    ensure_libpagewise();
    let scratch = tempdir(&format!("failover-{scheme}"));
    let prog = compile("matmul", scratch.path());
    let direct = Command::new(&prog).arg("512").output().unwrap();
    assert!(direct.status.success());
    let (calm, took) = run(scheme, servers, None, &prog, &["512"]);
    assert!(calm.status.success(), "{scheme} without a failure: {}", String::from_utf8_lossy(&calm.stderr));
    assert_eq!(calm.stdout, direct.stdout, "{scheme} without a failure");
    for seed in seeds {
        // A point between a twentieth and two fifths into the run (early enough to land on a
        // busier machine too), and a victim, from the seed.
        let x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11;
        let mut after = took.mul_f64(0.05 + 0.35 * (x % 1000) as f64 / 1000.0);
        let victim = (x / 1000) as usize % servers;
        // A kill the program never hears of (it ended, or needed nothing more of that server,
        // first: a run faster than the calm one on a busy machine) tests nothing: earlier.
        for attempt in 0..4 {
            let (out, _) = run(scheme, servers, Some((victim, after)), &prog, &["512"]);
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{scheme} seed {seed}: server {victim} killed after {after:?}: {err}");
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&direct.stdout),
                "{scheme} seed {seed}: server {victim} killed after {after:?}: {err}"
            );
            if err.contains(") lost: ") {
                break;
            }
            assert!(attempt < 3, "{scheme} seed {seed}: the loss went unnoticed (last killed after {after:?}):\n{err}");
            after /= 2;
        }
    }
}

#[test]
fn matmul_survives_a_killed_server_under_erasure_coding() {
    survives("ec:2+1", 4, 0..3);
}

#[test]
fn matmul_survives_a_killed_server_under_copies() {
    survives("copies:2", 3, 10..13);
}

#[test]
fn too_few_servers_for_the_redundancy_are_refused_up_front() {
    ensure_libpagewise();
    let out = Command::new(pagewise())
        .args(["run", "--spawn-servers", "2", "--redundancy", "ec:2+1", "--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("at least 3"), "{err}");
    let out = Command::new(pagewise()).args(["run", "--redundancy", "raid5", "--", "true"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--redundancy"), "{err}");
}
