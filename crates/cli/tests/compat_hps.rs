//! Compatibility of `pagewise hps run` (HPS) with programs nobody here wrote (issue 22): the
//! same Debian programs as compat_dlm.rs — xz, zstd, 7-Zip, GNU sort, python3 + numpy,
//! sqlite3, gcc, perl, a JVM, memcached and redis-server (jemalloc) — each giving the output of
//! a plain run (servers: every value read back as stored), with its large allocations routed
//! into HPS's tracked memory; and numpy's array read by a multiprocessing pool made by fork.

mod compat;

use compat::{ensure_libpagewise, installed, pagewise, same_output, scratch, tail};
use pagewise_eval::programs::servers::{self, Kind};
use pagewise_eval::programs::{jobs, routed_allocations, Outcome, Wrap};

fn hps() -> Wrap {
    Wrap::Hps { min_alloc: 1 << 20, track_placed: false }
}

/// `same_output` under HPS.
fn same_under_hps(job: &pagewise_eval::programs::Job) -> (Outcome, Outcome) {
    same_output(job, &hps(), "hps")
}

#[test]
fn xz_compresses_to_the_same_stream() {
    if !installed("xz", &["--version"]) {
        return;
    }
    let d = scratch("hps-xz");
    same_under_hps(&jobs::xz(d.path(), 2 << 20).unwrap());
    let p = d.path();
    jobs::verify_round_trip(jobs::XZ_DECOMPRESS, &p.join("xz-input.txt.xz"), &p.join("xz-input.txt")).unwrap();
}

#[test]
fn zstd_compresses_to_the_same_stream() {
    if !installed("zstd", &["--version"]) {
        return;
    }
    let d = scratch("hps-zstd");
    same_under_hps(&jobs::zstd(d.path(), 4 << 20).unwrap());
    let p = d.path();
    jobs::verify_round_trip(jobs::ZSTD_DECOMPRESS, &p.join("out.zst"), &p.join("zstd-input.txt")).unwrap();
}

#[test]
fn seven_zip_archives_the_same() {
    if !installed("7zz", &["i"]) {
        return;
    }
    let d = scratch("hps-7z");
    same_under_hps(&jobs::seven_zip_archive(d.path(), 4 << 20, 16).unwrap());
}

#[test]
fn sort_with_a_large_buffer_gives_the_same_order() {
    if !installed("sort", &["--version"]) {
        return;
    }
    let d = scratch("hps-sort");
    same_under_hps(&jobs::sort(d.path(), 6 << 20, 16 << 20).unwrap());
}

#[test]
fn numpy_fft_matmul_and_sort_give_the_same_digests() {
    if !installed(jobs::DEBIAN_PYTHON, &["-c", "import numpy"]) {
        return;
    }
    let d = scratch("hps-numpy");
    same_under_hps(&jobs::numpy(d.path(), 2 << 20).unwrap());
}

#[test]
fn a_multiprocessing_pool_started_by_fork_reads_the_parents_array() {
    if !installed(jobs::DEBIAN_PYTHON, &["-c", "import numpy"]) {
        return;
    }
    let d = scratch("hps-numpy-fork");
    same_under_hps(&jobs::numpy_fork_pool(d.path(), 4_000_000).unwrap());
}

#[test]
fn sqlite3_answers_the_same() {
    if !installed("sqlite3", &["--version"]) {
        return;
    }
    let d = scratch("hps-sqlite");
    same_under_hps(&jobs::sqlite(d.path(), 200_000).unwrap());
}

#[test]
fn gcc_compiles_a_large_file_to_the_same_assembly() {
    if !installed("gcc", &["--version"]) {
        return;
    }
    let d = scratch("hps-gcc");
    same_under_hps(&jobs::gcc(d.path(), 400).unwrap());
}

#[test]
fn perl_hashes_and_sorts_the_same() {
    if !installed("perl", &["-v"]) {
        return;
    }
    let d = scratch("hps-perl");
    same_under_hps(&jobs::perl(d.path(), 300_000));
}

/// The JVM's sums are the plain run's, with its heap in HPS's tracked memory under
/// `--track-placed`: the JVM reserves it PROT_NONE and commits it with MAP_FIXED, and HPS
/// makes an arena exactly there.
#[test]
fn jvm_heap_is_in_hps_memory_and_gives_the_same_sums() {
    if !installed("java", &["-version"]) {
        return;
    }
    let d = scratch("hps-java");
    let (tracked, err) =
        compat::jvm_same_sums(d.path(), &Wrap::Hps { min_alloc: 128 << 10, track_placed: true }, |pid| {
            compat::mapping_bytes(pid, |header, _| {
                header.split_whitespace().nth(5).is_some_and(|p| pagewise_track::is_arena_path(p, "pagewise-hps"))
            })
        });
    let routed = routed_allocations(&err, "hps").unwrap_or(0);
    assert!(routed >= 1, "nothing of the JVM is in HPS memory\n{}", tail(&err));
    assert!(
        tracked >= compat::JVM_HEAP_MIB << 20,
        "only {tracked} bytes of the JVM are in HPS memory, not its {} MiB heap\n{}",
        compat::JVM_HEAP_MIB,
        tail(&err)
    );
}

fn server_keeps_every_value(kind: Kind, program: &str, probe: &[&str]) {
    if !installed(program, probe) {
        return;
    }
    ensure_libpagewise();
    let d = scratch(&format!("hps-{}", kind.name()));
    let s = servers::start(kind, &pagewise(), &hps(), 256, d.path()).unwrap();
    let (records, value) = (20_000, 1000);
    let filled = servers::fill(kind, &s.addr, records, value);
    let checked = filled.as_ref().ok().map(|_| servers::check_all(kind, &s.addr, records, value));
    let read = servers::zipfian_reads(kind, &s.addr, records, value, 20_000, 7);
    let err = s.stop().unwrap();
    filled.unwrap_or_else(|e| panic!("{}: {e:#}\n{}", kind.name(), tail(&err)));
    checked.unwrap().unwrap_or_else(|e| panic!("{}: {e:#}\n{}", kind.name(), tail(&err)));
    let read = read.unwrap_or_else(|e| panic!("{}: {e:#}\n{}", kind.name(), tail(&err)));
    assert_eq!(read.misses, 0, "{}: stored records missing", kind.name());
    let routed = routed_allocations(&err, "hps").unwrap_or_else(|| panic!("{}: no routing report\n{err}", kind.name()));
    assert!(routed >= 1, "{}: nothing on HPS memory\n{err}", kind.name());
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
