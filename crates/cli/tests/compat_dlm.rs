//! Compatibility of `pagewise run` (DLM) with programs nobody here wrote (issue 22): Debian's
//! xz, zstd, 7-Zip, GNU sort, python3 + numpy, sqlite3, gcc, perl, a JVM, memcached and
//! redis-server (linked with jemalloc), each with a local memory far below what it uses so
//! that its pages really travel to a memory server and back. Each must give the output of a
//! plain run (servers: every value read back as stored), within a budget no correct run comes
//! near. The JVM's heap must be on DLM memory, by the kernel's account (the userfaultfd-armed
//! mappings of the process, VmFlags `um` in /proc/PID/smaps, cover the heap).

mod compat;

use compat::{ensure_libpagewise, installed, pagewise, run_plain, same_as_plain, scratch, tail};
use pagewise_eval::programs::servers::{self, Kind};
use pagewise_eval::programs::{dlm_paging, jobs, routed_allocations, DlmFlags, Job, Wrap};

/// Local memory as a share (%) of what the program touches of its DLM memory: nine tenths. Its
/// pages go to the server and come back, yet the run finishes well within the budget: a
/// program that reads at random over more than its local memory pays a network round trip per
/// miss and thrashes, as it would on swap.
const SHARE: u64 = 90;

/// For a program that reads at random over all of its memory (zstd's match tables): a tenth
/// missing makes every tenth read a round trip; a thirty-second still makes pages travel.
const SHARE_RANDOM: u64 = 97;

/// The servers' local memory: below their 20 MB of values.
const SERVER_LOCAL_MEM: u64 = 12 << 20;

/// The default auto page size (up to 128 KiB), one spawned server, allocations from 256 KiB on.
fn dlm_with(local_mem: u64, page_size: Option<u64>) -> Wrap {
    Wrap::Dlm(DlmFlags {
        page_size,
        max_page_size: 128 << 10,
        local_mem,
        servers: 1,
        min_alloc: 256 << 10,
        decisions: None,
    })
}

/// Pages travelled: the runtime fetched units from the server and evicted units to it.
fn assert_travelled(stderr: &str, what: &str) {
    let p = dlm_paging(stderr).unwrap_or_else(|| panic!("{what}: no DLM counters on stderr\n{}", tail(stderr)));
    assert!(p.travelled(), "{what}: no page travelled ({p:?}): local memory holds it all\n{}", tail(stderr));
}

/// `job` plain, under `pagewise run` with local memory to spare (which measures what it
/// touches of its DLM memory), and with `share_pct` % of that: the same output each time, and
/// pages travelled in the last.
fn same_output_on_dlm(job: &Job, share_pct: u64) {
    let (plain, want) = run_plain(job);
    let roomy = same_as_plain(job, &plain, &want, &dlm_with(1 << 30, None), "dlm");
    let touched = dlm_paging(&roomy.stderr)
        .unwrap_or_else(|| panic!("{}: no DLM counters on stderr\n{}", job.name, tail(&roomy.stderr)))
        .peak_local_bytes;
    // A program whose use of its memory varies between runs may fit the first try: then half.
    for share in [share_pct, share_pct / 2] {
        let local = (touched * share / 100) & !((128 << 10) - 1);
        assert!(local >= 1 << 20, "{}: touches {touched} B of DLM memory, too little to page", job.name);
        let tight = same_as_plain(job, &plain, &want, &dlm_with(local, None), "dlm");
        if share < share_pct || dlm_paging(&tight.stderr).is_some_and(|p| p.travelled()) {
            assert_travelled(&tight.stderr, &job.name);
            return;
        }
    }
}

#[test]
fn xz_compresses_to_the_same_stream() {
    if !installed("xz", &["--version"]) {
        return;
    }
    let d = scratch("dlm-xz");
    // xz -9 on 2 MB: about 30 MB of match finder and dictionary.
    let job = jobs::xz(d.path(), 2 << 20).unwrap();
    same_output_on_dlm(&job, SHARE);
    let p = d.path();
    jobs::verify_round_trip(jobs::XZ_DECOMPRESS, &p.join("xz-input.txt.xz"), &p.join("xz-input.txt")).unwrap();
}

#[test]
fn zstd_compresses_to_the_same_stream() {
    if !installed("zstd", &["--version"]) {
        return;
    }
    let d = scratch("dlm-zstd");
    let job = jobs::zstd(d.path(), 4 << 20).unwrap();
    same_output_on_dlm(&job, SHARE_RANDOM);
    let p = d.path();
    jobs::verify_round_trip(jobs::ZSTD_DECOMPRESS, &p.join("out.zst"), &p.join("zstd-input.txt")).unwrap();
}

#[test]
fn seven_zip_archives_the_same() {
    if !installed("7zz", &["i"]) {
        return;
    }
    let d = scratch("dlm-7z");
    let job = jobs::seven_zip_archive(d.path(), 4 << 20, 16).unwrap();
    same_output_on_dlm(&job, SHARE);
    let t = std::process::Command::new("7zz").args(["t", "a.7z"]).current_dir(d.path()).output().unwrap();
    assert!(String::from_utf8_lossy(&t.stdout).contains("Everything is Ok"), "7zz t: {t:?}");
}

#[test]
fn sort_with_a_large_buffer_gives_the_same_order() {
    if !installed("sort", &["--version"]) {
        return;
    }
    let d = scratch("dlm-sort");
    let job = jobs::sort(d.path(), 6 << 20, 16 << 20).unwrap();
    same_output_on_dlm(&job, SHARE);
}

#[test]
fn numpy_fft_matmul_and_sort_give_the_same_digests() {
    if !installed(jobs::DEBIAN_PYTHON, &["-c", "import numpy"]) {
        return;
    }
    let d = scratch("dlm-numpy");
    let job = jobs::numpy(d.path(), 2 << 20).unwrap();
    same_output_on_dlm(&job, SHARE);
}

/// Python's multiprocessing with the fork start method: the workers read the parent's array,
/// most of it on the server (8 MiB of local memory for 32 MiB). Each worker gets a copy its
/// parent streams to it at the fork (preload/fork.c); before, each died of SIGSEGV on the
/// array and the pool started new ones forever.
#[test]
fn a_multiprocessing_pool_started_by_fork_reads_the_parents_array() {
    if !installed(jobs::DEBIAN_PYTHON, &["-c", "import numpy"]) {
        return;
    }
    let d = scratch("dlm-numpy-fork");
    let job = jobs::numpy_fork_pool(d.path(), 4_000_000).unwrap();
    let (plain, want) = run_plain(&job);
    let run = same_as_plain(&job, &plain, &want, &dlm_with(8 << 20, None), "dlm");
    assert_travelled(&run.stderr, &job.name);
}

#[test]
fn sqlite3_answers_the_same() {
    if !installed("sqlite3", &["--version"]) {
        return;
    }
    let d = scratch("dlm-sqlite");
    let job = jobs::sqlite(d.path(), 200_000).unwrap();
    same_output_on_dlm(&job, SHARE);
}

#[test]
fn gcc_compiles_a_large_file_to_the_same_assembly() {
    if !installed("gcc", &["--version"]) {
        return;
    }
    let d = scratch("dlm-gcc");
    let job = jobs::gcc(d.path(), 400).unwrap();
    same_output_on_dlm(&job, SHARE);
}

#[test]
fn perl_hashes_and_sorts_the_same() {
    if !installed("perl", &["-v"]) {
        return;
    }
    let d = scratch("dlm-perl");
    same_output_on_dlm(&jobs::perl(d.path(), 300_000), SHARE);
}

/// Fill a server under `pagewise run` with 20 MB of values, read every one back, stop it; the
/// shim must have routed its memory.
fn server_keeps_every_value(kind: Kind, program: &str, probe: &[&str]) {
    if !installed(program, probe) {
        return;
    }
    ensure_libpagewise();
    let d = scratch(&format!("dlm-{}", kind.name()));
    let s = servers::start(kind, &pagewise(), &dlm_with(SERVER_LOCAL_MEM, None), 256, d.path()).unwrap();
    let (records, value) = (20_000, 1000);
    let filled = servers::fill(kind, &s.addr, records, value);
    let checked = filled.as_ref().ok().map(|_| servers::check_all(kind, &s.addr, records, value));
    let read = servers::zipfian_reads(kind, &s.addr, records, value, 20_000, 7);
    let err = s.stop().unwrap();
    filled.unwrap_or_else(|e| panic!("{}: {e:#}\n{}", kind.name(), tail(&err)));
    checked.unwrap().unwrap_or_else(|e| panic!("{}: {e:#}\n{}", kind.name(), tail(&err)));
    let read = read.unwrap_or_else(|e| panic!("{}: {e:#}\n{}", kind.name(), tail(&err)));
    assert_eq!(read.misses, 0, "{}: stored records missing", kind.name());
    let routed = routed_allocations(&err, "dlm").unwrap_or_else(|| panic!("{}: no routing report\n{err}", kind.name()));
    assert!(routed >= 1, "{}: nothing on DLM memory\n{err}", kind.name());
    assert_travelled(&err, kind.name());
}

#[test]
fn memcached_keeps_every_value() {
    server_keeps_every_value(Kind::Memcached, "memcached", &["-V"]);
}

/// Debian's redis-server brings its own allocator (libjemalloc.so.2).
#[test]
fn redis_with_jemalloc_keeps_every_value() {
    server_keeps_every_value(Kind::Redis, "redis-server", &["--version"]);
}

/// redis's BGSAVE forks a child that writes the dataset from its parent's memory, most of it on
/// the server here: the child gets a copy its parent streams to it (preload/fork.c). A plain
/// redis-server started on the snapshot holds every value. Before, the child died of SIGSEGV
/// and redis, its snapshot failed, refused writes.
#[test]
fn redis_bgsave_writes_a_snapshot_with_every_value() {
    if !installed("redis-server", &["--version"]) || !installed("redis-cli", &["--version"]) {
        return;
    }
    ensure_libpagewise();
    let d = scratch("dlm-redis-bgsave");
    let s = servers::start(Kind::Redis, &pagewise(), &dlm_with(SERVER_LOCAL_MEM, None), 256, d.path()).unwrap();
    let (records, value) = (20_000, 1000);
    let filled = servers::fill(Kind::Redis, &s.addr, records, value);
    let port = s.addr.rsplit(':').next().unwrap().to_string();
    let cli = |args: &[&str]| {
        let o = std::process::Command::new("redis-cli").args(["-p", &port]).args(args).output().unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let mut status = String::new();
    if filled.is_ok() {
        cli(&["bgsave"]);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while std::time::Instant::now() < deadline {
            status = cli(&["info", "persistence"]);
            // The child was forked before BGSAVE's reply: in progress until it has written.
            if status.contains("rdb_bgsave_in_progress:0") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
    let err = s.stop().unwrap();
    filled.unwrap_or_else(|e| panic!("redis: {e:#}\n{}", tail(&err)));
    assert!(status.contains("rdb_last_bgsave_status:ok"), "BGSAVE failed:\n{status}\n{}", tail(&err));
    assert_travelled(&err, "redis");
    let plain = servers::start(Kind::Redis, &pagewise(), &Wrap::Plain, 256, d.path()).unwrap();
    let plain_port = plain.addr.rsplit(':').next().unwrap().to_string();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        let o =
            std::process::Command::new("redis-cli").args(["-p", &plain_port, "info", "persistence"]).output().unwrap();
        if String::from_utf8_lossy(&o.stdout).contains("\r\nloading:0") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let checked = servers::check_all(Kind::Redis, &plain.addr, records, value);
    let plain_err = plain.stop().unwrap();
    checked.unwrap_or_else(|e| panic!("the snapshot: {e:#}\n{}", tail(&plain_err)));
}

/// A JVM with a 128 MiB heap (serial GC) fills 48 MiB of arrays and sums them in scattered
/// order: the same sums as plain, with local memory to spare and with [`SHARE`] of what it
/// touched there, and the Java heap on DLM memory while it runs (the process's mappings armed
/// for userfaultfd missing faults, VmFlags `um`, cover the heap).
#[test]
fn jvm_heap_is_on_dlm_and_gives_the_same_sums() {
    if !installed("java", &["-version"]) {
        return;
    }
    let d = scratch("dlm-java");
    let armed_bytes = |pid| compat::mapping_bytes(pid, |_, flags| flags.split_whitespace().any(|f| f == "um"));
    let (_, roomy) = compat::jvm_same_sums(d.path(), &dlm_with(1 << 30, None), armed_bytes);
    let mut touched =
        dlm_paging(&roomy).unwrap_or_else(|| panic!("no DLM counters\n{}", tail(&roomy))).peak_local_bytes;
    // The JVM's use of its heap varies between runs (a run may touch less than the roomy one
    // did, and fit): then [`SHARE`] of what that run touched. Never much less: it sums in
    // scattered order, so each step down is a step into thrashing (at 45%, over 80 s).
    let mut tight = None;
    for _ in 0..3 {
        let local = (touched * SHARE / 100) & !((128 << 10) - 1);
        let (armed, err) = compat::jvm_same_sums(d.path(), &dlm_with(local, None), armed_bytes);
        let paging = dlm_paging(&err);
        tight = Some((armed, err));
        match paging {
            Some(p) if !p.travelled() => touched = p.peak_local_bytes,
            _ => break,
        }
    }
    let (armed, err) = tight.expect("at least one tight run");
    assert!(routed_allocations(&err, "dlm").unwrap_or(0) >= 1, "nothing routed\n{}", tail(&err));
    assert_travelled(&err, "java");
    assert!(
        armed >= compat::JVM_HEAP_MIB << 20,
        "only {armed} bytes of the JVM are on DLM memory, not its {} MiB heap\n{}",
        compat::JVM_HEAP_MIB,
        tail(&err)
    );
}
