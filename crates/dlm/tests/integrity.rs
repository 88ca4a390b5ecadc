//! Data integrity of DLM areas under random reads and writes from several threads, with a
//! local limit 16× below the area, several memory servers, and set-count changes mid-run —
//! once per fault mode (handler thread, SIGBUS, SIGSEGV fallback). Real servers, real faults.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use common::{in_child, run_child, ServerProc};
use pagewise_dlm::{Config, Dlm, FaultMode};
use rand::{Rng, SeedableRng};

const CHUNK: usize = 4096;

fn word(chunk: usize, version: u64, i: usize) -> u64 {
    (chunk as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ version.wrapping_mul(0xC2B2_AE3D_27D4_EB4F) ^ i as u64
}

/// Check one chunk against its model version (0: never written, zeros).
fn check(base: usize, chunk: usize, version: u64) {
    let p = (base + chunk * CHUNK) as *const u64;
    for i in [0, 1, CHUNK / 16, CHUNK / 8 - 1] {
        // SAFETY: inside the area; the DLM runtime serves the fault.
        let v = unsafe { p.add(i).read_volatile() };
        let want = if version == 0 { 0 } else { word(chunk, version, i) };
        assert_eq!(v, want, "chunk {chunk} word {i} (version {version})");
    }
}

fn fill(base: usize, chunk: usize, version: u64) {
    let p = (base + chunk * CHUNK) as *mut u64;
    for i in 0..CHUNK / 8 {
        // SAFETY: inside the area; chunks are owned by one thread each.
        unsafe { p.add(i).write_volatile(word(chunk, version, i)) };
    }
}

/// The scenario, run inside a child process.
fn scenario(mode: FaultMode, zero_copy: bool) {
    let servers: Vec<String> = std::env::var("DLM_TEST_SERVERS").unwrap().split(',').map(String::from).collect();
    let area: usize = std::env::var("DLM_TEST_AREA").unwrap().parse().unwrap();
    let local: usize = area / 16;
    let cfg = Config {
        servers,
        local_mem: local,
        base_page: 16 << 10,
        max_set: 8,
        set_count: 8,
        fault_mode: mode,
        readahead: 16,
        zero_copy,
        ..Config::default()
    };
    let dlm = Arc::new(Dlm::init(cfg).expect("init"));
    assert_eq!(dlm.mode(), mode);
    let install = dlm.stats().install;
    match (mode, zero_copy) {
        (FaultMode::Sigsegv, _) => assert_eq!(install, "mprotect"),
        // Anonymous areas: replies moved in where the kernel has UFFDIO_MOVE.
        (_, false) => {
            use pagewise_kernel::uffd::{api_info, feature};
            let expected = if api_info().is_ok_and(|i| i.features & feature::MOVE != 0) { "move" } else { "copy" };
            assert_eq!(install, expected);
        }
        // Zero-copy falls back to copying only on kernels without shmem userfaultfd.
        (_, true) => {
            use pagewise_kernel::uffd::{api_info, feature};
            let shmem = feature::MISSING_SHMEM | feature::MINOR_SHMEM | feature::WP_HUGETLBFS_SHMEM;
            let expected = if api_info().is_ok_and(|i| i.features & shmem == shmem) { "continue" } else { "copy" };
            assert_eq!(install, expected);
        }
    }
    let base = dlm.alloc(area).expect("alloc") as usize;
    let chunks = area / CHUNK;
    let threads = 4;
    let ops_per_thread = 2500;
    let versions: Arc<Vec<AtomicU64>> = Arc::new((0..chunks).map(|_| AtomicU64::new(0)).collect());
    let done = Arc::new(AtomicU64::new(0));
    let mut hs = Vec::new();
    for t in 0..threads {
        let versions = Arc::clone(&versions);
        let done = Arc::clone(&done);
        hs.push(std::thread::spawn(move || {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(t as u64 + 7);
            for _ in 0..ops_per_thread {
                // Chunks c with c % threads == t belong to thread t: units are shared, chunks not.
                let c = rng.random_range(0..chunks / threads) * threads + t;
                let v = versions[c].load(Ordering::Relaxed);
                check(base, c, v);
                if rng.random_bool(0.7) {
                    fill(base, c, v + 1);
                    versions[c].store(v + 1, Ordering::Relaxed);
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    // Change the page size while the threads run: units of several sizes coexist.
    let total = (threads * ops_per_thread) as u64;
    for (i, s) in [1u32, 4, 2, 8, 1].into_iter().enumerate() {
        while done.load(Ordering::Relaxed) < total * (i as u64 + 1) / 6 {
            std::thread::yield_now();
        }
        dlm.set_count(s).unwrap();
        // Regression: making room could evict pages of the unit being requested, which were
        // then fetched without being counted, and the resident count fell behind.
        dlm.audit().unwrap();
    }
    for h in hs {
        h.join().unwrap();
    }
    dlm.set_count(4).unwrap();
    for c in 0..chunks {
        check(base, c, versions[c].load(Ordering::Relaxed));
    }
    dlm.audit().unwrap();
    let st = dlm.stats();
    eprintln!("stats: {}", serde_json::to_string(&st).unwrap());
    assert!(st.peak_resident_bytes <= local, "resident {} over limit {local}", st.peak_resident_bytes);
    assert!(st.evictions > 0 && st.writebacks > 0, "{st:?}");
    assert!(st.fetched_units > 0);
    let s0 = dlm.server_stats(0).unwrap();
    assert!(s0.bytes_in > 0 && s0.regions == 1, "{s0:?}");
    dlm.free(base as *mut u8).unwrap();
    let s0 = dlm.server_stats(0).unwrap();
    assert_eq!(s0.resident_bytes, 0, "server keeps nothing after free");
    println!("SCENARIO-OK");
}

/// One program thread: the runtime moves received pages into the program's view (the
/// multi-threaded scenario copies them) and write-protects clean units just after; under
/// SIGBUS a demand fault's reply is received into the program's view itself. Random reads
/// and writes, unit-size changes and evictions; every chunk checked at the end.
fn scenario_single_thread(mode: FaultMode) {
    let servers: Vec<String> = std::env::var("DLM_TEST_SERVERS").unwrap().split(',').map(String::from).collect();
    let area: usize = std::env::var("DLM_TEST_AREA").unwrap().parse().unwrap();
    let cfg = Config {
        servers,
        local_mem: area / 16,
        base_page: 16 << 10,
        max_set: 8,
        set_count: 8,
        fault_mode: mode,
        readahead: 16,
        ..Config::default()
    };
    let dlm = Dlm::init(cfg).expect("init");
    let threads = pagewise_kernel::procfs::ThreadCount::open().unwrap().get().unwrap();
    let own = if mode == FaultMode::HandlerThread { 2 } else { 1 };
    assert_eq!(threads, own, "the scenario needs one program thread");
    let base = dlm.alloc(area).expect("alloc") as usize;
    let chunks = area / CHUNK;
    let mut versions = vec![0u64; chunks];
    let mut rng = rand::rngs::SmallRng::seed_from_u64(11);
    for (i, s) in [8u32, 4, 8, 2, 8].into_iter().enumerate() {
        dlm.set_count(s).unwrap();
        for k in 0..4000 {
            // Half the time near the previous chunk (reuse), else anywhere.
            let c = if k % 2 == 0 { rng.random_range(0..chunks) } else { (k * 7 + i) % (chunks / 8) };
            check(base, c, versions[c]);
            if rng.random_bool(0.5) {
                versions[c] += 1;
                fill(base, c, versions[c]);
            }
        }
        dlm.audit().unwrap();
    }
    // The final check streams through the area. A few pauses on the way let read-ahead
    // replies arrive whole before the next fault, which then installs them ahead of the
    // program (`arrived_installs`); the check proves their bytes.
    let unit = 8 * (16 << 10) / CHUNK;
    for (c, &v) in versions.iter().enumerate() {
        if c % (chunks / 8) == unit * 4 {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        check(base, c, v);
    }
    let st = dlm.stats();
    eprintln!("stats: {}", serde_json::to_string(&st).unwrap());
    assert_eq!(st.install, "move");
    assert!(st.arrived_installs > 0, "replies that arrived whole are installed ahead: {st:?}");
    assert!(st.moved_units > 0 && st.writebacks > 0 && st.reference_faults > 0, "{st:?}");
    assert!(st.borrowed_receives > 0, "the final sequential check receives into borrowed frames: {st:?}");
    assert!(st.grouped_reads > 0, "read-ahead units share READs, installed a unit at a time: {st:?}");
    if mode == FaultMode::Sigbus {
        assert!(st.view_receives > 0, "demand faults receive into the program's view: {st:?}");
    }
    dlm.free(base as *mut u8).unwrap();
}

fn run(mode: FaultMode, zero_copy: bool, name: &str) {
    if in_child() {
        scenario(mode, zero_copy);
        return;
    }
    run_parent(name);
}

/// Run `scenario_single_thread` in a process with one thread: libtest runs each test on a
/// thread of its own, so the child forks and the grandchild (only the forking thread) runs it.
fn run_single_thread(mode: FaultMode, name: &str) {
    if !in_child() {
        return run_parent(name);
    }
    use pagewise_kernel::uffd::{api_info, feature};
    if !api_info().is_ok_and(|i| i.features & feature::MOVE != 0) {
        pagewise_kernel::testing::skip("userfaultfd lacks UFFDIO_MOVE (Linux 6.8)");
        println!("SCENARIO-OK");
        return;
    }
    // SAFETY: the grandchild runs only the scenario, then _exit; the other thread of this
    // process (libtest's main thread) waits for this one and holds no lock the scenario needs.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let ok = std::panic::catch_unwind(|| scenario_single_thread(mode)).is_ok();
        // SAFETY: ends the grandchild without running the parent's exit handlers.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "single-thread scenario failed: {status:#x}");
    println!("SCENARIO-OK");
}

fn run_parent(name: &str) {
    let servers: Vec<ServerProc> = (0..3).map(|_| ServerProc::start("1G")).collect();
    let addrs = servers.iter().map(|s| s.addr.clone()).collect::<Vec<_>>().join(",");
    let out = run_child(name, &[("DLM_TEST_SERVERS", addrs), ("DLM_TEST_AREA", (256usize << 20).to_string())]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stdout.contains("SCENARIO-OK"), "child failed:\n{stdout}\n{stderr}");
    for s in servers {
        let (st, json) = s.terminate();
        assert!(st.success(), "server exit {st}");
        let v: serde_json::Value = serde_json::from_str(json.trim()).expect("server --json stats");
        assert!(v["requests"].as_u64().unwrap() > 0);
        assert_eq!(v["resident_bytes"].as_u64(), Some(0));
    }
}

#[test]
fn integrity_handler_thread() {
    run(FaultMode::HandlerThread, true, "integrity_handler_thread");
}

#[test]
fn integrity_handler_thread_copy() {
    run(FaultMode::HandlerThread, false, "integrity_handler_thread_copy");
}

#[test]
fn integrity_sigbus() {
    run(FaultMode::Sigbus, true, "integrity_sigbus");
}

#[test]
fn integrity_sigbus_copy() {
    run(FaultMode::Sigbus, false, "integrity_sigbus_copy");
}

#[test]
fn integrity_sigsegv_fallback() {
    run(FaultMode::Sigsegv, true, "integrity_sigsegv_fallback");
}

#[test]
fn integrity_single_thread_sigbus() {
    run_single_thread(FaultMode::Sigbus, "integrity_single_thread_sigbus");
}

#[test]
fn integrity_single_thread_handler_thread() {
    run_single_thread(FaultMode::HandlerThread, "integrity_single_thread_handler_thread");
}
