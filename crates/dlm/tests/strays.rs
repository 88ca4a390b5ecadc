//! A page in the shadow that no unit owns — what a slip of the runtime's bookkeeping leaves —
//! is found when a unit's pages are to be moved to its place there (UFFDIO_MOVE refuses with
//! EEXIST): it is freed, counted, and the move made, and no data is lost. Both moves to the
//! shadow are covered: a unit armed by the CLOCK hand (16 KiB units), and a written unit
//! evicted with its frames kept (128 KiB units). The note comes with the runtime's journal of
//! those pages, for the report it asks for. A unit's own pages found there instead of in the
//! view — what the kernel leaves when it refuses a move it has made — are taken as moved. Real
//! server, real faults; strays and displaced units are made through hooks for these tests.

mod common;

use common::{in_child, run_child, with_server_stderr, ServerProc};
use pagewise_dlm::{Config, Dlm, FaultMode};

const LOCAL_UNITS: usize = 8;
const UNITS: usize = 48;

fn word(unit: usize, pass: u64, i: usize) -> u64 {
    (unit as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ pass.wrapping_mul(0xC2B2_AE3D_27D4_EB4F) ^ i as u64
}

/// Units of `unit` bytes (base pages of 16 KiB, or the unit when smaller), `LOCAL_UNITS` of
/// them local, the handler thread, no read-ahead.
fn config(unit: usize) -> Config {
    Config {
        servers: vec![std::env::var("DLM_TEST_SERVER").unwrap()],
        local_mem: LOCAL_UNITS * unit,
        base_page: unit.min(16 << 10),
        max_set: (unit / (16 << 10)).max(1) as u32,
        set_count: (unit / (16 << 10)).max(1) as u32,
        fault_mode: FaultMode::HandlerThread,
        readahead: 0,
        colocate: false,
        ..Config::default()
    }
}

fn scenario(unit: usize) {
    let dlm = Dlm::init(config(unit)).expect("init");
    let base = dlm.alloc(UNITS * unit).expect("alloc") as usize;
    let words = unit / 8;
    let write = |u: usize, pass: u64| {
        let p = (base + u * unit) as *mut u64;
        for i in (0..words).step_by(512) {
            // SAFETY: inside the area; the runtime serves the fault.
            unsafe { p.add(i).write_volatile(word(u, pass, i)) };
        }
    };
    let check = |u: usize, pass: u64| {
        let p = (base + u * unit) as *const u64;
        for i in (0..words).step_by(512) {
            // SAFETY: inside the area; the runtime serves the fault.
            let v = unsafe { p.add(i).read_volatile() };
            assert_eq!(v, word(u, pass, i), "unit {u} word {i} after pass {pass}");
        }
    };
    let mut planted = 0;
    for pass in 1..=4u64 {
        for u in 0..UNITS {
            write(u, pass);
            // The resident units' places get a stray each, every few units: the hand arms or
            // evicts them soon after.
            if u % 3 == 0 {
                planted += (0..UNITS).filter(|&v| dlm.plant_stray_shadow_page(base + v * unit)).count();
            }
        }
        for u in 0..UNITS {
            check(u, pass);
        }
    }
    let st = dlm.stats();
    eprintln!("planted {planted}; stats: {}", serde_json::to_string(&st).unwrap());
    assert!(planted > 0, "no stray could be planted: the scenario no longer exercises the recovery");
    assert!(st.stray_shadow_bytes > 0, "no stray was met: {st:?}");
    let planted_bytes = (planted * st.base_page) as u64;
    assert!(
        st.stray_shadow_bytes <= planted_bytes,
        "more freed as strays ({} bytes) than planted ({planted_bytes})",
        st.stray_shadow_bytes
    );
    // Strays not met yet are still there: freeing the area takes them with the shadow.
    dlm.free(base as *mut u8).unwrap();
    dlm.audit().unwrap();
}

/// The note of a stray, and after it the journal of the pages concerned: how the unit's
/// pages got where they are moved from (copied in, at least).
fn assert_reported_with_history(stderr: Option<String>) {
    let Some(stderr) = stderr else { return };
    let note = stderr.find("no unit owns were in the shadow").unwrap_or_else(|| panic!("no note:\n{stderr}"));
    let history = &stderr[note..];
    assert!(history.contains("change(s) to those pages, oldest first:"), "no journal after the note:\n{history}");
    assert!(history.contains("\n  #") && history.contains(" copy in "), "the journal is empty:\n{history}");
}

#[test]
fn a_stray_page_at_an_armed_units_place_is_freed_and_the_data_kept() {
    let name = "a_stray_page_at_an_armed_units_place_is_freed_and_the_data_kept";
    assert_reported_with_history(with_server_stderr(name, || scenario(16 << 10)));
}

#[test]
fn a_stray_page_at_an_evicted_units_place_is_freed_and_the_data_kept() {
    let name = "a_stray_page_at_an_evicted_units_place_is_freed_and_the_data_kept";
    assert_reported_with_history(with_server_stderr(name, || scenario(128 << 10)));
}

/// A unit's pages found in the shadow while its entry has them in the program's view — where
/// the kernel leaves them when it refuses a move it has made (docs/dlm.md) — are taken as
/// moved when the unit is moved there: nothing is freed as strays, the program runs on and
/// reads back every byte it wrote, and the move is counted.
#[test]
fn pages_found_in_the_shadow_instead_of_the_view_are_taken_as_moved() {
    let name = "pages_found_in_the_shadow_instead_of_the_view_are_taken_as_moved";
    if in_child() {
        let unit = 16 << 10;
        let dlm = Dlm::init(config(unit)).expect("init");
        let base = dlm.alloc(UNITS * unit).expect("alloc") as usize;
        let at = |u: usize| (base + u * unit) as *mut u64;
        // SAFETY: inside the area; the runtime serves the fault.
        let write = |u: usize| unsafe { at(u).write_volatile(u as u64 + 1) };
        (0..LOCAL_UNITS / 2).for_each(write);
        let displaced = (0..LOCAL_UNITS / 2).filter(|&u| dlm.displace_unit_to_shadow(base + u * unit)).count();
        assert!(displaced > 0, "no unit could be displaced");
        // The hand arms (or evicts) the displaced units on its way round: their move to the
        // shadow meets their own pages there.
        (LOCAL_UNITS / 2..UNITS).for_each(write);
        for u in 0..UNITS {
            // SAFETY: as above.
            assert_eq!(unsafe { at(u).read_volatile() }, u as u64 + 1, "unit {u}");
        }
        let st = dlm.stats();
        assert!(st.moves_refused_yet_made > 0, "{st:?}");
        assert_eq!(st.stray_shadow_bytes, 0, "{st:?}");
        dlm.audit().expect("audit");
        println!("SCENARIO-OK");
        return;
    }
    let server = ServerProc::start("64M");
    let out = run_child(name, &[("DLM_TEST_SERVER", server.addr.clone())]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("SCENARIO-OK"), "{stderr}");
    assert!(!stderr.contains("no unit owns were in the shadow"), "freed as strays:\n{stderr}");
}
