//! `hps-micro`: the HPS paper's microbenchmark — throughput and memory per round of Default
//! (4 KiB pages), THP (MADV_HUGEPAGE on the whole buffer) and HPS (tracked arena, promotion
//! of dense regions, compaction of sparse hot pages).
//!
//! The access unit is a 4 KiB page: one 8-byte read-modify-write on one cache line of the page
//! (line chosen by the page index), so the cost of a page is its TLB miss plus one cache miss.
//! A *set* touches each page of the pattern's range once; a *round* is 16 sets. Every access
//! goes through a per-page location table, the same in every configuration, because HPS
//! compaction moves hot pages and the application must find them again (what memcached does
//! with its item pointers in the paper).
//!
//! Patterns (pages of a set, each once):
//! - sequential: every page in address order;
//! - random: every page in a fixed random order;
//! - skewed: the pages of the first third of the buffer in random order, plus one page (the
//!   first) of every 2 MiB region of the other two thirds — the scattered allocator metadata a
//!   real heap touches. Default touches exactly those pages; THP faults in whole 2 MiB pages;
//! - sparse-hot: one page in eight over the whole buffer, in random order. Whole-region
//!   promotion would bloat 8×; compaction moves the hot pages onto 1/8 as many hugepages.
//!
//! Memory per configuration is the buffer's own: Rss of its VMA from smaps for the anonymous
//! buffers; for HPS, the memfd's allocated blocks (which include pages whose mappings the
//! tracker dropped) plus the compaction arena.
//!
//! The three configurations live in one process and their sets are interleaved (D T H, T H D,
//! …, 16 times per round) so machine drift hits all alike. The HPS tracker runs on its own clock
//! (a period every 2 ms, thinning out once nothing new is found); it only arms pages of the
//! HPS buffer, so its faults land on HPS rounds. The HPS round includes its decision step
//! (notification, promotion, compaction): nothing HPS does is left out of its time.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use pagewise_hugepage::{Hps, HpsConfig, Notify};
use pagewise_kernel::mem::{Advice, MapOptions, Mapping, HUGE_PMD};
use pagewise_kernel::procfs::{read_smaps, Pid};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde_json::json;

use crate::{human_bytes, ratio, Context, Experiment, Plot, Report, Summary, Table};

pub struct HpsMicro;

const PAGE: usize = 4096;
const SETS_PER_ROUND: usize = 16;
const CONFIGS: [&str; 3] = ["Default", "THP", "HPS"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pattern {
    Sequential,
    Random,
    Skewed,
    SparseHot,
}

impl Pattern {
    fn name(self) -> &'static str {
        match self {
            Pattern::Sequential => "sequential",
            Pattern::Random => "random",
            Pattern::Skewed => "skewed",
            Pattern::SparseHot => "sparse-hot",
        }
    }

    /// The logical pages of one set, in access order.
    fn order(self, pages: usize, seed: u64) -> Vec<u32> {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let ppr = HUGE_PMD / PAGE;
        let mut v: Vec<u32> = match self {
            Pattern::Sequential | Pattern::Random => (0..pages as u32).collect(),
            Pattern::Skewed => {
                let third = pages / 3;
                let mut v: Vec<u32> = (0..third as u32).collect();
                let first_cold_region = third.div_ceil(ppr);
                v.extend((first_cold_region..pages / ppr).map(|r| (r * ppr) as u32));
                v
            }
            Pattern::SparseHot => (0..pages as u32).step_by(8).collect(),
        };
        if self != Pattern::Sequential {
            v.shuffle(&mut rng);
        }
        v
    }
}

/// One set over `order` through the location table; returns a checksum so nothing is elided.
#[inline(never)]
fn run_set(loc: &[usize], order: &[u32]) -> u64 {
    let mut sum = 0u64;
    for &p in order {
        let addr = loc[p as usize] + ((p as usize * 64) & (PAGE - 1));
        // SAFETY: loc holds the current address of every page of a buffer this experiment
        // owns; the offset stays inside the page and is 8-byte aligned.
        unsafe {
            let ptr = addr as *mut u64;
            let v = std::ptr::read_volatile(ptr).wrapping_add(1);
            std::ptr::write_volatile(ptr, v);
            sum = sum.wrapping_add(v);
        }
    }
    sum
}

enum Buffer {
    /// Kept alive for the run; accessed through the location table.
    Anon(#[allow(dead_code)] Mapping),
    Hps(Arc<Hps>),
}

struct Config {
    buffer: Buffer,
    base: usize,
    loc: Arc<Mutex<Vec<usize>>>,
    throughput: Vec<f64>,
    rss: Vec<f64>,
}

fn vma_rss(smaps: &procfs_core::process::MemoryMaps, addr: usize) -> u64 {
    smaps
        .0
        .iter()
        .filter(|m| m.address.0 as usize <= addr && addr < m.address.1 as usize)
        .map(|m| m.extension.map.get("Rss").copied().unwrap_or(0))
        .sum()
}

fn hps_config() -> HpsConfig {
    // A 2 ms period: quick-mode rounds last milliseconds, and tracking thins out by itself
    // once nothing new is found.
    HpsConfig { notify: Notify::Wait, publish: false, signal_offset: 7, interval_ms: 2, ..Default::default() }
}

fn make_configs(size: usize, pages: usize) -> anyhow::Result<Vec<Config>> {
    let mut out = Vec::new();
    for (i, _) in CONFIGS.iter().enumerate() {
        let (buffer, base) = if i < 2 {
            let m = Mapping::anonymous(size, &MapOptions { align: Some(HUGE_PMD), ..Default::default() })?;
            m.advise(if i == 0 { Advice::NoHugePage } else { Advice::HugePage })?;
            let base = m.addr();
            (Buffer::Anon(m), base)
        } else {
            let hps = Arc::new(Hps::start(hps_config()).context("starting HPS (needs userfaultfd MINOR_SHMEM)")?);
            let base = hps.alloc(size)? as usize;
            (Buffer::Hps(hps), base)
        };
        let loc = Arc::new(Mutex::new((0..pages).map(|p| base + p * PAGE).collect::<Vec<_>>()));
        if let Buffer::Hps(hps) = &buffer {
            // The application's compaction: copy each hot page onto hugepage memory, repoint
            // its location, and free the old page.
            let (h, l) = (Arc::downgrade(hps), loc.clone());
            hps.set_functions(
                None,
                Some(Box::new(move |active| {
                    let Some(h) = h.upgrade() else { return 0 };
                    let mut loc = l.lock().expect("loc lock");
                    let mut moved = 0;
                    for a in active {
                        let p = (a.addr - base) / PAGE;
                        let Ok(dst) = h.huge_alloc(PAGE) else { break };
                        // SAFETY: source is a page of the tracked arena, destination a fresh
                        // page of the hugepage arena; both owned by this experiment.
                        unsafe { std::ptr::copy_nonoverlapping(a.addr as *const u8, dst, PAGE) };
                        loc[p] = dst as usize;
                        let _ = h.release(a.addr, PAGE);
                        moved += 1;
                    }
                    moved
                })),
            );
        }
        out.push(Config { buffer, base, loc, throughput: Vec::new(), rss: Vec::new() });
    }
    Ok(out)
}

struct PatternResult {
    pattern: Pattern,
    steady: [f64; 3],
    rss_final: [f64; 3],
    rounds_to_steady: usize,
    window_reach: usize,
    after_ratio: f64,
    done_ms: f64,
    steady_ratio: f64,
    hps_stats: serde_json::Value,
    throughput: Vec<Vec<f64>>,
    rss: Vec<Vec<f64>>,
}

/// Median of the second half of the rounds (every layout decision falls in the first few).
fn steady(v: &[f64]) -> f64 {
    let q = (v.len() / 2).max(1);
    Summary::of(&v[v.len() - q..]).median
}

/// First round (1-based) at which the median of a 5-round window starting there reaches
/// `threshold`; the number of rounds when never.
fn rounds_to_reach(v: &[f64], threshold: f64) -> usize {
    let w = 5.min(v.len());
    (0..=v.len() - w).find(|&i| Summary::of(&v[i..i + w]).median >= threshold).map_or(v.len(), |i| i + 1)
}

fn run_pattern(ctx: &Context, pattern: Pattern, size: usize, rounds: usize) -> anyhow::Result<PatternResult> {
    let pages = size / PAGE;
    let order = pattern.order(pages, 42);
    let mut configs = make_configs(size, pages)?;
    let mut sink = 0u64;
    let mut handled = 0u64;
    let mut done_round = 0usize;
    let mut done_ms = 0.0;
    let started = Instant::now();
    for round in 0..rounds {
        // Sets are interleaved across configurations (D T H D T H …, the order rotating every
        // set), so a burst of load from elsewhere on the machine hits all three alike; each
        // configuration's round time is the sum of its 16 set times.
        let mut secs = [0.0f64; 3];
        for set in 0..SETS_PER_ROUND {
            for k in 0..3 {
                let ci = (round + set + k) % 3;
                let c = &configs[ci];
                let t = Instant::now();
                let loc = c.loc.lock().expect("loc lock");
                sink = sink.wrapping_add(run_set(&loc, &order));
                drop(loc);
                secs[ci] += t.elapsed().as_secs_f64();
            }
        }
        if let Buffer::Hps(h) = &configs[2].buffer {
            // Every notification queued during the round is handled now (the decision step
            // runs in this thread, the registered waiter), and its time is HPS's.
            let t = Instant::now();
            while h.wait_signal(Some(Duration::ZERO))?.is_some() {}
            secs[2] += t.elapsed().as_secs_f64();
        }
        for (c, s) in configs.iter_mut().zip(secs) {
            c.throughput.push((order.len() * SETS_PER_ROUND) as f64 / s / 1e6);
        }
        let smaps = read_smaps(Pid::SelfProcess)?;
        for c in configs.iter_mut() {
            let bytes = match &c.buffer {
                Buffer::Anon(_) => vma_rss(&smaps, c.base),
                Buffer::Hps(h) => {
                    let (a, b) = h.resident_bytes();
                    a + b
                }
            };
            c.rss.push(bytes as f64 / (1 << 20) as f64);
        }
        if let Buffer::Hps(h) = &configs[2].buffer {
            let st = h.stats();
            if st.promoted_regions + st.compacted_pages > handled {
                handled = st.promoted_regions + st.compacted_pages;
                done_round = round + 1;
                done_ms = started.elapsed().as_secs_f64() * 1e3;
            }
        }
        ctx.tick();
    }
    std::hint::black_box(sink);
    let hps = match &configs[2].buffer {
        Buffer::Hps(h) => h.clone(),
        Buffer::Anon(_) => unreachable!("config 2 is HPS"),
    };
    let st = hps.stats();
    // Break the callback's reference to its own HPS before dropping.
    hps.set_functions(None, None);
    let steady_v = [steady(&configs[0].throughput), steady(&configs[1].throughput), steady(&configs[2].throughput)];
    let rss_final = [steady(&configs[0].rss), steady(&configs[1].rss), steady(&configs[2].rss)];
    // Paired per round (the three ran back to back), so machine noise cancels in the ratio.
    let paired: Vec<f64> =
        configs[2].throughput.iter().zip(&configs[1].throughput).map(|(&h, &t)| ratio(h, t)).collect();
    let steady_ratio = steady(&paired);
    let window_reach = rounds_to_reach(&paired, 0.98 * steady_ratio);
    // HPS's memory layout is final after its last decision; the throughput that follows is
    // its steady state, checked by the paired ratio over the next 10 rounds.
    let rounds_to_steady = done_round.max(1);
    let after = &paired[rounds_to_steady.min(paired.len() - 1)..(rounds_to_steady + 10).min(paired.len())];
    let after_ratio = Summary::of(after).median;
    let hps_stats = json!({
        "promoted_regions": st.promoted_regions, "compacted_pages": st.compacted_pages,
        "collapse_failures": st.collapse_failures, "collapse_ms": st.collapse_ns as f64 / 1e6,
        "notifications_sent": st.notifications_sent, "notifications_received": st.notifications_received,
        "tracking_periods": st.tracker.periods, "armed_pages": st.tracker.armed_pages, "faults": st.tracker.faults,
    });
    Ok(PatternResult {
        pattern,
        steady: steady_v,
        rss_final,
        rounds_to_steady,
        window_reach,
        after_ratio,
        done_ms,
        steady_ratio,
        hps_stats,
        throughput: configs.iter().map(|c| c.throughput.clone()).collect(),
        rss: configs.iter().map(|c| c.rss.clone()).collect(),
    })
}

impl Experiment for HpsMicro {
    fn name(&self) -> &'static str {
        "hps-micro"
    }

    fn description(&self) -> &'static str {
        "HPS microbenchmark: throughput and RSS per round, Default vs THP vs HPS, 4 access patterns"
    }

    fn run(&self, ctx: &mut Context) -> anyhow::Result<Report> {
        let size: usize = ctx.mode.pick(256 << 20, 1 << 30);
        let rounds: usize = ctx.mode.pick(80, 400);
        let patterns = [Pattern::Sequential, Pattern::Random, Pattern::Skewed, Pattern::SparseHot];
        ctx.start_progress((patterns.len() * rounds) as u64, "rounds");
        let mut results = Vec::new();
        for p in patterns {
            ctx.message(p.name());
            results.push(run_pattern(ctx, p, size, rounds)?);
        }

        let mut report = Report::default();
        let mut table = Table::new([
            "pattern",
            "Default Mpages/s",
            "THP Mpages/s",
            "HPS Mpages/s",
            "HPS / THP",
            "HPS rounds to steady (last decision)",
            "… in ms",
            "HPS / THP, 10 rounds after",
            "first 5-round window ≥ 0.98×steady",
            "RSS MiB D / THP / HPS",
            "HPS RSS increase / THP's",
        ]);
        let mut min_tp = f64::INFINITY;
        let mut max_rss_inc = 0.0f64;
        let mut max_rounds = 0usize;
        let mut data = Vec::new();
        for r in &results {
            let tp = r.steady_ratio;
            min_tp = min_tp.min(tp);
            max_rounds = max_rounds.max(r.rounds_to_steady);
            let thp_inc = r.rss_final[1] - r.rss_final[0];
            let hps_inc = r.rss_final[2] - r.rss_final[0];
            let inc = if thp_inc > 1.0 { hps_inc.max(0.0) / thp_inc } else { f64::NAN };
            let judged = matches!(r.pattern, Pattern::Skewed | Pattern::SparseHot);
            if judged {
                max_rss_inc = max_rss_inc.max(inc);
            }
            table.row([
                r.pattern.name().to_string(),
                format!("{:.1}", r.steady[0]),
                format!("{:.1}", r.steady[1]),
                format!("{:.1}", r.steady[2]),
                format!("{tp:.3}"),
                r.rounds_to_steady.to_string(),
                format!("{:.0}", r.done_ms),
                format!("{:.3}", r.after_ratio),
                r.window_reach.to_string(),
                format!("{:.0} / {:.0} / {:.0}", r.rss_final[0], r.rss_final[1], r.rss_final[2]),
                if inc.is_nan() { "— (THP adds nothing)".to_string() } else { format!("{:.1}%", inc * 100.0) },
            ]);
            let mut tp_plot = Plot::new(format!("{} — throughput per round", r.pattern.name()), "round", "Mpages/s");
            let mut rss_plot = Plot::new(format!("{} — buffer memory per round", r.pattern.name()), "round", "MiB");
            for (i, name) in CONFIGS.iter().enumerate() {
                let pts = |v: &Vec<f64>| v.iter().enumerate().map(|(k, &y)| ((k + 1) as f64, y)).collect();
                tp_plot.series(*name, pts(&r.throughput[i]));
                rss_plot.series(*name, pts(&r.rss[i]));
            }
            report.plots.push(tp_plot);
            report.plots.push(rss_plot);
            report.figure(&format!("hps_vs_thp_{}", r.pattern.name().replace('-', "_")), tp);
            data.push(json!({
                "pattern": r.pattern.name(), "steady_mpages_s": r.steady, "rss_final_mib": r.rss_final,
                "rounds_to_steady": r.rounds_to_steady, "ratio_10_rounds_after": r.after_ratio,
                "first_window_reach": r.window_reach, "ms_to_steady": r.done_ms,
                "hps_vs_thp_paired_steady": r.steady_ratio, "hps": r.hps_stats,
                "throughput": r.throughput, "rss_mib": r.rss,
            }));
        }
        report.figure("hps_vs_thp_throughput_min", min_tp);
        report.figure("hps_vs_thp_rss_increase_max", max_rss_inc);
        report.figure("rounds_to_steady_max", max_rounds as f64);
        report.table(format!("buffer {}, {rounds} rounds of {SETS_PER_ROUND} sets", human_bytes(size as u64)), table);
        report.data =
            json!({ "size_bytes": size, "rounds": rounds, "sets_per_round": SETS_PER_ROUND, "patterns": data });
        report.note(
            "Steady state = median of the second half of the rounds; HPS / THP is the median of the per-round paired \
             ratio over that half (the configurations of a round run back to back). Rounds to steady = the last \
             round in which HPS promoted or compacted anything (its layout is final from then on); the next column \
             checks it with the median paired ratio over the 10 rounds after. The first 5-round window whose median \
             paired ratio reaches 0.98 × the steady one is shown too (noisy: rounds last milliseconds here). RSS increase is judged on skewed and \
             sparse-hot only (THP adds ~nothing on sequential/random). Sets of the three configurations are interleaved \
             within each round; the HPS round includes its decision step (promotion and compaction). Timings are on a 2-core VM shared with \
             other builds: expect noise.",
        );
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_touch_what_they_promise() {
        let pages = 3 * 512 * 3;
        let seq = Pattern::Sequential.order(pages, 1);
        assert_eq!(seq, (0..pages as u32).collect::<Vec<_>>());
        let mut rnd = Pattern::Random.order(pages, 1);
        rnd.sort();
        assert_eq!(rnd, seq);
        let sparse = Pattern::SparseHot.order(pages, 1);
        assert_eq!(sparse.len(), pages / 8);
        assert!(sparse.iter().all(|p| p % 8 == 0));
        let skew = Pattern::Skewed.order(pages, 1);
        let hot = skew.iter().filter(|&&p| (p as usize) < pages / 3).count();
        assert_eq!(hot, pages / 3);
        assert_eq!(skew.len() - hot, 6); // one page in each of the 6 cold regions
        let uniq: std::collections::HashSet<_> = skew.iter().collect();
        assert_eq!(uniq.len(), skew.len());
    }

    #[test]
    fn rounds_to_reach_finds_the_first_window_at_the_threshold() {
        let v = [1.0, 1.0, 1.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0];
        assert_eq!(rounds_to_reach(&v, 4.0), 2);
        assert_eq!(rounds_to_reach(&v, 1.0), 1);
        assert_eq!(rounds_to_reach(&v, 6.0), 10);
    }
}
