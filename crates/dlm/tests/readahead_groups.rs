//! Read-ahead units that share one READ (`Inner::request_ahead`): each is installed as a unit
//! of its own — write-protected or hashed, so a store to it is written home — and every byte
//! is the home's. A stream with stores on the way, at unit sizes from one 4 KiB page to
//! 128 KiB, under SIGBUS (moved in, then write-protected) and the handler thread (hashed,
//! moved in writable), and read-ahead asked for with `prefetch` (MADV_WILLNEED). Real server,
//! real faults, one program thread (where units are moved in from kept frames at all).

mod common;

use common::run_scenario;
use pagewise_dlm::{Config, Dlm, FaultMode};

scenarios! {
    "stream_sigbus_4k" => || stream(FaultMode::Sigbus, 4096, 1),
    "stream_sigbus_32k" => || stream(FaultMode::Sigbus, 16 << 10, 2),
    "stream_sigbus_128k" => || stream(FaultMode::Sigbus, 16 << 10, 8),
    "stream_thread_16k" => || stream(FaultMode::HandlerThread, 4096, 4),
    "stream_thread_128k" => || stream(FaultMode::HandlerThread, 16 << 10, 8),
    "prefetch_sigbus_64k" => prefetch,
}

const AREA: usize = 16 << 20;
const WORDS_PER_PAGE: usize = 4096 / 8;

fn value(word: usize, version: u64) -> u64 {
    (word as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ version.wrapping_mul(0xC2B2_AE3D_27D4_EB4F) | 1
}

fn dlm(mode: FaultMode, base_page: usize, set: u32) -> Dlm {
    Dlm::init(Config {
        servers: vec![std::env::var("DLM_TEST_SERVER").unwrap()],
        local_mem: AREA / 4,
        base_page,
        max_set: set,
        set_count: set,
        fault_mode: mode,
        readahead: 32,
        ..Config::default()
    })
    .expect("init")
}

/// An area with every 4 KiB page's first word at version 1, written home, nothing resident.
fn populated(dlm: &Dlm) -> *mut u64 {
    let base = dlm.alloc(AREA).expect("alloc") as *mut u64;
    for w in (0..AREA / 8).step_by(WORDS_PER_PAGE) {
        // SAFETY: inside the area; the runtime serves the fault.
        unsafe { base.add(w).write_volatile(value(w, 1)) };
    }
    dlm.evict_all();
    base
}

fn read(base: *mut u64, word: usize) -> u64 {
    // SAFETY: inside the area; the runtime serves the fault.
    unsafe { base.add(word).read_volatile() }
}

fn stream(mode: FaultMode, base_page: usize, set: u32) {
    let dlm = dlm(mode, base_page, set);
    let base = populated(&dlm);
    let before = dlm.stats();
    // One pass reads every page and stores version 2 into every third page; the next, after
    // every unit was evicted (written home if stored to), must see exactly those stores.
    for w in (0..AREA / 8).step_by(WORDS_PER_PAGE) {
        assert_eq!(read(base, w), value(w, 1), "word {w}, first pass");
        if (w / WORDS_PER_PAGE).is_multiple_of(3) {
            // SAFETY: inside the area; the runtime serves the fault.
            unsafe { base.add(w).write_volatile(value(w, 2)) };
        }
    }
    dlm.audit().unwrap();
    let st = dlm.stats();
    assert!(st.grouped_reads > before.grouped_reads, "the stream's read-ahead shares READs: {st:?}");
    if mode == FaultMode::Sigbus {
        // Moved in, then write-protected: the first store to each faults and opens it.
        assert!(st.wp_faults > before.wp_faults, "stores to read-ahead units fault once: {st:?}");
    }
    dlm.evict_all();
    let after = dlm.stats();
    if mode == FaultMode::HandlerThread {
        // Hashed, moved in writable: eviction finds the stores by the hash.
        assert!(after.written_by_hash > before.written_by_hash, "stores found by their hash: {after:?}");
    }
    let written = after.writebacks - before.writebacks;
    let pages_per_unit = base_page * set as usize / 4096;
    // A unit holds a stored page when its pages span a multiple of 3: all units from 3 pages
    // on, every third of one page.
    let stored_units = if pages_per_unit >= 3 { AREA / (pages_per_unit * 4096) } else { AREA / 4096 / 3 + 1 };
    assert!(written as usize >= stored_units, "every unit stored to is written home: {written} of {stored_units}");
    for w in (0..AREA / 8).step_by(WORDS_PER_PAGE) {
        let version = if (w / WORDS_PER_PAGE).is_multiple_of(3) { 2 } else { 1 };
        assert_eq!(read(base, w), value(w, version), "word {w}, second pass");
    }
    dlm.audit().unwrap();
}

/// MADV_WILLNEED of a range asks for its units as read-ahead, in shared READs; the program
/// then reads them without a fault of its own for most.
fn prefetch() {
    let dlm = dlm(FaultMode::Sigbus, 16 << 10, 4);
    let base = populated(&dlm);
    // Within the quarter of the local limit that prefetching asks for at most.
    let len = AREA / 16;
    let before = dlm.stats();
    dlm.prefetch(base as usize, len).unwrap();
    let st = dlm.stats();
    assert!(st.grouped_reads > before.grouped_reads, "prefetched units share READs: {st:?}");
    assert_eq!(st.readahead_units - before.readahead_units, (len / (64 << 10)) as u64, "{st:?}");
    for w in (0..len / 8).step_by(WORDS_PER_PAGE) {
        assert_eq!(read(base, w), value(w, 1), "word {w}");
    }
    dlm.audit().unwrap();
}

fn run(name: &str) {
    use pagewise_kernel::uffd::{api_info, feature};
    if !api_info().is_ok_and(|i| i.features & feature::MOVE != 0) {
        pagewise_kernel::testing::skip("userfaultfd lacks UFFDIO_MOVE (Linux 6.8): no kept frames");
        return;
    }
    run_scenario(name, &[]);
}

#[test]
fn grouped_read_ahead_of_single_page_units_under_sigbus() {
    run("stream_sigbus_4k");
}

#[test]
fn grouped_read_ahead_of_32k_units_under_sigbus() {
    run("stream_sigbus_32k");
}

#[test]
fn grouped_read_ahead_of_128k_units_under_sigbus() {
    run("stream_sigbus_128k");
}

#[test]
fn grouped_read_ahead_of_16k_units_under_the_handler_thread() {
    run("stream_thread_16k");
}

#[test]
fn grouped_read_ahead_of_128k_units_under_the_handler_thread() {
    run("stream_thread_128k");
}

#[test]
fn prefetched_units_share_reads() {
    run("prefetch_sigbus_64k");
}
