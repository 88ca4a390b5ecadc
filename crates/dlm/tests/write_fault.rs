//! A store to a unit that is not resident is served by one fault: the unit is fetched and
//! installed writable and dirty at once, never protected and then opened. What must hold: the
//! store lands, the rest of the unit keeps its home bytes, no unit is opened after its install
//! (`opened_units`), and the unit counts as dirty — eviction writes it home, so the store
//! survives. In every fault mode, against a real server.

mod common;

use common::with_server;
use pagewise_dlm::{Config, Dlm, FaultMode};

const UNIT: usize = 16 << 10;
const UNITS: usize = 24;
const WORDS: usize = UNIT / 8;

fn home_value(unit: usize, word: usize) -> u64 {
    ((unit * WORDS + word) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
}

fn stored_value(unit: usize) -> u64 {
    !(unit as u64)
}

fn scenario(mode: FaultMode) {
    let cfg = Config {
        servers: vec![std::env::var("DLM_TEST_SERVER").unwrap()],
        local_mem: 4 * UNITS * UNIT,
        base_page: 4096,
        max_set: (UNIT / 4096) as u32,
        set_count: (UNIT / 4096) as u32,
        fault_mode: mode,
        readahead: 0,
        ..Config::default()
    };
    let dlm = Dlm::init(cfg).expect("init");
    let base = dlm.alloc(UNITS * UNIT).expect("alloc") as *mut u64;
    for u in 0..UNITS {
        for w in 0..WORDS {
            // SAFETY: inside the area.
            unsafe { base.add(u * WORDS + w).write_volatile(home_value(u, w)) };
        }
    }
    dlm.evict_all();
    let before = dlm.stats();
    // A store into the middle of each unit: the unit's first access, a write fault.
    let at = WORDS / 2 + 3;
    for u in 0..UNITS {
        // SAFETY: inside the area; the runtime serves the fault.
        unsafe { base.add(u * WORDS + at).write_volatile(stored_value(u)) };
    }
    let st = dlm.stats();
    assert_eq!(st.fetched_units - before.fetched_units, UNITS as u64, "{st:?}");
    assert_eq!(st.wp_faults, before.wp_faults, "a store to a missing unit took a write-protect fault: {st:?}");
    assert_eq!(st.opened_units, before.opened_units, "a unit stored to was installed protected, then opened: {st:?}");
    // Dropping every unit must write the stored ones home: they were installed dirty.
    dlm.evict_all();
    let evicted = dlm.stats();
    assert_eq!(evicted.writebacks - st.writebacks, UNITS as u64, "{evicted:?}");
    for u in 0..UNITS {
        for w in [0, at - 1, at, at + 1, WORDS - 1] {
            // SAFETY: inside the area.
            let v = unsafe { base.add(u * WORDS + w).read_volatile() };
            let want = if w == at { stored_value(u) } else { home_value(u, w) };
            assert_eq!(v, want, "unit {u} word {w}");
        }
    }
    dlm.audit().unwrap();
}

fn run(mode: FaultMode, name: &str) {
    with_server(name, || scenario(mode));
}

#[test]
fn store_to_missing_unit_is_one_fault_and_written_home_handler_thread() {
    run(FaultMode::HandlerThread, "store_to_missing_unit_is_one_fault_and_written_home_handler_thread");
}

#[test]
fn store_to_missing_unit_is_one_fault_and_written_home_sigbus() {
    run(FaultMode::Sigbus, "store_to_missing_unit_is_one_fault_and_written_home_sigbus");
}

#[test]
fn store_to_missing_unit_is_one_fault_and_written_home_sigsegv() {
    run(FaultMode::Sigsegv, "store_to_missing_unit_is_one_fault_and_written_home_sigsegv");
}
