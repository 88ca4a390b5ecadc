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
//!   tracking costs the application): HPS's [`Convergence`] rule, one step per decision step —
//!   after `converge_ticks` steps that changed nothing, tracking stops and the share of hits
//!   served from hugepages (hot arena or promoted regions) is remembered.
//! - **Drift** (beyond the paper): with tracking off, the same rule judges that share once a
//!   second; when it falls below half of what it was at convergence, under load, the hot set
//!   has moved and tracking restarts.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use pagewise_hugepage::{Action, ActivePage, ConvergeRule, Convergence, Hps, HpsConfig, Notify, TrackState};

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
    /// A tracking session stops after this many steps whatever it decided.
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
        // The convergence rule of HPS's policy, fed with this cache's hit counts: a step per
        // tick, drift judged over 1 s windows.
        let window = (Duration::from_secs(1).as_millis() / cfg.tick.as_millis().max(1)).max(1) as u32;
        let mut conv = Convergence::new(ConvergeRule {
            quiet_steps: cfg.converge_ticks,
            max_session_steps: cfg.idle_session_ticks,
            probe_every: 0,
            window_steps: window,
            min_samples: cfg.min_hits,
            ..ConvergeRule::default()
        });
        let snap = |c: &Cache| (c.counters.hot_hits + c.counters.promoted_hits, c.counters.get_hits);
        let mut last = snap(&cache.lock().expect("cache lock"));
        while !self.stop.load(Ordering::Acquire) {
            std::thread::sleep(cfg.tick);
            let mut changed = false;
            // The application may have switched tracking on or off itself.
            if self.hps.tracking() != (conv.state() == TrackState::Tracking) {
                if self.hps.tracking() {
                    conv.force_restart();
                } else {
                    continue;
                }
            }
            if conv.state() == TrackState::Tracking {
                changed = match self.hps.process() {
                    Ok(o) => o.promoted + o.compacted_pages + o.observe_fully > 0,
                    Err(e) => {
                        eprintln!("kvcache: HPS decision step: {e}");
                        false
                    }
                };
                // Items that cooled since the last step leave the hot arena even when HPS has
                // nothing new to compact (the last compaction of a drift may come before the
                // previous hot set has cooled).
                let mut c = cache.lock().expect("cache lock");
                c.refresh_promoted();
                c.demote_cooled();
            }
            let now = snap(&cache.lock().expect("cache lock"));
            let hits = (now.0.saturating_sub(last.0), now.1.saturating_sub(last.1));
            last = now;
            match conv.step(changed, hits) {
                Action::Stop => self.hps.set_tracking(false),
                Action::Restart => {
                    self.restarts.fetch_add(1, Ordering::Relaxed);
                    self.hps.set_tracking(true);
                }
                Action::Probe | Action::Continue => {}
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
