//! `pagewise hps report --pid PID` on this very test process.

use pagewise_hugepage::{Hps, HpsConfig};

#[test]
fn report_prints_the_page_acs_layout_of_a_live_process() {
    let Ok(hps) = Hps::start(HpsConfig::default()) else {
        pagewise_kernel::testing::skip("HPS needs userfaultfd MINOR_SHMEM");
        return;
    };
    hps.set_tracking(false);
    let base = hps.alloc(2 << 20).unwrap() as usize;
    for p in 0..512 {
        // SAFETY: our own arena.
        unsafe { ((base + p * 4096) as *mut u64).write(1) };
    }
    hps.run_period().unwrap();
    for p in 0..4 {
        // SAFETY: as above; pages 0..4 are touched after arming.
        unsafe { std::ptr::write_volatile((base + p * 4096) as *mut u64, 2) };
    }
    hps.run_period().unwrap();
    hps.publish().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pagewise"))
        .args(["hps", "report", "--pid", &std::process::id().to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    let header = lines.next().unwrap();
    assert!(header.starts_with(&format!("{base:x}-")), "{header}");
    assert!(header.contains("memfd:pagewise-hps"), "{header}");
    // The touched pages that were armed in the first period carry count 1.
    let runs: Vec<&str> = lines.collect();
    assert!(runs.iter().all(|l| l.contains(" : 0x")), "{runs:?}");
    assert!(runs.iter().any(|l| l.ends_with(": 0x00000001")), "{runs:?}");
    drop(hps);
    let gone = std::process::Command::new(env!("CARGO_BIN_EXE_pagewise"))
        .args(["hps", "report", "--pid", &std::process::id().to_string()])
        .output()
        .unwrap();
    assert!(!gone.status.success(), "the published file is removed when HPS stops");
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_pagewise"))
        .args(["hps", "report", "--pid", "0"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
}
