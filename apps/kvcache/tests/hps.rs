//! HPS inside the cache: compaction under concurrent reads and writes (in process, forcing
//! many moves), and a drifting hot set against the real server (the hot arena reuses space).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pagewise_hugepage::HpsConfig;
use pagewise_kvcache::cache::{Backing, Cache, CacheConfig, StoreResult};
use pagewise_kvcache::hpsrun;
use pagewise_kvcache::load::{self, Choice};
use pagewise_kvcache::proto::Store;
use rand::{Rng, SeedableRng};

fn value(key: &str, version: u64) -> Vec<u8> {
    let mut v = format!("{key}:{version}:").into_bytes();
    v.extend(load::value_of(format!("{key}/{version}").as_bytes(), 300 + (version % 200) as usize));
    v
}

fn parse_value(out: &[u8], key: &str) -> Vec<u8> {
    let text = out;
    let head_end = text.windows(2).position(|w| w == b"\r\n").expect("VALUE line");
    let head = std::str::from_utf8(&text[..head_end]).unwrap();
    let parts: Vec<&str> = head.split(' ').collect();
    assert_eq!(parts[..2], ["VALUE", key]);
    let n: usize = parts[3].parse().unwrap();
    let data = &text[head_end + 2..head_end + 2 + n];
    assert_eq!(&text[head_end + 2 + n..], b"\r\n");
    data.to_vec()
}

#[test]
fn compaction_under_concurrent_reads_and_writes_never_shows_a_torn_or_freed_item() {
    let hps = match hpsrun::start_hps(HpsConfig { publish: false, ..Default::default() }) {
        Ok(h) => h,
        Err(e) => {
            pagewise_kernel::testing::skip(format!("HPS unavailable: {e}"));
            return;
        }
    };
    // A hot window of 100 ms: items move onto the hot arena and back again all the time.
    let cfg = CacheConfig { limit: 64 << 20, backing: Backing::Hps, hot_window_ds: 1, prealloc: false };
    let cache = Arc::new(Mutex::new(Cache::new(cfg, Some(hps.clone())).unwrap()));
    let (base, _) = cache.lock().unwrap().cold_area();
    const KEYS: u64 = 20_000;
    {
        let mut c = cache.lock().unwrap();
        for k in 0..KEYS {
            let key = format!("key{k}");
            assert_eq!(c.store(Store::Set, key.as_bytes(), 0, 0, &value(&key, 0), 0), StoreResult::Stored);
        }
    }
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        // Writers own disjoint keys and know their latest version; readers check that any
        // value is whole and belongs to its key.
        for t in 0..2u64 {
            let cache = &cache;
            let stop = &stop;
            s.spawn(move || {
                let mut rng = rand::rngs::SmallRng::seed_from_u64(t);
                let mut version = vec![0u64; KEYS as usize];
                let mut out = Vec::new();
                let mut ops = 0u64;
                while !stop.load(Ordering::Relaxed) || ops < 50_000 {
                    ops += 1;
                    let k = rng.random_range(0..KEYS / 2) * 2 + t;
                    let key = format!("key{k}");
                    if rng.random_range(0..4) == 0 {
                        version[k as usize] = ops;
                        let r = cache.lock().unwrap().store(Store::Set, key.as_bytes(), 0, 0, &value(&key, ops), 0);
                        assert_eq!(r, StoreResult::Stored);
                    } else {
                        out.clear();
                        assert!(cache.lock().unwrap().get(key.as_bytes(), false, None, &mut out), "{key} lost");
                        assert!(parse_value(&out, &key) == value(&key, version[k as usize]), "{key}: wrong value");
                    }
                }
            });
        }
        for t in 0..2u64 {
            let cache = &cache;
            let stop = &stop;
            s.spawn(move || {
                let mut rng = rand::rngs::SmallRng::seed_from_u64(10 + t);
                let mut out = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    // Reads concentrated on a tenth of the keys make a hot set.
                    let k = rng.random_range(0..KEYS / 10) * 10;
                    let key = format!("key{k}");
                    out.clear();
                    assert!(cache.lock().unwrap().get(key.as_bytes(), false, None, &mut out));
                    let v = parse_value(&out, &key);
                    let text = String::from_utf8_lossy(&v);
                    let ver: u64 = text.split(':').nth(1).unwrap().parse().unwrap();
                    assert!(v == value(&key, ver), "{key}: torn value");
                }
            });
        }
        // The compactor: every page of the cold area, again and again, then demotion.
        let t0 = Instant::now();
        let mut rounds = 0;
        while t0.elapsed() < Duration::from_secs(4) {
            // Pages beyond the carved part of the area are ignored by compact_page.
            for page in (base..base + (64 << 20)).step_by(4096) {
                cache.lock().unwrap().compact_page(page);
            }
            std::thread::sleep(Duration::from_millis(150));
            cache.lock().unwrap().demote_cooled();
            cache.lock().unwrap().check().unwrap();
            rounds += 1;
        }
        stop.store(true, Ordering::Relaxed);
        assert!(rounds >= 2);
    });
    let c = cache.lock().unwrap();
    c.check().unwrap();
    assert!(c.counters.compacted_items > 1000, "compacted {}", c.counters.compacted_items);
    assert!(c.counters.demoted_items > 100, "demoted {}", c.counters.demoted_items);
    assert_eq!(c.curr_items(), KEYS as usize);
}

#[test]
fn drifting_hot_set_leaves_the_hot_arena_no_larger_than_1_2x_the_hot_set() {
    let srv = match common::Server::try_start(&[
        "-m",
        "256",
        "-t",
        "2",
        "--memory-mode",
        "hps",
        "--hot-window-ms",
        "1000",
        "--converge-ticks",
        "10",
        "--hps-threshold",
        "3",
    ]) {
        Ok(s) => s,
        Err(e) => {
            pagewise_kernel::testing::skip(format!("kvcache with HPS did not start: {e}"));
            return;
        }
    };
    const RECORDS: u64 = 200_000;
    // One hot item every 64 records: ~1 in 10 pages active, sparse enough to compact.
    const STRIDE: u64 = 64;
    let r = load::load(&srv.addr, 0, RECORDS, 512, 2, 64).unwrap();
    assert_eq!(r.bad, 0);
    let mut restarts_before = srv.stat_u64("tracking_restarts");
    for phase in 0..3u64 {
        let addr = srv.addr.clone();
        let done = Arc::new(AtomicBool::new(false));
        let d2 = done.clone();
        let reader = std::thread::spawn(move || {
            let mut total = load::LoadResult::default();
            while !d2.load(Ordering::Relaxed) {
                let r = load::run(
                    &addr,
                    RECORDS,
                    Choice::Strided { stride: STRIDE, phase },
                    512,
                    1,
                    16,
                    u64::MAX,
                    Duration::from_millis(500),
                    true,
                    phase,
                )
                .unwrap();
                total.ops += r.ops;
                total.bad += r.bad;
                total.misses += r.misses;
            }
            total
        });
        // Settled: tracking restarted for this phase (the first starts on) and stopped again.
        let t0 = Instant::now();
        loop {
            std::thread::sleep(Duration::from_millis(250));
            let restarted = phase == 0 || srv.stat_u64("tracking_restarts") > restarts_before;
            if restarted && srv.stat_u64("tracking") == 0 && srv.stat_u64("hot_items") > 0 {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "phase {phase} did not settle");
        }
        restarts_before = srv.stat_u64("tracking_restarts");
        done.store(true, Ordering::Relaxed);
        let total = reader.join().unwrap();
        assert_eq!(total.bad, 0, "a wrong value was read");
        assert_eq!(total.misses, 0);
    }
    // Hot set: the records of one phase, in the chunk size of their slab class.
    let hot_set = srv.stat_u64("hot_set_bytes");
    let arena = srv.stat_u64("hot_arena_bytes");
    let phase_bytes = RECORDS / STRIDE * 600;
    eprintln!("hot set {hot_set} B (one phase {phase_bytes} B), hot arena {arena} B, compacted {}, demoted {}, promoted regions {}",
        srv.stat("compacted_items"), srv.stat("demoted_items"), srv.stat("promoted_regions"));
    assert!(srv.stat_u64("demoted_items") > 0, "no item left the hot arena");
    assert!(hot_set <= phase_bytes + phase_bytes / 10, "items of old phases are still hot: {hot_set} B");
    assert!((arena as f64) <= 1.2 * phase_bytes as f64, "hot arena {arena} B for a hot set of {phase_bytes} B");
}
