//! Small units received into the program's view are left writable and remembered by a hash
//! of their bytes (`Config::hash_clean`): stores to them take no fault, and eviction must
//! still find every unit the program wrote and write it home — also after the unit was armed
//! and mapped again, and when another thread could write it during the eviction. Real server,
//! real faults (SIGBUS, one program thread: where the runtime hashes); the counts are the
//! runtime's own.

mod common;

use pagewise_dlm::{Config, Dlm, FaultMode};

const UNIT: usize = 16 << 10;
const WORDS: usize = UNIT / 8;

fn home_value(unit: usize, word: usize) -> u64 {
    ((unit * WORDS + word) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
}

fn stored_value(unit: usize) -> u64 {
    !(unit as u64)
}

/// The word each written unit gets its store at, away from the words `check` reads first.
const AT: usize = WORDS / 3;

fn dlm(local_units: usize) -> Dlm {
    Dlm::init(Config {
        servers: vec![std::env::var("DLM_TEST_SERVER").unwrap()],
        local_mem: local_units * UNIT,
        base_page: 4096,
        max_set: (UNIT / 4096) as u32,
        set_count: (UNIT / 4096) as u32,
        fault_mode: FaultMode::Sigbus,
        readahead: 0,
        hash_clean: true,
        ..Config::default()
    })
    .expect("init")
}

/// An area of `units` units, every word written with its home value, nothing resident.
fn populated(dlm: &Dlm, units: usize) -> *mut u64 {
    let base = dlm.alloc(units * UNIT).expect("alloc") as *mut u64;
    for u in 0..units {
        for w in 0..WORDS {
            // SAFETY: inside the area.
            unsafe { base.add(u * WORDS + w).write_volatile(home_value(u, w)) };
        }
    }
    dlm.evict_all();
    base
}

fn read(base: *mut u64, unit: usize, word: usize) -> u64 {
    // SAFETY: inside the area; the runtime serves the fault.
    unsafe { base.add(unit * WORDS + word).read_volatile() }
}

fn store(base: *mut u64, unit: usize) {
    // SAFETY: inside the area; the runtime serves the fault.
    unsafe { base.add(unit * WORDS + AT).write_volatile(stored_value(unit)) };
}

/// Every unit holds its home bytes, but the written ones their store at `AT`.
fn check(base: *mut u64, units: usize, written: impl Fn(usize) -> bool) {
    for u in 0..units {
        for w in [0, AT - 1, AT, AT + 1, WORDS - 1] {
            let want = if w == AT && written(u) { stored_value(u) } else { home_value(u, w) };
            assert_eq!(read(base, u, w), want, "unit {u} word {w}");
        }
    }
}

/// Read every unit (hashed installs), store to every third without a fault, evict all: only
/// the stored-to units go home, and their stores survive.
fn stores_to_hashed_units_are_found() {
    const UNITS: usize = 30;
    let dlm = dlm(2 * UNITS);
    let base = populated(&dlm, UNITS);
    (0..UNITS).for_each(|u| assert_eq!(read(base, u, 0), home_value(u, 0)));
    let st = dlm.stats();
    assert_eq!(st.hashed_installs, UNITS as u64, "{st:?}");
    let written = |u: usize| u % 3 == 1;
    (0..UNITS).filter(|&u| written(u)).for_each(|u| store(base, u));
    let after = dlm.stats();
    assert_eq!((after.faults, after.wp_faults, after.opened_units), (st.faults, st.wp_faults, st.opened_units));
    dlm.evict_all();
    let ev = dlm.stats();
    assert_eq!(ev.written_by_hash - after.written_by_hash, (UNITS / 3) as u64, "{ev:?}");
    assert_eq!(ev.clean_by_hash - after.clean_by_hash, (UNITS - UNITS / 3) as u64, "{ev:?}");
    assert_eq!(ev.writebacks - after.writebacks, (UNITS / 3) as u64, "{ev:?}");
    check(base, UNITS, written);
    dlm.audit().unwrap();
}

/// A local limit of a few units: the hand arms hashed units and the program maps them back.
/// Stores to every unit in turn — resident, armed or gone — all survive.
fn stores_survive_arming() {
    const UNITS: usize = 40;
    let dlm = dlm(6);
    let base = populated(&dlm, UNITS);
    for round in 0..3 {
        for u in 0..UNITS {
            // A hot unit read between all others: it stays, armed and mapped back in turn.
            assert_eq!(read(base, 0, 1), home_value(0, 1), "round {round}");
            assert_eq!(read(base, u, 0), home_value(u, 0), "round {round}");
            if round == 2 && u % 2 == 0 {
                store(base, u);
            }
        }
    }
    store(base, 0);
    let st = dlm.stats();
    assert!(st.hashed_installs > 0 && st.reference_faults > 0 && st.clean_by_hash > 0, "{st:?}");
    dlm.evict_all();
    check(base, UNITS, |u| u % 2 == 0);
    dlm.audit().unwrap();
}

/// Units hashed while the program had one thread, evicted while it has two: eviction protects
/// them before it hashes them, and every store survives.
fn stores_survive_eviction_with_a_second_thread() {
    const UNITS: usize = 12;
    let dlm = dlm(2 * UNITS);
    let base = populated(&dlm, UNITS);
    (0..UNITS).for_each(|u| assert_eq!(read(base, u, 0), home_value(u, 0)));
    (0..UNITS).filter(|u| u % 2 == 1).for_each(|u| store(base, u));
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let other = std::thread::spawn(move || stop_rx.recv());
    dlm.evict_all();
    let st = dlm.stats();
    assert_eq!(st.written_by_hash, (UNITS / 2) as u64, "{st:?}");
    check(base, UNITS, |u| u % 2 == 1);
    stop_tx.send(()).unwrap();
    other.join().unwrap().unwrap();
    dlm.audit().unwrap();
}

// The scenarios, by the name `DLM_SCENARIO` gives them: the runtime receives into the
// program's view, and hashes, only in a program with one thread (`common::Scenarios`).
scenarios! {
    "found" => stores_to_hashed_units_are_found,
    "arming" => stores_survive_arming,
    "second-thread" => stores_survive_eviction_with_a_second_thread,
}

fn run(scenario: &str) {
    common::run_scenario(scenario, &[]);
}

#[test]
fn stores_to_hashed_units_take_no_fault_and_go_home() {
    run("found");
}

#[test]
fn stores_to_hashed_units_survive_arming() {
    run("arming");
}

#[test]
fn stores_to_hashed_units_survive_eviction_with_a_second_thread() {
    run("second-thread");
}
