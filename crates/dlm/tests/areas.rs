//! Areas that share a start address: the program unmaps the head of one area and keeps its
//! tail, and a new area is made where the head was (`alloc_at`, as the preload shim does for a
//! MAP_FIXED mapping). Freeing the new area frees it, not the older one, whose tail stays the
//! program's memory with its data. Real server, real faults.

mod common;

use common::with_server;
use pagewise_dlm::{Config, Dlm, FaultMode};

const PAGE: usize = 4 << 10;

fn pattern(page: usize) -> u64 {
    (page as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

fn shared_start_scenario() {
    let dlm = Dlm::init(Config {
        servers: vec![std::env::var("DLM_TEST_SERVER").unwrap()],
        local_mem: 1 << 20,
        base_page: PAGE,
        fault_mode: FaultMode::HandlerThread,
        ..Config::default()
    })
    .expect("init");
    let old = dlm.alloc(34 * PAGE).expect("alloc") as usize;
    let word = |page: usize| (old + page * PAGE) as *mut u64;
    for page in 0..34 {
        // SAFETY: inside the 34-page area.
        unsafe { word(page).write_volatile(pattern(page)) };
    }
    // The head leaves DLM but stays mapped (plain memory), for the new area to replace it.
    dlm.forget(old, 32 * PAGE).expect("forget the head");
    // SAFETY: [old, old + 16 pages) is the forgotten head: this process's plain memory that
    // nothing else uses.
    let made = unsafe { dlm.alloc_at(old, 16 * PAGE) }.expect("alloc_at");
    assert_eq!(made, 16 * PAGE);
    let new = old;
    // SAFETY: page 0 of the new area.
    unsafe { (new as *mut u64).write_volatile(7) };
    dlm.free(new as *mut u8).expect("free the new area");
    for page in 32..34 {
        // SAFETY: the old area's tail, still the program's.
        assert_eq!(unsafe { word(page).read_volatile() }, pattern(page), "page {page} of the older area");
    }
    dlm.audit().unwrap();
}

#[test]
fn freeing_an_area_made_over_anothers_head_keeps_the_others_tail() {
    with_server("freeing_an_area_made_over_anothers_head_keeps_the_others_tail", shared_start_scenario);
}
