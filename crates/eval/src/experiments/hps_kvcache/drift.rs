//! The drifting hot set on kvcache with HPS (beyond the paper): three hot sets in turn, each
//! one record in 64 (sparse: compacted, not promoted); after each has settled, the hot arena
//! against one hot set.

use std::time::{Duration, Instant};

use pagewise_kvcache::load::{self, Choice};

use super::{start, stat, Config, MEM_MB, VALUE};

pub(super) struct DriftPhase {
    pub phase: u64,
    pub hot_items: u64,
    pub hot_set: u64,
    pub arena: u64,
    pub compacted: u64,
    pub demoted: u64,
    pub promoted: u64,
    pub bad: u64,
}

pub(super) struct Drift {
    pub phases: Vec<DriftPhase>,
    pub ratio: f64,
}

/// kvcache HPS with 200k records; three hot sets in turn; after each has settled (tracking
/// restarted, placed, stopped again) read the hot arena and hot set sizes.
pub(super) fn drift_phase() -> anyhow::Result<Drift> {
    const RECORDS: u64 = 200_000;
    const STRIDE: u64 = 64;
    let r = start(Config::Hps, MEM_MB, &["--hot-window-ms", "1000", "--converge-ticks", "10", "--hps-threshold", "3"])?;
    let l = load::load(&r.addr, 0, RECORDS, VALUE, 2, 64)?;
    anyhow::ensure!(l.bad == 0, "drift load: {} stores failed", l.bad);
    let mut phases = Vec::new();
    let mut restarts = stat(&r.addr, "tracking_restarts")?;
    for phase in 0..3u64 {
        let t = Instant::now();
        let mut bad = 0;
        loop {
            let res = load::run(
                &r.addr,
                RECORDS,
                Choice::Strided { stride: STRIDE, phase },
                VALUE,
                1,
                16,
                u64::MAX,
                Duration::from_millis(500),
                true,
                phase,
            )?;
            bad += res.bad + res.misses;
            let restarted = phase == 0 || stat(&r.addr, "tracking_restarts")? > restarts;
            if restarted && stat(&r.addr, "tracking")? == 0 && stat(&r.addr, "hot_items")? > 0 {
                break;
            }
            anyhow::ensure!(t.elapsed() < Duration::from_secs(90), "drift phase {phase} did not settle in 90 s");
        }
        restarts = stat(&r.addr, "tracking_restarts")?;
        phases.push(DriftPhase {
            phase,
            hot_items: stat(&r.addr, "hot_items")?,
            hot_set: stat(&r.addr, "hot_set_bytes")?,
            arena: stat(&r.addr, "hot_arena_bytes")?,
            compacted: stat(&r.addr, "compacted_items")?,
            demoted: stat(&r.addr, "demoted_items")?,
            promoted: stat(&r.addr, "promoted_regions")?,
            bad,
        });
    }
    let last = phases.last().expect("three phases");
    // One phase's hot set in bytes of slab chunks: every record of the phase, at its chunk size
    // (the server's hot_set_bytes counts only what it moved; promoted items would be missing).
    let chunk = stat(&r.addr, "hot_set_bytes")? / stat(&r.addr, "hot_items")?.max(1);
    let phase_bytes = RECORDS / STRIDE * chunk;
    let ratio = last.arena as f64 / phase_bytes.max(1) as f64;
    Ok(Drift { phases, ratio })
}
