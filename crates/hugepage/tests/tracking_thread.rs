//! The tracking thread shares its core with the application it serves: while tracking is off
//! it sleeps until woken, and switching tracking on wakes it at once. Alone in its test binary,
//! so its thread is the only `pw-hps-track` of the process.

use std::time::{Duration, Instant};

use pagewise_hugepage::{Hps, HpsConfig};

/// Voluntary context switches of this process's thread named `name` (exactly one must exist).
fn voluntary_switches(name: &str) -> u64 {
    let mut found = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").expect("read /proc/self/task") {
        let dir = task.expect("task entry").path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim_end() == name {
            found.push(dir);
        }
    }
    assert_eq!(found.len(), 1, "threads named {name}: {found:?}");
    let status = std::fs::read_to_string(found[0].join("status")).expect("read task status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("voluntary_ctxt_switches in task status")
}

#[test]
fn the_tracking_thread_sleeps_while_tracking_is_off_and_wakes_when_it_is_switched_on() {
    let cfg = HpsConfig { interval_ms: 5, max_interval_ms: 10, ..Default::default() };
    let hps = match Hps::start(cfg) {
        Ok(h) => h,
        Err(e) => return pagewise_kernel::testing::skip(format!("HPS needs userfaultfd MINOR_SHMEM: {e}")),
    };
    let arena = hps.alloc(2 << 20).unwrap();
    // SAFETY: the arena is 2 MiB of this process's memory.
    unsafe { std::ptr::write_volatile(arena, 1) };
    hps.set_tracking(false);
    // Let a period that was under way end.
    std::thread::sleep(Duration::from_millis(100));
    let before = voluntary_switches("pw-hps-track");
    let periods = hps.stats().tracker.periods;
    std::thread::sleep(Duration::from_millis(500));
    let woke = voluntary_switches("pw-hps-track") - before;
    // Polling every 5 ms would have woken it about 100 times; parked, it wakes for nothing.
    assert!(woke <= 2, "the tracking thread woke {woke} times in 500 ms with tracking off");
    assert_eq!(hps.stats().tracker.periods, periods, "periods ran with tracking off");

    hps.set_tracking(true);
    let t = Instant::now();
    while hps.stats().tracker.periods == periods {
        assert!(t.elapsed() < Duration::from_secs(30), "tracking did not resume: {:?}", hps.stats());
        std::thread::sleep(Duration::from_millis(1));
    }
}
