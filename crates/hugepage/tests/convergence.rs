//! Convergence: tracking stops by itself once placement settles, says so in the file it
//! publishes for `pagewise hps report`, and restarts for new memory. Alone in its test binary:
//! the published file is per process, and another test's HPS removes it when it stops.

use std::time::Duration;

use pagewise_hugepage::{Hps, HpsConfig};

const PAGE: usize = 4096;

fn touch(addr: usize) {
    // SAFETY: callers pass addresses inside arenas they own.
    unsafe { std::ptr::write_volatile(addr as *mut u64, std::ptr::read_volatile(addr as *const u64) + 1) };
}

/// With a convergence rule the tracking thread stops by itself (here: a session that decides
/// nothing, since nothing runs the decision step) and says so in the published file, and new
/// memory starts it again.
#[test]
fn tracking_converges_by_itself_and_new_memory_restarts_it() {
    use pagewise_hugepage::{ConvergeRule, TrackState};
    let rule = ConvergeRule { quiet_steps: 3, max_session_steps: 5, probe_every: 0, ..Default::default() };
    let cfg = HpsConfig { interval_ms: 5, max_interval_ms: 10, converge: Some(rule), ..Default::default() };
    let hps = match Hps::start(cfg) {
        Ok(h) => h,
        Err(e) => return pagewise_kernel::testing::skip(format!("HPS needs userfaultfd MINOR_SHMEM: {e}")),
    };
    let wait_for = |what: &str, f: &dyn Fn() -> bool| {
        let t = std::time::Instant::now();
        while !f() {
            assert!(t.elapsed() < Duration::from_secs(30), "{what} within 30 s: {:?}", hps.stats());
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let a = hps.alloc(4 << 20).unwrap() as usize;
    for p in 0..(4 << 20) / PAGE {
        touch(a + p * PAGE);
    }
    wait_for("converged", &|| hps.track_state() == TrackState::Converged);
    let st = hps.stats();
    assert!(st.converged && st.converge_stops == 1 && st.converge_restarts == 0, "{st:?}");
    let periods = st.tracker.periods;
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(hps.stats().tracker.periods, periods, "tracking went on after converging");
    let path = pagewise_track::report::published_path(pagewise_kernel::signal::getpid());
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.lines().any(|l| l == "# tracking converged"), "{}", &text[..text.len().min(200)]);
    let _b = hps.alloc(2 << 20).unwrap();
    wait_for("restarted", &|| hps.stats().converge_restarts == 1);
    wait_for("converged again", &|| hps.stats().converge_stops == 2);
    assert!(hps.stats().tracker.periods > periods);
}
