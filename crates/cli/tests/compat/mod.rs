//! What the compatibility tests share (compat_dlm.rs, compat_hps.rs): a third-party program
//! (pagewise_eval::programs) run plain and under a Pagewise wrapper must give the same
//! canonical output, and the wrapper must really have put its memory on Pagewise.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use pagewise_eval::programs::{descendant_named, jobs, routed_allocations, run, Job, Outcome, Scratch, Wrap};

pub fn pagewise() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_pagewise"))
}

/// libpagewise.so must sit next to the binary (`make build` builds the workspace).
pub fn ensure_libpagewise() {
    static BUILD: std::sync::Once = std::sync::Once::new();
    BUILD.call_once(|| {
        let lib = pagewise().parent().unwrap().join("libpagewise.so");
        if !lib.exists() {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let st =
                std::process::Command::new(cargo).args(["build", "--release", "-p", "pagewise-capi"]).status().unwrap();
            assert!(st.success(), "building libpagewise.so failed");
        }
    });
}

/// Whether `program` runs here (`--version`-like probe); the tests need Debian's packages
/// (make deps installs them), and their absence is a skip with the reason.
pub fn installed(program: &str, probe: &[&str]) -> bool {
    let ok = std::process::Command::new(program).args(probe).output().is_ok_and(|o| o.status.success());
    if !ok {
        pagewise_kernel::testing::skip(format!("{program} is not installed (make deps)"));
    }
    ok
}

/// A budget no correct run comes near (plain runs take about a second): a run that needs it
/// hangs or thrashes, and fails.
pub const BUDGET: Duration = Duration::from_secs(45);

/// Run `job` plain, then under `wrap`; both must finish, the outputs be the same, and the shim
/// must report routed allocations on `arena`. Returns (plain, wrapped) outcomes.
#[allow(dead_code)] // compat_hps.rs uses it; compat_dlm.rs sizes its runs
pub fn same_output(job: &Job, wrap: &Wrap, arena: &str) -> (Outcome, Outcome) {
    let (plain, want) = run_plain(job);
    let wrapped = same_as_plain(job, &plain, &want, wrap, arena);
    (plain, wrapped)
}

/// `job` run on its own: its outcome and canonical output.
pub fn run_plain(job: &Job) -> (Outcome, String) {
    ensure_libpagewise();
    job.reset().unwrap();
    let plain = run(job.command(&pagewise(), &Wrap::Plain), BUDGET, None).unwrap();
    let want = job.canonical(&plain).unwrap_or_else(|e| panic!("{} on its own: {e:#}", job.name));
    (plain, want)
}

/// `job` under `wrap` must finish with the plain run's canonical output `want`, its memory
/// routed to `arena`.
pub fn same_as_plain(job: &Job, plain: &Outcome, want: &str, wrap: &Wrap, arena: &str) -> Outcome {
    job.reset().unwrap();
    let wrapped = run(job.command(&pagewise(), wrap), BUDGET, None).unwrap();
    let what = format!("{} under {wrap:?}", job.name);
    assert!(
        wrapped.finished(),
        "{what}: did not finish within {BUDGET:?} (plain: {:.1} s)\n{}",
        plain.wall,
        tail(&wrapped.stderr)
    );
    let got = job.canonical(&wrapped).unwrap_or_else(|e| panic!("{what}: {e:#}\n{}", tail(&wrapped.stderr)));
    assert_eq!(got, want, "{what}: the output differs from the plain run's\n{}", tail(&wrapped.stderr));
    let routed = routed_allocations(&wrapped.stderr, arena)
        .unwrap_or_else(|| panic!("{what}: no routing report on stderr\n{}", tail(&wrapped.stderr)));
    assert!(routed >= 1, "{what}: nothing ran on {arena} memory\n{}", tail(&wrapped.stderr));
    wrapped
}

pub fn tail(text: &str) -> String {
    pagewise_eval::programs::tail(text, 30)
}

pub fn scratch(tag: &str) -> Scratch {
    Scratch::new(&format!("compat-{tag}")).unwrap()
}

/// The JVM tests' heap (-Xms = -Xmx).
pub const JVM_HEAP_MIB: u64 = 128;

/// The bytes of `pid`'s mappings for which `keep(first line, VmFlags)` holds
/// (/proc/PID/smaps).
pub fn mapping_bytes(pid: u32, keep: impl Fn(&str, &str) -> bool) -> u64 {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let (mut total, mut size, mut header) = (0, 0, String::new());
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            header = line.to_string();
        } else if let Some(kb) = line.strip_prefix("Size:") {
            size = kb.trim().trim_end_matches(" kB").trim().parse::<u64>().unwrap_or(0) * 1024;
        } else if let Some(flags) = line.strip_prefix("VmFlags:") {
            if keep(&header, flags) {
                total += size;
            }
        }
    }
    total
}

/// A JVM with a [`JVM_HEAP_MIB`] heap (serial GC) fills 48 MiB of long arrays and sums them
/// twice in scattered order (crates/eval/programs/HeapWork.java), plain and under `wrap`: the
/// sums must be the same. While the wrapped JVM still runs (its rounds printed, waiting on
/// stdin), `measure(java's pid)` looks at it. Returns (what `measure` gave, the wrapped run's
/// stderr).
pub fn jvm_same_sums(dir: &Path, wrap: &Wrap, measure: impl Fn(u32) -> u64) -> (u64, String) {
    ensure_libpagewise();
    let job = jobs::java(dir, JVM_HEAP_MIB, 48, 2, true).unwrap();
    let run_one = |wrap: &Wrap| -> (String, u64, String) {
        let mut cmd = job.command(&pagewise(), wrap);
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        // stdout line by line and stderr whole, each on its own thread, so neither pipe can
        // fill and stall the program, and a silent program cannot stall the test.
        let (lines, got) = std::sync::mpsc::channel();
        let out = BufReader::new(child.stdout.take().unwrap());
        std::thread::spawn(move || {
            for line in out.lines() {
                let Ok(line) = line else { break };
                if lines.send(line).is_err() {
                    break;
                }
            }
        });
        let mut stderr = child.stderr.take().unwrap();
        let err_reader = std::thread::spawn(move || {
            let mut err = String::new();
            let _ = stderr.read_to_string(&mut err);
            err
        });
        let mut text = String::new();
        let deadline = Instant::now() + BUDGET;
        let next_line =
            |until: Instant| got.recv_timeout(until.saturating_duration_since(Instant::now())).ok().map(|l| l + "\n");
        while text.lines().count() < 2 {
            match next_line(deadline) {
                Some(l) => text.push_str(&l),
                None => break,
            }
        }
        let seen = descendant_named(child.id(), "java").map_or(0, &measure);
        let _ = child.stdin.take().unwrap().write_all(b"\n");
        let until = Instant::now() + Duration::from_secs(15);
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break Some(st);
            }
            if Instant::now() > until {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        while let Some(l) = next_line(Instant::now() + Duration::from_secs(1)) {
            text.push_str(&l);
        }
        let err = err_reader.join().unwrap_or_default();
        assert!(
            status.is_some_and(|s| s.success()),
            "java under {wrap:?}: {status:?} (killed if None: no exit within {BUDGET:?} + 15 s); printed {text:?}\n{}",
            tail(&err)
        );
        (text, seen, err)
    };
    let (plain, _, _) = run_one(&Wrap::Plain);
    assert_eq!(plain.lines().count(), 2, "java on its own printed {plain:?}");
    let (under, seen, err) = run_one(wrap);
    assert_eq!(under, plain, "java under {wrap:?}: the sums differ\n{}", tail(&err));
    (seen, err)
}
