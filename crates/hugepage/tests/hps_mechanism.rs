//! HPS against the real kernel: tracking, promotion (smaps), compaction, notification.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pagewise_hugepage::promote::pmd_mapped_bytes;
use pagewise_hugepage::{Hps, HpsConfig, Notify};
use pagewise_kernel::mem::HUGE_PMD;
use rand::{Rng, SeedableRng};

const PAGE: usize = 4096;

fn manual(cfg: HpsConfig) -> Option<Hps> {
    match Hps::start(cfg) {
        Ok(h) => {
            h.set_tracking(false);
            Some(h)
        }
        Err(e) => {
            pagewise_kernel::testing::skip(format!("HPS needs userfaultfd MINOR_SHMEM: {e}"));
            None
        }
    }
}

fn touch(addr: usize) {
    // SAFETY: callers pass addresses inside arenas they own.
    unsafe { std::ptr::write_volatile(addr as *mut u64, std::ptr::read_volatile(addr as *const u64) + 1) };
}

#[test]
fn tracker_finds_a_planted_hot_set() {
    let Some(hps) = manual(HpsConfig { publish: false, ..Default::default() }) else { return };
    let len = 64 << 20;
    let base = hps.alloc(len).unwrap() as usize;
    let pages = len / PAGE;
    for p in 0..pages {
        touch(base + p * PAGE);
    }
    let mut rng = rand::rngs::SmallRng::seed_from_u64(4);
    let hot: HashSet<usize> = (0..pages / 20).map(|_| rng.random_range(0..pages)).collect();
    // 8 periods: the rotating 1/8 chunk has then observed every page once.
    for _ in 0..8 {
        hps.run_period().unwrap();
        for &p in &hot {
            touch(base + p * PAGE);
        }
    }
    let found: HashSet<usize> = hps.get_active().iter().map(|a| (a.addr - base) / PAGE).collect();
    let tp = found.intersection(&hot).count() as f64;
    let precision = tp / found.len().max(1) as f64;
    let recall = tp / hot.len() as f64;
    assert!(precision >= 0.9 && recall >= 0.9, "precision {precision:.3} recall {recall:.3}");
    // The seed's report shows the hot pages with their counts under the arena's maps line.
    let text = hps.page_acs();
    assert!(text.contains(&format!("{base:08x}-")), "{}", &text[..text.len().min(300)]);
    assert!(text.contains(" : 0x00000001"));
}

#[test]
fn dense_regions_are_promoted_to_pmd_mappings() {
    let Some(hps) = manual(HpsConfig { publish: false, ..Default::default() }) else { return };
    let len = 8 << 20;
    let base = hps.alloc(len).unwrap() as usize;
    for p in 0..len / PAGE {
        touch(base + p * PAGE);
    }
    // SAFETY: our arena; a marker to check the data survives tracking and collapse.
    unsafe { ((base + 12345 * 8) as *mut u64).write(0xabcdef) };
    assert_eq!(pmd_mapped_bytes(base).unwrap(), 0);
    hps.run_period().unwrap();
    for p in 0..len / PAGE {
        touch(base + p * PAGE);
    }
    let out = hps.process().unwrap();
    assert_eq!(out.promoted, 4, "{out:?}");
    assert_eq!(pmd_mapped_bytes(base).unwrap(), len as u64);
    // SAFETY: as above.
    assert_eq!(unsafe { ((base + 12345 * 8) as *const u64).read() }, 0xabcdef);
    // Promoted regions are not armed again: a further period drops nothing.
    assert_eq!(hps.run_period().unwrap(), 0);
    assert_eq!(pmd_mapped_bytes(base).unwrap(), len as u64);
}

#[test]
fn sparse_hot_pages_are_handed_to_compaction_and_moved_onto_hugepages() {
    let Some(hps) = manual(HpsConfig { publish: false, ..Default::default() }) else { return };
    let hps = Arc::new(hps);
    let len = 4 << 20;
    let base = hps.alloc(len).unwrap() as usize;
    let hot: Vec<usize> = (0..len / PAGE).step_by(8).collect();
    for &p in &hot {
        // SAFETY: our arena.
        unsafe { ((base + p * PAGE) as *mut u64).write(p as u64) };
    }
    let moved: Arc<Mutex<Vec<(usize, usize)>>> = Arc::default();
    let (h2, m2) = (hps.clone(), moved.clone());
    hps.set_functions(
        None,
        Some(Box::new(move |pages| {
            for p in pages {
                let dst = h2.huge_alloc(PAGE).unwrap() as usize;
                // SAFETY: both are whole pages we own.
                unsafe { std::ptr::copy_nonoverlapping(p.addr as *const u8, dst as *mut u8, PAGE) };
                h2.release(p.addr, PAGE).unwrap();
                m2.lock().unwrap().push((p.addr, dst));
            }
            pages.len()
        })),
    );
    let mut total = 0;
    for _ in 0..4 {
        hps.run_period().unwrap();
        // The application reaches each page where it lives now.
        let now: std::collections::HashMap<usize, usize> = moved.lock().unwrap().iter().copied().collect();
        for &p in &hot {
            let a = base + p * PAGE;
            touch(*now.get(&a).unwrap_or(&a));
        }
        total += hps.process().unwrap().compacted_pages;
    }
    assert_eq!(total as usize, hot.len());
    let moved = moved.lock().unwrap();
    let src: HashSet<usize> = moved.iter().map(|m| (m.0 - base) / PAGE).collect();
    assert_eq!(src, hot.iter().copied().collect());
    for &(from, to) in moved.iter() {
        // SAFETY: `to` is in the hugepage arena. The page held its index, plus one per touch
        // before it moved (1..=4 periods).
        let v = unsafe { (to as *const u64).read() };
        let p = ((from - base) / PAGE) as u64;
        assert!(v > p && v <= p + 4, "page {p} moved with value {v}");
    }
    let (tracked, huge) = hps.resident_bytes();
    assert_eq!(tracked, 0, "moved pages were released");
    assert_eq!(huge, HUGE_PMD as u64);
    assert_eq!(pmd_mapped_bytes(moved[0].1).unwrap(), HUGE_PMD as u64);
}

#[test]
fn a_flood_of_notifications_loses_nothing_in_wait_mode() {
    let Some(hps) = manual(HpsConfig { publish: false, notify: Notify::Wait, signal_offset: 5, ..Default::default() })
    else {
        return;
    };
    let hps = Arc::new(hps);
    let h = hps.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        // Registers this thread and blocks the signal before the flood starts.
        assert_eq!(h.wait_signal(Some(Duration::from_millis(1))).unwrap(), None);
        tx.send(()).unwrap();
        let mut got = Vec::new();
        while let Some(n) = h.wait_signal(Some(Duration::from_secs(10))).unwrap() {
            got.push(n);
            if got.len() == 3000 {
                break;
            }
            if got.len() % 500 == 0 {
                std::thread::sleep(Duration::from_millis(20)); // slow processing
            }
        }
        got
    });
    rx.recv().unwrap();
    for i in 0..3000u64 {
        assert!(hps.notify(i + 1).unwrap());
    }
    let got = waiter.join().unwrap();
    assert_eq!(got, (1..=3000u64).collect::<Vec<_>>());
    assert_eq!(hps.stats().notifications_received, 3000);
}

#[test]
fn handler_mode_counts_every_notification_and_tracking_restarts() {
    let Some(hps) =
        manual(HpsConfig { publish: false, notify: Notify::Handler, signal_offset: 6, ..Default::default() })
    else {
        return;
    };
    assert!(hps.has_service());
    for i in 0..2000u64 {
        assert!(hps.notify(i).unwrap());
    }
    for _ in 0..500 {
        if hps.stats().notifications_received == 2000 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(hps.stats().notifications_received, 2000);
    // Tracking stops and restarts: the tracking thread only runs periods while on.
    let base = hps.alloc(2 << 20).unwrap() as usize;
    touch(base);
    let p0 = hps.stats().tracker.periods;
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(hps.stats().tracker.periods, p0);
    hps.set_tracking(true);
    std::thread::sleep(Duration::from_millis(150));
    assert!(hps.stats().tracker.periods > p0);
    hps.set_tracking(false);
}

#[test]
fn the_host_budget_caps_promotions_and_the_rest_falls_back_to_observation() {
    let Some(hps) = manual(HpsConfig { publish: false, host_hugepages: Some(1), ..Default::default() }) else {
        return;
    };
    let len = 4 << 20;
    let base = hps.alloc(len).unwrap() as usize;
    for _ in 0..2 {
        for p in 0..len / PAGE {
            touch(base + p * PAGE);
        }
        hps.run_period().unwrap();
    }
    for p in 0..len / PAGE {
        touch(base + p * PAGE);
    }
    let out = hps.process().unwrap();
    // One hugepage in the whole host budget: one region promoted, the other is not.
    assert_eq!(out.promoted, 1, "{out:?}");
    assert_eq!(pmd_mapped_bytes(base).unwrap(), HUGE_PMD as u64);
    let me = std::process::id().to_string();
    let table = std::fs::read_to_string(pagewise_hugepage::fairness::default_path()).unwrap();
    let mine: Vec<&str> = table.lines().filter(|l| l.split_whitespace().next() == Some(me.as_str())).collect();
    assert_eq!(mine.len(), 1, "{table}");
    assert_eq!(mine[0].split_whitespace().nth(1), Some("1"), "one hugepage used: {table}");
    drop(hps);
    let table = std::fs::read_to_string(pagewise_hugepage::fairness::default_path()).unwrap_or_default();
    assert!(!table.lines().any(|l| l.split_whitespace().next() == Some(me.as_str())), "left the table: {table}");
}

/// An arena made where the program placed a mapping (a reservation it commits, as a JVM does
/// with its heap) at an address that is not 2 MiB aligned: its data is the program's, the
/// regions wholly inside it are promoted, and the reservation around it stays as it was, also
/// once the arena is freed.
#[test]
fn an_arena_placed_by_the_program_promotes_its_whole_regions_and_leaves_its_neighbours() {
    use pagewise_kernel::mem::{mprotect, MapOptions, Mapping, Protection};
    let Some(hps) = manual(HpsConfig { publish: false, ..Default::default() }) else { return };
    let reservation = Mapping::anonymous(
        10 << 20,
        &MapOptions { no_access: true, noreserve: true, align: Some(HUGE_PMD), ..Default::default() },
    )
    .unwrap();
    let (addr, len) = (reservation.addr() + (1 << 20), 5 << 20);
    // SAFETY: inside our own reservation.
    let p = unsafe { hps.alloc_at(addr, len) }.unwrap() as usize;
    assert_eq!(p, addr);
    for page in 0..len / PAGE {
        touch(addr + page * PAGE);
    }
    // SAFETY: the arena's view.
    unsafe { ((addr + 4096 * 300 + 8) as *mut u64).write(0x5eed) };
    hps.run_period().unwrap();
    for page in 0..len / PAGE {
        touch(addr + page * PAGE);
    }
    let out = hps.process().unwrap();
    assert_eq!(out.promoted, 2, "only the two regions wholly inside: {out:?}");
    assert_eq!(pmd_mapped_bytes(addr).unwrap(), 4 << 20);
    // SAFETY: as above.
    assert_eq!(unsafe { ((addr + 4096 * 300 + 8) as *const u64).read() }, 0x5eed);
    // The reservation on either side is still mapped (mprotect fails on an unmapped range).
    let before = (reservation.addr(), 1 << 20);
    let after = (addr + len, (10 << 20) - (1 << 20) - len);
    for (a, n) in [before, after] {
        mprotect(a, n, Protection::None).unwrap();
    }
    hps.free(p as *mut u8).unwrap();
    for (a, n) in [before, after] {
        mprotect(a, n, Protection::None).unwrap();
    }
    assert!(mprotect(addr, len, Protection::None).is_err(), "the arena's view is unmapped with it");
}
