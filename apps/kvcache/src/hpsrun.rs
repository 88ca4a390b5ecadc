//! HPS inside the cache: the compaction function HPS calls, and the control thread that runs
//! the decision step, stops tracking once placement converged and restarts it when the hot
//! set drifts.
//!
//! - **Promotion** is HPS's own: a 2 MiB region of the tracked slab area where at least a
//!   quarter of the observed pages are active is collapsed (MADV_COLLAPSE).
//! - **Compaction**: for a sparse region HPS hands over its active 4 KiB pages; the items on
//!   them read within the hot window move onto slab pages of the hugepage arena
//!   ([`Cache::compact_page`]), under the cache lock (see [`crate::cache`] on why that is safe).
//!   Before that, hot-arena items not read within the window move back to cold slab pages and
//!   hot pages left empty go back to the arena, which reuses them: a drifting hot set does not
//!   grow the hot arena.
//! - **Convergence** (the paper stops tracking once it has promoted/compacted enough, because
//!   tracking costs the application): after `converge_ticks` decision steps that changed
//!   nothing, tracking stops and the share of hits served from hugepages (hot arena or promoted
//!   regions) is remembered.
//! - **Drift** (beyond the paper): with tracking off, the control thread watches that share
//!   once a second; when it falls below half of what it was at convergence, under load, the hot
//!   set has moved and tracking restarts.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pagewise_hugepage::{ActivePage, Hps, HpsConfig, Notify};

use crate::cache::Cache;

/// Knobs of the control loop.
#[derive(Clone, Debug)]
pub struct ControlConfig {
    /// Decision step period.
    pub tick: Duration,
    /// Quiet decision steps before tracking stops.
    pub converge_ticks: u32,
    /// Hits per second below which drift is not judged.
    pub min_hits: u64,
    /// A tracking session that decided nothing stops after this many steps.
    pub idle_session_ticks: u32,
}

impl Default for ControlConfig {
    fn default() -> Self {
        ControlConfig { tick: Duration::from_millis(100), converge_ticks: 30, min_hits: 1000, idle_session_ticks: 200 }
    }
}

/// HPS of the server and its control thread.
pub struct HpsControl {
    pub hps: Arc<Hps>,
    pub restarts: AtomicU64,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// Start HPS for a cache (tracking on, no signal: the control thread runs the decision step).
pub fn start_hps(mut cfg: HpsConfig) -> anyhow::Result<Arc<Hps>> {
    cfg.notify = Notify::None;
    Ok(Arc::new(Hps::start(cfg)?))
}

impl HpsControl {
    /// Install the compaction function and start the control thread.
    pub fn attach(hps: Arc<Hps>, cache: &Arc<Mutex<Cache>>, cfg: ControlConfig) -> anyhow::Result<Arc<Self>> {
        let weak: Weak<Mutex<Cache>> = Arc::downgrade(cache);
        hps.set_functions(
            None,
            Some(Box::new(move |pages: &[ActivePage]| {
                let Some(cache) = weak.upgrade() else { return 0 };
                cache.lock().expect("cache lock").demote_cooled();
                // One lock hold per page keeps other threads' waits short.
                pages.iter().filter(|p| cache.lock().expect("cache lock").compact_page(p.addr) > 0).count()
            })),
        );
        let ctl = Arc::new(HpsControl {
            hps,
            restarts: AtomicU64::new(0),
            stop: Arc::new(AtomicBool::new(false)),
            thread: Mutex::new(None),
        });
        let (c2, cache2) = (ctl.clone(), cache.clone());
        let handle = std::thread::Builder::new().name("kv-hps".into()).spawn(move || c2.run(&cache2, &cfg))?;
        *ctl.thread.lock().expect("thread lock") = Some(handle);
        Ok(ctl)
    }

    fn run(&self, cache: &Mutex<Cache>, cfg: &ControlConfig) {
        let mut quiet = 0u32;
        // Steps of this tracking session, and whether it promoted or compacted anything yet.
        let (mut session, mut decided) = (0u32, false);
        let mut baseline: Option<f64> = None;
        let mut window_start = Instant::now();
        let snap = |c: &Cache| (c.counters.get_hits, c.counters.hot_hits + c.counters.promoted_hits);
        let mut last = snap(&cache.lock().expect("cache lock"));
        while !self.stop.load(Ordering::Acquire) {
            std::thread::sleep(cfg.tick);
            if self.hps.tracking() {
                let changed = match self.hps.process() {
                    Ok(o) => o.promoted + o.compacted_pages + o.observe_fully > 0,
                    Err(e) => {
                        eprintln!("kvcache: HPS decision step: {e}");
                        false
                    }
                };
                {
                    // Items that cooled since the last step leave the hot arena even when
                    // HPS has nothing new to compact (the last compaction of a drift may come
                    // before the previous hot set has cooled).
                    let mut c = cache.lock().expect("cache lock");
                    c.refresh_promoted();
                    c.demote_cooled();
                }
                quiet = if changed { 0 } else { quiet + 1 };
                session += 1;
                decided |= changed;
                // Converged: quiet for a while after deciding something (tracking needs several
                // periods before a page's count reaches the threshold, so quiet alone at the
                // start of a session means nothing), or a long session that found nothing.
                if decided && quiet >= cfg.converge_ticks || session >= cfg.idle_session_ticks {
                    self.hps.set_tracking(false);
                    let now = snap(&cache.lock().expect("cache lock"));
                    let hits = now.0 - last.0;
                    let share = (now.1 - last.1) as f64 / hits.max(1) as f64;
                    // A share of almost nothing is no placement to keep: judge drift as if none.
                    baseline = (hits >= cfg.min_hits && share >= 0.05).then_some(share);
                    last = now;
                    window_start = Instant::now();
                    (quiet, session, decided) = (0, 0, false);
                }
            } else if window_start.elapsed() >= Duration::from_secs(1) {
                let now = snap(&cache.lock().expect("cache lock"));
                let hits = now.0 - last.0;
                let share = if hits > 0 { (now.1 - last.1) as f64 / hits as f64 } else { 0.0 };
                if hits >= cfg.min_hits {
                    match baseline {
                        Some(b) if share >= b * 0.5 => {}
                        // Under load with no baseline, or the share halved: the hot set moved.
                        _ => {
                            self.restarts.fetch_add(1, Ordering::Relaxed);
                            self.hps.set_tracking(true);
                        }
                    }
                }
                last = now;
                window_start = Instant::now();
            }
        }
    }

    /// Stop the control thread.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.lock().expect("thread lock").take() {
            let _ = t.join();
        }
    }
}
