//! Compatibility of `pagewise run` (DLM) with programs nobody here wrote (issue 22): Debian's
//! xz, zstd, 7-Zip, GNU sort, python3 + numpy, sqlite3, gcc, perl, a JVM, memcached and
//! redis-server (linked with jemalloc), each with a local memory far below what it uses so
//! that its pages really travel to a memory server and back. Each must give the output of a
//! plain run (servers: every value read back as stored), within a budget no correct run comes
//! near. The JVM's heap must be on DLM memory, by the kernel's account (the userfaultfd-armed
//! mappings of the process, VmFlags `um` in /proc/PID/smaps, cover the heap).

mod compat;

use compat::{ensure_libpagewise, installed, pagewise, same_output, scratch, tail};
use pagewise_eval::programs::servers::{self, Kind};
use pagewise_eval::programs::{jobs, routed_allocations, DlmFlags, Wrap};

/// 4 MiB of local memory, the default auto page size, one spawned server; allocations from
/// 256 KiB on are routed.
fn dlm() -> Wrap {
    dlm_with(4 << 20, None)
}

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

/// The plain run used at least `times` × the local memory: pages had to travel.
fn assert_footprint(plain_rss: u64, times: u64, what: &str) {
    assert!(
        plain_rss >= times * (4 << 20),
        "{what}: the plain run's peak RSS ({plain_rss} B) is too small to make pages travel"
    );
}

#[test]
fn xz_compresses_to_the_same_stream() {
    if !installed("xz", &["--version"]) {
        return;
    }
    let d = scratch("dlm-xz");
    // xz -9 on 2 MB: about 30 MB of match finder and dictionary.
    let job = jobs::xz(d.path(), 2 << 20).unwrap();
    let (plain, _) = same_output(&job, &dlm(), "dlm");
    assert_footprint(plain.max_rss, 4, "xz");
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
    same_output(&job, &dlm(), "dlm");
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
    let (plain, _) = same_output(&job, &dlm(), "dlm");
    assert_footprint(plain.max_rss, 4, "7zz");
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
    let (plain, _) = same_output(&job, &dlm_with(4 << 20, Some(64 << 10)), "dlm");
    assert_footprint(plain.max_rss, 2, "sort");
}

#[test]
fn numpy_fft_matmul_and_sort_give_the_same_digests() {
    if !installed(jobs::DEBIAN_PYTHON, &["-c", "import numpy"]) {
        return;
    }
    let d = scratch("dlm-numpy");
    let job = jobs::numpy(d.path(), 2 << 20).unwrap();
    let (plain, _) = same_output(&job, &dlm(), "dlm");
    assert_footprint(plain.max_rss, 4, "numpy");
}

#[test]
fn sqlite3_answers_the_same() {
    if !installed("sqlite3", &["--version"]) {
        return;
    }
    let d = scratch("dlm-sqlite");
    let job = jobs::sqlite(d.path(), 200_000).unwrap();
    same_output(&job, &dlm(), "dlm");
}

#[test]
fn gcc_compiles_a_large_file_to_the_same_assembly() {
    if !installed("gcc", &["--version"]) {
        return;
    }
    let d = scratch("dlm-gcc");
    let job = jobs::gcc(d.path(), 400).unwrap();
    same_output(&job, &dlm(), "dlm");
}

#[test]
fn perl_hashes_and_sorts_the_same() {
    if !installed("perl", &["-v"]) {
        return;
    }
    let d = scratch("dlm-perl");
    same_output(&jobs::perl(d.path(), 300_000), &dlm(), "dlm");
}

/// Fill a server under `pagewise run` with 20 MB of values, read every one back, stop it; the
/// shim must have routed its memory.
fn server_keeps_every_value(kind: Kind, program: &str, probe: &[&str]) {
    if !installed(program, probe) {
        return;
    }
    ensure_libpagewise();
    let d = scratch(&format!("dlm-{}", kind.name()));
    let s = servers::start(kind, &pagewise(), &dlm(), 256, d.path()).unwrap();
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

/// A JVM with a 128 MiB heap (serial GC) fills 48 MiB of arrays and sums them in scattered
/// order: the same sums as plain, and the Java heap on DLM memory while it runs (the
/// process's mappings armed for userfaultfd missing faults, VmFlags `um`, cover the heap).
#[test]
fn jvm_heap_is_on_dlm_and_gives_the_same_sums() {
    if !installed("java", &["-version"]) {
        return;
    }
    let d = scratch("dlm-java");
    let (armed, err) = compat::jvm_same_sums(d.path(), &dlm_with(16 << 20, None), |pid| {
        compat::mapping_bytes(pid, |_, flags| flags.split_whitespace().any(|f| f == "um"))
    });
    assert!(routed_allocations(&err, "dlm").unwrap_or(0) >= 1, "nothing routed\n{}", tail(&err));
    assert!(
        armed >= compat::JVM_HEAP_MIB << 20,
        "only {armed} bytes of the JVM are on DLM memory, not its {} MiB heap\n{}",
        compat::JVM_HEAP_MIB,
        tail(&err)
    );
}
