//! The model-based check of the memory calls on routed memory (issue 22): tests/run/model.c
//! runs thousands of random sequences of mmap (every placement), munmap of any part, mremap in
//! every form, mprotect, madvise with every advice, aligned_alloc/calloc/realloc/free and
//! writes, printing every call's result and digests of all readable memory — nothing that
//! depends on addresses. Run plain it is the oracle; under `pagewise run` (a local memory of a
//! few units, so pages really travel) and `pagewise hps run` the output must be the same,
//! byte for byte, with no hang (a time limit per run).

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{compile, ensure_libpagewise, pagewise, tempdir};

/// Run `cmd` in a process group of its own, killed (the whole group: `pagewise run` and the
/// program it started) after `limit`, which fails the test as a hang.
fn run_limited(cmd: &mut Command, limit: Duration) -> Output {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    let mut child = cmd.process_group(0).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("starting");
    let read = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let out = read(Box::new(child.stdout.take().unwrap()));
    let err = read(Box::new(child.stderr.take().unwrap()));
    let end = std::time::Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().expect("waiting") {
            break st;
        }
        if std::time::Instant::now() > end {
            let _ = Command::new("kill").args(["-KILL", &format!("-{}", child.id())]).status();
            let _ = child.wait();
            panic!("{cmd:?} did not finish within {limit:?} (a hang)");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Output { status, stdout: out.join().unwrap(), stderr: err.join().unwrap() }
}

/// Sequences [first, first + count) plain and under `wrapper`; the outputs must match.
fn same_as_plain(model: &Path, wrapper: &[&str], first: u64, count: u64) {
    let args = [first.to_string(), count.to_string()];
    let plain = run_limited(Command::new(model).args(&args), Duration::from_secs(120));
    assert!(plain.status.success(), "model on its own: {plain:?}");
    let wrapped =
        run_limited(Command::new(pagewise()).args(wrapper).arg("--").arg(model).args(&args), Duration::from_secs(300));
    let err = String::from_utf8_lossy(&wrapped.stderr);
    let (a, b) = (String::from_utf8_lossy(&plain.stdout), String::from_utf8_lossy(&wrapped.stdout));
    // The sequence it stopped in, to reproduce a failure alone.
    let last_seq = b.lines().rev().find(|l| l.starts_with("seq ")).unwrap_or("no sequence begun");
    assert!(
        wrapped.status.success(),
        "model under {wrapper:?}: {:?} in {last_seq} (reproduce: {} FIRST 1 with FIRST the seq number)\n{err}",
        wrapped.status,
        model.display()
    );
    if a != b {
        let (al, bl): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
        let i = al.iter().zip(&bl).position(|(x, y)| x != y).unwrap_or(al.len().min(bl.len()));
        let seq = al[..i].iter().rev().find(|l| l.starts_with("seq ")).unwrap_or(&"seq ?");
        panic!(
            "under {wrapper:?} the model diverges from plain memory in {seq}, line {}:\n plain:   {:?}\n wrapped: {:?}\n\
             (reproduce: {} FIRST 1 with FIRST the seq number)\n{err}",
            i + 1,
            al.get(i),
            bl.get(i),
            model.display()
        );
    }
    let routed: u64 = err
        .lines()
        .find_map(|l| l.strip_prefix("pagewise: ")?.split(" allocation(s) on ").next()?.parse().ok())
        .unwrap_or(0);
    assert!(routed >= count, "under {wrapper:?} only {routed} allocations were routed:\n{err}");
}

/// The model compiled into a private directory of the calling test's own (tests run in
/// parallel: one writing the binary another is starting would make that start fail with
/// ETXTBSY); the directory lives as long as the first value.
fn model(test: &str) -> (pagewise_kernel::private_dir::PrivateDir, std::path::PathBuf) {
    ensure_libpagewise();
    let dir = tempdir(test);
    let m = compile("model", dir.path());
    (dir, m)
}

#[test]
fn dlm_gives_plain_memory_semantics_at_16k_units() {
    let (_dir, m) = model("model-16k");
    let dlm = ["run", "--spawn-servers", "2", "--min-alloc", "64K", "--local-mem", "256K", "--page-size", "16K"];
    same_as_plain(&m, &dlm, 1, 1500);
}

#[test]
fn dlm_gives_plain_memory_semantics_at_an_auto_page_size() {
    let (_dir, m) = model("model-auto");
    let dlm = ["run", "--spawn-servers", "2", "--min-alloc", "64K", "--local-mem", "256K", "--page-size", "auto"];
    same_as_plain(&m, &dlm, 10_001, 1500);
}

#[test]
fn dlm_gives_plain_memory_semantics_at_4k_units() {
    let (_dir, m) = model("model-4k");
    let dlm = ["run", "--spawn-servers", "1", "--min-alloc", "64K", "--local-mem", "256K", "--page-size", "4K"];
    same_as_plain(&m, &dlm, 20_001, 300);
}

#[test]
fn hps_gives_plain_memory_semantics() {
    let (_dir, m) = model("model-hps");
    same_as_plain(&m, &["hps", "run", "--min-alloc", "64K"], 30_001, 1500);
}

/// Allocations from 16 KiB on are routed: many small areas, placed where others were unmapped
/// or right next to one another (seed 310194 freed an older area that shared a block's start).
#[test]
fn dlm_gives_plain_memory_semantics_with_small_allocations_routed() {
    let (_dir, m) = model("model-small");
    let dlm = ["run", "--spawn-servers", "2", "--min-alloc", "16K", "--local-mem", "96K", "--page-size", "auto"];
    same_as_plain(&m, &dlm, 310_001, 600);
}

/// As above under HPS: the runtime's own threads allocate more than 16 KiB at times, which must
/// never come from the arena they track.
/// With late routing off: every arena tracked memory (a memfd) from the start.
#[test]
fn hps_gives_plain_memory_semantics_in_tracked_memory_from_the_start() {
    let (_dir, m) = model("model-hps-at-once");
    same_as_plain(&m, &["hps", "run", "--min-alloc", "64K", "--late-routing", "off"], 61_001, 1500);
}

/// Arenas young at first and moved into tracked memory as soon as the tracking thread looks
/// (every 20 ms, the pace never in the way), while the sequences go on using them.
#[test]
fn hps_gives_plain_memory_semantics_while_memory_moves_in() {
    let (_dir, m) = model("model-hps-moving");
    let hps = ["hps", "run", "--min-alloc", "64K", "--late-routing", "0", "--pace", "1", "--pace-ramp", "0"];
    same_as_plain(&m, &hps, 91_001, 1500);
}

#[test]
fn hps_gives_plain_memory_semantics_with_placed_memory_tracked() {
    let (_dir, m) = model("model-hps-placed");
    same_as_plain(&m, &["hps", "run", "--min-alloc", "16K", "--track-placed"], 512_001, 1500);
}

#[test]
fn hps_gives_plain_memory_semantics_with_small_allocations_routed() {
    let (_dir, m) = model("model-hps-small");
    same_as_plain(&m, &["hps", "run", "--min-alloc", "16K"], 329_001, 1500);
}

#[test]
fn dlm_gives_plain_memory_semantics_with_erasure_coded_units() {
    let (_dir, m) = model("model-ec");
    let dlm = [
        "run",
        "--spawn-servers",
        "4",
        "--redundancy",
        "ec:2+1",
        "--min-alloc",
        "64K",
        "--local-mem",
        "256K",
        "--page-size",
        "auto",
    ];
    same_as_plain(&m, &dlm, 40_001, 800);
}

#[test]
fn dlm_gives_plain_memory_semantics_with_copied_units() {
    let (_dir, m) = model("model-copies");
    let dlm = [
        "run",
        "--spawn-servers",
        "3",
        "--redundancy",
        "copies:2",
        "--min-alloc",
        "64K",
        "--local-mem",
        "256K",
        "--page-size",
        "16K",
    ];
    same_as_plain(&m, &dlm, 50_001, 400);
}
