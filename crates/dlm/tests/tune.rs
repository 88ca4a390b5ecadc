//! The tuner in the real runtime: dlm_start/dlm_end shrink a loop's unit to the largest size
//! whose touched units fit, each loop id keeps its own size, windows tune a program without
//! start/end (trying neighbouring sizes), and the data survive every change. Real servers, real faults.

mod common;

use common::{in_child, run_child, ServerProc};
use pagewise_dlm::tune::Reason;
use pagewise_dlm::{Config, Dlm, FaultMode};

const B: usize = 16 << 10;

fn config(auto_tune: bool) -> Config {
    Config {
        servers: vec![std::env::var("DLM_TEST_SERVERS").unwrap()],
        // 1 MiB local: 8 units of 128 KiB, 32 of 32 KiB, 64 of 16 KiB.
        local_mem: 1 << 20,
        base_page: B,
        max_set: 8,
        set_count: 8,
        fault_mode: FaultMode::HandlerThread,
        readahead: 0,
        auto_tune,
        tune_window: std::time::Duration::from_millis(10),
        ..Config::default()
    }
}

/// One byte in each of 32 base pages 256 KiB apart: 32 units at any size ≤ 256 KiB.
fn sparse_pass(base: *mut u8, write: Option<u8>) -> u64 {
    let mut sum = 0u64;
    for k in 0..32 {
        // SAFETY: k * 256 KiB + 100 is inside the 8 MiB area.
        let p = unsafe { base.add(k * (256 << 10) + 100) };
        match write {
            // SAFETY: as above.
            Some(v) => unsafe { p.write_volatile(v.wrapping_add(k as u8)) },
            // SAFETY: as above.
            None => sum += unsafe { p.read_volatile() } as u64,
        }
    }
    sum
}

fn loops_scenario() {
    let dlm = Dlm::init(config(false)).unwrap();
    let base = dlm.alloc(8 << 20).unwrap();
    sparse_pass(base, Some(7));
    let want = sparse_pass(base, None);
    assert!(dlm.loop_end(0).is_err(), "end without start");
    dlm.loop_start(0).unwrap();
    assert!(dlm.loop_start(1).is_err(), "loops do not nest");
    assert_eq!(sparse_pass(base, None), want);
    let d = dlm.loop_end(0).unwrap();
    // 32 touched units of 128 KiB against 8 local ones; 32 KiB is the largest size that fits.
    assert_eq!(
        (d.reason, d.working_set, d.local_units, d.old_size, d.new_size),
        (Reason::Shrink, 32, 8, 128 << 10, 32 << 10)
    );
    assert_eq!(dlm.stats().set_count, 2);
    // Loop 1 touches 4 units: it fits at 128 KiB and keeps its own size.
    dlm.set_count(8).unwrap();
    dlm.loop_start(1).unwrap();
    // SAFETY: inside the area.
    unsafe { base.add(300).write_volatile(1) };
    let d1 = dlm.loop_end(1).unwrap();
    assert_eq!((d1.reason, d1.new_size), (Reason::Fits, 128 << 10));
    // Back to loop 0: its own size (whatever its last decision made it) is in force.
    dlm.loop_start(0).unwrap();
    assert_eq!(dlm.stats().set_count as usize * B, d.new_size);
    assert_eq!(sparse_pass(base, None), want);
    let d2 = dlm.loop_end(0).unwrap();
    assert_eq!(d2.iteration, 1);
    // The data survived every change, and the log has all three decisions.
    dlm.evict_all();
    assert_eq!(sparse_pass(base, None), want);
    // SAFETY: inside the area.
    assert_eq!(unsafe { base.add(300).read_volatile() }, 1);
    let json: serde_json::Value = serde_json::from_str(&dlm.decisions_json()).unwrap();
    assert_eq!(json["decisions"].as_array().unwrap().len(), 3);
    assert!(json["table"].as_str().unwrap().contains("128KB → 32KB"));
    dlm.audit().unwrap();
    println!("TUNE-OK");
}

fn window_scenario() {
    let dlm = Dlm::init(config(true)).unwrap();
    // Tuned over windows, the unit starts in the middle of 16..128 KiB.
    assert_eq!(dlm.stats().set_count, 4);
    let base = dlm.alloc(8 << 20).unwrap();
    sparse_pass(base, Some(3));
    let want = sparse_pass(base, None);
    let start = std::time::Instant::now();
    while dlm.decisions().len() < 2 && start.elapsed() < std::time::Duration::from_secs(20) {
        assert_eq!(sparse_pass(base, None), want);
    }
    let ds = dlm.decisions();
    // The first window is the program's start, measured at home. 32 touched units do not fit
    // in the 16 local units of 64 KiB (the passes thrash, so windows close): the first look
    // is down, by a jump, to 16 KiB. There they fit, no more faults come, and the trial stays
    // in force until the program pages again.
    assert!(ds.len() >= 2, "two windows closed within 20 s of thrashing: {ds:?}");
    assert_eq!((ds[0].loop_id, ds[0].reason, ds[0].new_size), (u64::MAX, Reason::Settled, 64 << 10), "{ds:?}");
    assert_eq!((ds[1].reason, ds[1].old_size, ds[1].new_size), (Reason::Explore, 64 << 10, 16 << 10), "{ds:?}");
    assert!(ds.iter().all(|d| d.loop_time >= 1.0), "a window's wall time per CPU second of the program: {ds:?}");
    for _ in 0..50 {
        assert_eq!(sparse_pass(base, None), want);
    }
    assert!(dlm.decisions().iter().all(|d| (16 << 10..=128 << 10).contains(&d.new_size)), "{ds:?}");
    assert_eq!(sparse_pass(base, None), want);
    dlm.audit().unwrap();
    println!("TUNE-OK");
}

/// A unit requested around a smaller one still in flight (the size grew meanwhile) keeps the
/// smaller one's data: here the larger unit is otherwise never written, so it is installed as
/// zeros at once, which must not cover the page whose reply is on its way.
fn grown_unit_scenario() {
    let dlm = Dlm::init(config(false)).unwrap();
    dlm.set_count(1).unwrap();
    let base = dlm.alloc(1 << 20).unwrap() as usize;
    let word = |page: usize| (base + page * B + 8) as *mut u64;
    // SAFETY: page 0 of the 1 MiB area.
    unsafe { word(0).write_volatile(0x5eed) };
    dlm.evict_all();
    // Page 0's READ leaves as read-ahead and waits, unanswered, while the unit grows to 8 pages.
    dlm.prefetch(base, B).unwrap();
    dlm.set_count(8).unwrap();
    // SAFETY: page 5 of the area.
    assert_eq!(unsafe { word(5).read_volatile() }, 0, "a page never written");
    // SAFETY: page 0 of the area.
    assert_eq!(unsafe { word(0).read_volatile() }, 0x5eed, "the page whose READ was in flight");
    dlm.audit().unwrap();
    println!("TUNE-OK");
}

fn run(name: &str, scenario: fn()) {
    if in_child() {
        scenario();
        return;
    }
    let s = ServerProc::start("256M");
    let out = run_child(name, &[("DLM_TEST_SERVERS", s.addr.clone())]);
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && so.contains("TUNE-OK"), "{so}\n{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn loops_shrink_to_what_fits_and_keep_their_own_sizes() {
    run("loops_shrink_to_what_fits_and_keep_their_own_sizes", loops_scenario);
}

#[test]
fn windows_tune_a_program_without_start_and_end() {
    run("windows_tune_a_program_without_start_and_end", window_scenario);
}

#[test]
fn a_unit_grown_around_one_in_flight_keeps_its_data() {
    run("a_unit_grown_around_one_in_flight_keeps_its_data", grown_unit_scenario);
}
