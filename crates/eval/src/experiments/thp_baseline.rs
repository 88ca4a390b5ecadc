//! `thp-baseline`: random pointer-chasing over a buffer with 4 KiB pages vs MADV_HUGEPAGE.
//!
//! This is the effect every HPS figure rests on: once a buffer outgrows the TLB's reach with
//! 4 KiB pages, each dependent random access pays a page walk that 2 MiB pages avoid. The chain
//! is one random cycle (Sattolo's algorithm) over 64-byte slots, so every access is a cache
//! line the hardware prefetcher cannot guess, and the next address depends on the current load.

use std::time::Instant;

use anyhow::Context as _;
use pagewise_kernel::mem::{Advice, MapOptions, Mapping, HUGE_PMD};
use pagewise_kernel::procfs::{read_smaps, Pid};
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::{human_bytes, interleave, ratio, Context, Experiment, Plot, Report, Summary, Table};

pub struct ThpBaseline;

const SLOT: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pages {
    Base,
    Huge,
}

impl Pages {
    fn label(self) -> &'static str {
        match self {
            Pages::Base => "4 KiB",
            Pages::Huge => "THP (MADV_HUGEPAGE)",
        }
    }
}

struct Measurement {
    ns_per_access: f64,
    /// Fraction of the buffer mapped by PMD hugepages (AnonHugePages / Rss of its VMA).
    huge_fraction: f64,
}

/// Build one random cycle over `n` slots of the buffer: slot i holds the index of its successor.
fn build_chain(buf: &Mapping, seed: u64) {
    let n = buf.len() / SLOT;
    let base = buf.as_ptr() as *mut u64;
    let slot = |i: usize| {
        // SAFETY: i < n, so the slot lies inside the mapping.
        unsafe { base.add(i * SLOT / 8) }
    };
    for i in 0..n {
        // SAFETY: in bounds, our own private mapping.
        unsafe { slot(i).write(i as u64) };
    }
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    // Sattolo: swapping only with j < i yields a single cycle through all n slots.
    for i in (1..n).rev() {
        let j = rng.random_range(0..i);
        // SAFETY: i, j < n.
        unsafe { std::ptr::swap(slot(i), slot(j)) };
    }
}

/// Follow the chain for `steps` loads; returns the slot reached (so the loop is not elided).
#[inline(never)]
fn chase(buf: &Mapping, steps: u64) -> u64 {
    let base = buf.as_ptr() as *const u64;
    let mut idx = 0u64;
    for _ in 0..steps {
        // SAFETY: every stored index is < n, set by build_chain.
        idx = unsafe { base.add(idx as usize * SLOT / 8).read() };
    }
    std::hint::black_box(idx)
}

fn huge_fraction_of(addr: usize) -> anyhow::Result<f64> {
    let maps = read_smaps(Pid::SelfProcess)?;
    let vma = maps
        .0
        .iter()
        .find(|m| m.address.0 as usize <= addr && addr < m.address.1 as usize)
        .context("buffer's VMA not in smaps")?;
    let get = |k: &str| vma.extension.map.get(k).copied().unwrap_or(0) as f64;
    Ok(ratio(get("AnonHugePages"), get("Rss")))
}

fn measure(size: usize, pages: Pages, steps: u64, seed: u64) -> anyhow::Result<Measurement> {
    let buf = Mapping::anonymous(size, &MapOptions { align: Some(HUGE_PMD), ..Default::default() })?;
    buf.advise(match pages {
        Pages::Base => Advice::NoHugePage,
        Pages::Huge => Advice::HugePage,
    })?;
    build_chain(&buf, seed);
    let huge_fraction = huge_fraction_of(buf.addr())?;
    chase(&buf, steps / 10); // warm caches and TLB the same way for both
    let t = Instant::now();
    chase(&buf, steps);
    let ns_per_access = t.elapsed().as_nanos() as f64 / steps as f64;
    Ok(Measurement { ns_per_access, huge_fraction })
}

impl Experiment for ThpBaseline {
    fn name(&self) -> &'static str {
        "thp-baseline"
    }

    fn description(&self) -> &'static str {
        "random pointer-chasing, 4 KiB pages vs MADV_HUGEPAGE, buffer 64 MiB..4 GiB (ns/access)"
    }

    fn run(&self, ctx: &mut Context) -> anyhow::Result<Report> {
        let sizes: Vec<usize> =
            ctx.mode.pick(vec![64 << 20, 256 << 20, 1 << 30], vec![64 << 20, 256 << 20, 1 << 30, 4 << 30]);
        let reps = ctx.mode.pick(3, 5);
        let steps: u64 = ctx.mode.pick(4_000_000, 20_000_000);
        let configs = [Pages::Base, Pages::Huge];
        ctx.start_progress((sizes.len() * reps * configs.len()) as u64, "pointer chasing");

        let mut table = Table::new(["buffer", "4 KiB ns/access", "THP ns/access", "THP / 4 KiB", "THP coverage"]);
        let mut plot = Plot::new("Random pointer-chasing", "buffer size (MiB)", "ns per access").log_x();
        let (mut base_pts, mut huge_pts) = (Vec::new(), Vec::new());
        let mut report = Report::default();
        let mut data = Vec::new();
        for &size in &sizes {
            ctx.message(format!("buffer {}", human_bytes(size as u64)));
            let results = interleave(ctx, &configs, reps, |&pages, rep| measure(size, pages, steps, rep as u64 + 1))?;
            let ns = |i: usize| Summary::of(&results[i].iter().map(|m| m.ns_per_access).collect::<Vec<_>>());
            let (base, huge) = (ns(0), ns(1));
            let coverage = Summary::of(&results[1].iter().map(|m| m.huge_fraction).collect::<Vec<_>>());
            let r = ratio(huge.median, base.median);
            table.row([
                human_bytes(size as u64),
                base.display(1),
                huge.display(1),
                format!("{r:.3}"),
                format!("{:.0}%", coverage.median * 100.0),
            ]);
            let mib = (size >> 20) as f64;
            base_pts.push((mib, base.median));
            huge_pts.push((mib, huge.median));
            let key = format!("ratio_{}", human_bytes(size as u64).replace(' ', "").to_lowercase());
            report.figure(&key, r);
            data.push(json!({
                "size_bytes": size,
                "base_ns": results[0].iter().map(|m| m.ns_per_access).collect::<Vec<_>>(),
                "huge_ns": results[1].iter().map(|m| m.ns_per_access).collect::<Vec<_>>(),
                "huge_fraction": results[1].iter().map(|m| m.huge_fraction).collect::<Vec<_>>(),
                "base_ns_summary": base, "huge_ns_summary": huge,
            }));
            if size == 1 << 30 {
                report.figure("thp_vs_4k_1gib", r);
                report.figure("ns_per_access_4k_1gib", base.median);
                report.figure("ns_per_access_thp_1gib", huge.median);
            }
        }
        plot.series(Pages::Base.label(), base_pts);
        plot.series(Pages::Huge.label(), huge_pts);
        report.table("", table);
        report.plots.push(plot);
        report.data = json!({ "steps": steps, "reps": reps, "slot_bytes": SLOT, "sizes": data });
        report.note(format!(
            "{steps} dependent loads per measurement after a warm-up of {}; {reps} repetitions interleaved; median [min–max].",
            steps / 10
        ));
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_is_one_cycle_through_every_slot() {
        let buf = Mapping::anonymous(1 << 16, &MapOptions::default()).unwrap();
        build_chain(&buf, 7);
        let n = buf.len() / SLOT;
        let mut seen = vec![false; n];
        let base = buf.as_ptr() as *const u64;
        let mut idx = 0usize;
        for _ in 0..n {
            assert!(!seen[idx], "slot {idx} visited twice before the cycle closed");
            seen[idx] = true;
            // SAFETY: in bounds of our own mapping.
            idx = unsafe { base.add(idx * SLOT / 8).read() } as usize;
        }
        assert_eq!(idx, 0);
        assert!(seen.iter().all(|&s| s));
    }
}
