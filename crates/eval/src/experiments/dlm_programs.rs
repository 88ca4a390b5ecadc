//! `dlm-programs`: DLM under third-party programs nobody here wrote, run unmodified with
//! `pagewise run` (issue 22) — HPC Challenge (`hpcc`, one rank), 7-Zip's benchmark with a large
//! dictionary, `xz -9`, GNU `sort` with a large buffer, python3 + numpy (FFT, matrix multiply
//! and sort; and a file through np.memmap widened and summed, arrays swept front to back) —
//! against Linux's own paging at the same local memory.
//!
//! For each program: a plain run first measures its footprint (peak RSS, wait4(2)) and gives
//! the reference output (crates/eval/src/programs: the whole output by digest, or the
//! program's own self-checks for the benchmarks that print speeds). Then at each local-memory
//! share of that footprint, the configurations run interleaved (plain, auto, each fixed size,
//! zram, disk swap; repetition after repetition):
//! - **auto**: `pagewise run --page-size auto --max-page-size 1M`, and **fixed** sizes
//!   `--page-size S`, `--local-mem` = the share (whole MiB), on two fresh memory servers the
//!   experiment starts for each run ([`servers`]): on this host, or with `--net PROFILE` on two
//!   testbed hosts behind links shaped to that network, the programs on a client host of their
//!   own ([`crate::net`]); the summary keys are the same for each profile (results in
//!   `net-PROFILE/`);
//! - **zram** (not with `--net`: no network in it): the program in a memory cgroup with zram
//!   swap on (`/dev/zram0`: the same RAM, compressed; [`crate::paging`]); **disk**: the same with a swap file next to the results.
//!   The group's limit is the memory the program held under DLM's auto run at that share
//!   (its peak VmRSS, sampled, and VmHWM: routed pages resident up to --local-mem, plus what
//!   the shim leaves in libc and the runtime's buffers), so both get the same RAM — also when
//!   the auto run was stopped at the budget, whose peak was sampled while it ran. Only when
//!   the auto run failed is that memory not known, and the limit is the share plus 16 MiB
//!   (marked in the data). Linux swap may not manage a program in that memory at all: a run
//!   its group's OOM killer ends is reported as failed (xz -9 in 6–12 MiB with zram swap is
//!   killed after 36,000–600,000 major faults on this VM).
//!
//! Every run starts from one state of the host's memory
//! ([`crate::harness::prepare_host_memory`], `--host-memory`): by default once free page
//! reporting is idle, every run allocating memory the host has to back again (the program's,
//! the servers' copies, swap's); with `backed`, twice the plain run's footprint plus 64 MiB
//! faulted in and freed just before, as on bare metal. A run's time includes allocating that
//! memory, and on a VM whose balloon reports free pages that time depends on how long ago the
//! memory was freed. Left to chance, numpy-stream's plain run took 0.26–0.29 s straight after
//! another, 1.1–1.7 s after 5 s idle or after a swap run, and which one a configuration got
//! was its place in the run order (`auto` always ran after plain, plain after disk swap).
//!
//! Every finished run's output must be the plain run's (a mismatch is a failure of that run,
//! reported, never averaged); a DLM run where the shim routed nothing is reported as such
//! (it measured nothing of DLM). A run over its time budget is stopped; its time is a lower
//! bound, and a ratio it enters is marked in `*_censored` (`lower_bound`, `upper_bound`,
//! `unknown`). The DLM configurations run [`DLM_REPS`] times, the baselines [`BASELINE_REPS`];
//! a fixed configuration that ran out of budget or failed is not repeated, nor `auto` once
//! most of its runs did ([`Config::settled`]).
//!
//! Sizes: `--quick` runs 25% and 5% only, fixed sizes 4 KiB, 64 KiB and 1 MiB, small inputs
//! (hpcc N = 600, 7-Zip archiving 4 MB with a 16 MiB dictionary instead of its benchmark,
//! whose length it picks itself from a speed estimate; xz of 1 MB, sort of 8 MB with `-S 32M`,
//! numpy on 1 M doubles, numpy streaming a 32 MB file) and a budget of 6× the plain run (10–30
//! s, at least 2×); `--full` runs 50/25/10/5%, every power of two from 4 KiB to 1 MiB, hpcc
//! N = 4000, 7-Zip up to 32 MiB, xz of 24 MB, sort of 160 MB with `-S 512M`, numpy on 8 M
//! doubles, numpy streaming 96 MB, a budget of 20× (60–900 s, at least 2×).
//!
//! The time compared is the process's wall time (start-up included, the servers' start not);
//! for 7-Zip's benchmark, which runs for a time it picks, the inverse of its total
//! rating. Separately, `run_vs_library_time_4k` / `_128k`: the project's BT-like solver
//! (crates/eval/programs/bt_like.c) unmodified under `pagewise run` against the same source
//! built with its arrays from `dlm_alloc` (bt_library.c, linked with libpagewise), same servers
//! count, same fixed unit, same local memory (4 KiB at 5%, 128 KiB at 50%), the solver's own
//! loop time (not with `--net`: it compares two client paths on the same servers).

mod library;
pub mod servers;
mod table;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use pagewise_dlm::process::pagewise_binary;
use pagewise_kernel::cgroup::MemCgroup;
use pagewise_kernel::swap::{SwapFile, SwapSpace};
use pagewise_kernel::SettingsGuard;
use serde_json::json;

use crate::net::ServerHosts;
use crate::programs::{self, jobs, Canon, Captured, DlmFlags, Job, Outcome, Scratch, Wrap};
use crate::{human_bytes, Context, Experiment, Report};

pub struct DlmPrograms;

/// Memory servers of each DLM run.
const SERVERS: usize = 2;

/// Repetitions of the DLM configurations (auto and the fixed sizes), the figures compared with
/// each other in `auto_vs_best_fixed`: at one fixed size numpy-stream's runs took 1.65–2.36 s
/// (8 runs, 1 MiB units at 5% local memory, every run from memory the host had taken back), so
/// a median of 3 moved by ±10% between runs of the experiment, and the best of three such
/// medians was lower still. The baselines (plain, zram, disk swap) are compared with DLM at
/// ratios of 1.3–12 and keep [`BASELINE_REPS`].
const DLM_REPS: usize = 5;
const BASELINE_REPS: usize = 3;

/// One configuration of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Config {
    Plain,
    /// None: auto.
    Dlm(Option<u64>),
    Zram,
    Disk,
}

impl Config {
    pub(crate) fn label(self) -> String {
        match self {
            Config::Plain => "plain".into(),
            Config::Dlm(None) => "auto".into(),
            Config::Dlm(Some(s)) => human_bytes(s),
            Config::Zram => "zram".into(),
            Config::Disk => "disk swap".into(),
        }
    }

    fn repetitions(self) -> usize {
        match self {
            Config::Dlm(_) => DLM_REPS,
            Config::Plain | Config::Zram | Config::Disk => BASELINE_REPS,
        }
    }

    /// Whether more runs could not change this configuration's figure, given its `earlier`
    /// runs at this share. A fixed size or a swap space that ran out of budget or failed once
    /// is not repeated (its figure is a bound, or none). `auto` is, since its runs give the
    /// swap groups' limit, until most of its repetitions ran out: the median is then the
    /// budget whatever the rest would take.
    fn settled(self, earlier: &[&Run]) -> bool {
        let over = earlier.iter().filter(|r| r.fate == Fate::OverBudget).count();
        match self {
            Config::Plain => false,
            Config::Dlm(None) => over > self.repetitions() / 2,
            Config::Dlm(Some(_)) | Config::Zram | Config::Disk => earlier.iter().any(|r| r.fate != Fate::Finished),
        }
    }
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Fate {
    Finished,
    OverBudget,
    /// It failed, or its output was not the plain run's: the message says which.
    Failed(String),
    /// `pagewise run` routed no allocation: nothing of DLM was measured.
    NotRouted,
}

/// One run's result.
#[derive(Clone, Debug)]
pub(crate) struct Run {
    pub config: Config,
    pub percent: u64,
    pub rep: usize,
    pub fate: Fate,
    /// Seconds (or, for 7-Zip's benchmark, 1000 / its rating); the budget when over it; NaN
    /// when it failed.
    pub cost: f64,
    pub wall: f64,
    /// DLM auto runs: the program's peak resident memory, sampled.
    pub program_rss: Option<u64>,
    /// Swap runs: the group's limit, and whether it came from the auto run (else the share
    /// plus 16 MiB).
    pub limit: Option<(u64, bool)>,
}

/// A program of the experiment and its sizes.
struct Program {
    job: Job,
    /// The process name of the program (found under `pagewise run` by it).
    comm: &'static str,
}

fn programs(mode: crate::Mode, dir: &Path) -> anyhow::Result<Vec<Program>> {
    let sub = |name: &str| -> anyhow::Result<PathBuf> {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
        Ok(d)
    };
    Ok(vec![
        Program { job: jobs::hpcc(&sub("hpcc")?, mode.pick(600, 4000))?, comm: "hpcc" },
        // 7-Zip's benchmark picks its own number of rounds from a speed estimate: on a loaded
        // 2-core host one pass at a 2 MiB dictionary took 17 to 150 s. Quick mode archives a
        // generated file instead (fixed work; the benchmark in full mode).
        match mode {
            crate::Mode::Quick => Program { job: jobs::seven_zip_archive(&sub("7zz")?, 4 << 20, 16)?, comm: "7zz" },
            crate::Mode::Full => Program { job: jobs::seven_zip_bench(&sub("7zz")?, 25), comm: "7zz" },
        },
        Program { job: jobs::xz(&sub("xz")?, mode.pick(1 << 20, 24 << 20))?, comm: "xz" },
        Program {
            job: jobs::sort(&sub("sort")?, mode.pick(8 << 20, 160 << 20), mode.pick(32 << 20, 512 << 20))?,
            comm: "sort",
        },
        Program { job: jobs::numpy(&sub("numpy")?, mode.pick(1 << 20, 8 << 20))?, comm: "python3" },
        // A 16 MB file made a program of a second (5% local memory, 1 MiB units) whose runs at
        // one fixed size took 0.82–1.25 s on a 2-core host: medians of 3 compared that noise,
        // not sizes. With 32 MB: 1.4–2.0 s, a dozen tuning windows.
        Program { job: jobs::numpy_stream(&sub("numpy-stream")?, mode.pick(32 << 20, 96 << 20))?, comm: "python3" },
    ])
}

/// The figure compared: wall seconds, or 1000 / rating for 7-Zip's benchmark.
fn cost(job: &Job, o: &Outcome) -> f64 {
    match job.canon {
        Canon::SevenZipBench => programs::seven_zip_rating(&o.stdout.head).map_or(f64::NAN, |r| 1000.0 / r),
        _ => o.wall,
    }
}

/// `percent` of `footprint`, in whole MiB, at least two of the largest unit.
pub(crate) fn local_bytes(footprint: u64, percent: u64, largest_unit: u64) -> u64 {
    ((footprint * percent / 100) >> 20 << 20).max(2 * largest_unit)
}

/// The program's resident memory, sampled while it runs under `pagewise run`.
struct RssProbe<'a> {
    root: u32,
    comm: &'a str,
    pid: Option<u32>,
    peak: u64,
}

impl RssProbe<'_> {
    fn sample(&mut self) {
        if self.pid.is_none() {
            self.pid = programs::descendant_named(self.root, self.comm);
        }
        let Some(pid) = self.pid else { return };
        if let Ok(st) = pagewise_kernel::procfs::read_status(pagewise_kernel::procfs::Pid::Id(pid as i32)) {
            self.peak = self.peak.max(st.vmrss.unwrap_or(0).max(st.vmhwm.unwrap_or(0)) * 1024);
        }
    }
}

struct SwapSetup<'a> {
    group: &'a MemCgroup,
    zram: &'a dyn SwapSpace,
    disk: &'a dyn SwapSpace,
}

struct Setup<'a> {
    pagewise: &'a Path,
    /// Where each DLM run's memory servers are started.
    hosts: &'a ServerHosts,
    budget: Duration,
    /// The swap configurations' group and spaces (None across the testbed: no swap runs).
    swap: Option<SwapSetup<'a>>,
    decisions: PathBuf,
}

/// Run `p` once in configuration `c` at `local` bytes; `limit` is the swap groups' limit.
fn run_one(
    s: &Setup,
    p: &Program,
    c: Config,
    local: u64,
    limit: u64,
    reference: &str,
) -> anyhow::Result<(Fate, Outcome, Option<u64>)> {
    p.job.reset()?;
    let (outcome, rss) = match c {
        Config::Plain => (programs::run(p.job.command(s.pagewise, &Wrap::Plain), s.budget, None)?, None),
        Config::Dlm(page) => {
            let flags = DlmFlags {
                page_size: page,
                max_page_size: 1 << 20,
                local_mem: local,
                servers: SERVERS,
                min_alloc: 1 << 20,
                decisions: Some(s.decisions.clone()),
            };
            // Fresh servers for every run, stopped when it ends (dropped below).
            let run_servers = servers::RunServers::start(s.hosts, s.pagewise, SERVERS)?;
            let cmd = run_servers.command(s.pagewise, &p.job, &flags);
            // The program is the one process of that name among this process's descendants
            // (runs are one at a time).
            let mut probe = RssProbe { root: std::process::id(), comm: p.comm, pid: None, peak: 0 };
            let mut tick = || -> anyhow::Result<()> {
                probe.sample();
                Ok(())
            };
            let o = programs::run(cmd, s.budget, Some(&mut tick))?;
            (o, Some(probe.peak).filter(|&x| x > 0))
        }
        Config::Zram | Config::Disk => {
            let sw = s.swap.as_ref().context("a swap configuration without swap spaces")?;
            let swap = if c == Config::Zram { sw.zram } else { sw.disk };
            let cmd = p.job.command(s.pagewise, &Wrap::Plain);
            let r = crate::paging::run_limited_with_swap(cmd, sw.group, limit, swap, s.budget)?;
            let mut h = twox_hash::XxHash3_64::new();
            std::hash::Hasher::write(&mut h, r.stdout.as_bytes());
            let stdout = Captured {
                digest: std::hash::Hasher::finish(&h),
                bytes: r.stdout.len() as u64,
                head: r.stdout.chars().take(256 << 10).collect(),
            };
            if r.oom_killed && !r.succeeded() {
                let o = Outcome { status: r.status, wall: r.wall_s, stdout, stderr: r.stderr, max_rss: 0 };
                return Ok((Fate::Failed("killed by its group's OOM killer".into()), o, None));
            }
            (Outcome { status: r.status, wall: r.wall_s, stdout, stderr: r.stderr, max_rss: 0 }, None)
        }
    };
    if !outcome.finished() {
        return Ok((Fate::OverBudget, outcome, rss));
    }
    let fate = match p.job.canonical(&outcome) {
        Err(e) => Fate::Failed(format!("{e:#}").lines().take(6).collect::<Vec<_>>().join(" / ")),
        Ok(out) if out != reference => {
            Fate::Failed(format!("output differs from the plain run's: {out:?} vs {reference:?}"))
        }
        Ok(_) => match c {
            Config::Dlm(_) if programs::routed_allocations(&outcome.stderr, "dlm").unwrap_or(0) == 0 => Fate::NotRouted,
            _ => Fate::Finished,
        },
    };
    Ok((fate, outcome, rss))
}

impl Experiment for DlmPrograms {
    fn name(&self) -> &'static str {
        "dlm-programs"
    }

    fn runs_across_hosts(&self) -> bool {
        true
    }

    fn description(&self) -> &'static str {
        "third-party programs (hpcc, 7-Zip, xz, sort, numpy, numpy streaming) unmodified under `pagewise run`: auto vs every fixed page size, vs zram and disk swap at the same local memory, and the unmodified path vs the library path (issue 22)"
    }

    fn run(&self, ctx: &mut Context) -> anyhow::Result<Report> {
        let pagewise = pagewise_binary()?;
        let mode = ctx.mode;
        let percents: Vec<u64> = mode.pick(vec![25, 5], vec![50, 25, 10, 5]);
        let fixed: Vec<u64> = mode.pick(
            vec![4 << 10, 64 << 10, 1 << 20],
            vec![4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20],
        );
        let scratch = Scratch::new("dlm-programs")?;
        let progs = programs(mode, scratch.path())?;
        let mut configs = vec![Config::Plain, Config::Dlm(None)];
        configs.extend(fixed.iter().map(|&s| Config::Dlm(Some(s))));
        // Swap paging and the library path use no network: the run without --net measures
        // them, and a run per profile stays a few minutes in quick mode.
        let across_hosts = ctx.net.is_some();
        if !across_hosts {
            configs.extend([Config::Zram, Config::Disk]);
        }

        // Swap spaces and the group (only for the swap configurations), restored by the guard
        // whatever happens.
        let guard = SettingsGuard::new();
        let swap_bytes = 4u64 << 30;
        let spaces = if across_hosts {
            None
        } else {
            let disk =
                SwapFile::create(&guard, ctx.out_dir.join("swapfile"), swap_bytes).context("creating the swap file")?;
            let zram = crate::paging::zram_swap(&guard, swap_bytes)?;
            let group = MemCgroup::create(&guard, &format!("dlm-programs-{}", std::process::id()))?;
            Some((group, zram, disk))
        };
        // Each DLM run's servers: on this host, or with --net on two testbed hosts of their own.
        let hosts = ServerHosts::new(ctx.net, SERVERS)?;
        let mut setup = Setup {
            pagewise: &pagewise,
            hosts: &hosts,
            budget: Duration::from_secs(60),
            swap: spaces.as_ref().map(|(group, zram, disk)| SwapSetup { group, zram, disk }),
            decisions: scratch.path().join("decisions.json"),
        };

        let library_steps = if across_hosts { 0 } else { library::STEPS };
        let runs_per_share: usize = configs.iter().map(|c| c.repetitions()).sum();
        let total_steps = progs.len() * (1 + percents.len() * runs_per_share) + library_steps;
        ctx.start_progress(total_steps as u64, "programs");
        // The programs (plain and under `pagewise run`) on the client's host.
        let on_client = hosts.enter_client()?;
        let mut results = Vec::new();
        for p in &progs {
            ctx.message(format!("{}: plain run", p.job.name));
            p.job.reset()?;
            let first = programs::run(p.job.command(&pagewise, &Wrap::Plain), Duration::from_secs(1800), None)?;
            ctx.tick();
            let reference = p.job.canonical(&first).with_context(|| format!("{} on its own", p.job.name))?;
            if p.job.name == "xz" {
                let d = &p.job.cwd;
                jobs::verify_round_trip(jobs::XZ_DECOMPRESS, &d.join("xz-input.txt.xz"), &d.join("xz-input.txt"))?;
            }
            let footprint = first.max_rss;
            // Budget: a generous multiple of the plain run, bounded so quick mode stays quick.
            let plain_s = first.wall.max(0.5);
            setup.budget = Duration::from_secs_f64(
                mode.pick((plain_s * 6.0).clamp(10.0, 30.0), (plain_s * 20.0).clamp(60.0, 900.0)).max(plain_s * 2.0),
            );
            let mut runs: Vec<Run> = Vec::new();
            for &pct in &percents {
                let local = local_bytes(footprint, pct, 1 << 20);
                let mut limit: Option<u64> = None;
                for rep in 0..DLM_REPS.max(BASELINE_REPS) {
                    for &c in configs.iter().filter(|c| rep < c.repetitions()) {
                        ctx.message(format!("{} at {pct}% ({}), {} #{rep}", p.job.name, human_bytes(local), c.label()));
                        let earlier: Vec<&Run> = runs.iter().filter(|r| r.config == c && r.percent == pct).collect();
                        if c.settled(&earlier) {
                            ctx.tick();
                            continue;
                        }
                        let lim = limit.unwrap_or(local + (16 << 20));
                        let swap_limit = matches!(c, Config::Zram | Config::Disk).then_some((lim, limit.is_some()));
                        // The program's memory and the servers' (or swap's) copy of it.
                        crate::harness::prepare_host_memory(ctx, 2 * footprint + (64 << 20))?;
                        let (fate, o, rss) = run_one(&setup, p, c, local, lim, &reference)
                            .with_context(|| format!("{} at {pct}%, {}, repetition {rep}", p.job.name, c.label()))?;
                        // A run stopped at the budget held its memory too: its peak was
                        // sampled while it ran, and local memory fills within the first faults.
                        if c == Config::Dlm(None) && matches!(fate, Fate::Finished | Fate::OverBudget) {
                            limit = limit.max(rss);
                        }
                        if let Fate::Failed(why) = &fate {
                            ctx.log(format!("{} at {pct}% {} #{rep}: {why}", p.job.name, c.label()));
                        }
                        let cost = match fate {
                            Fate::Finished => cost(&p.job, &o),
                            Fate::OverBudget if p.job.canon != Canon::SevenZipBench => setup.budget.as_secs_f64(),
                            _ => f64::NAN,
                        };
                        runs.push(Run {
                            config: c,
                            percent: pct,
                            rep,
                            fate,
                            cost,
                            wall: o.wall,
                            program_rss: rss,
                            limit: swap_limit,
                        });
                        ctx.tick();
                    }
                }
            }
            results.push(table::ProgramResult {
                name: p.job.name.clone(),
                footprint,
                plain_first_s: first.wall,
                budget_s: setup.budget.as_secs_f64(),
                locals: percents.iter().map(|&pct| (pct, local_bytes(footprint, pct, 1 << 20))).collect(),
                runs,
                rating: p.job.canon == Canon::SevenZipBench,
            });
        }
        drop(scratch);
        drop(on_client);

        let path = if across_hosts {
            None
        } else {
            ctx.message("bt_like: pagewise run vs dlm_alloc");
            Some(library::compare(ctx, &pagewise, mode)?)
        };
        if let Some(e) = guard.restore().into_iter().next() {
            anyhow::bail!("the settings guard could not restore: {e}");
        }
        let mut report = table::report(&results, &percents, &configs);
        if let Some(path) = &path {
            library::add_to(&mut report, path);
        }
        report.data = json!({
            "programs": results.iter().map(table::ProgramResult::json).collect::<Vec<_>>(),
            "library": path.as_ref().map(library::PathComparison::json),
        });
        hosts.record(&mut report)?;
        if across_hosts {
            report.note(
                "Across the testbed (--net): plain and the DLM configurations only. zram and disk swap use no network, and \
                 the library-path comparison compares two client paths on the same servers: the run without --net \
                 measures them.",
            );
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(config: Config, fate: Fate) -> Run {
        Run { config, percent: 5, rep: 0, fate, cost: 1.0, wall: 1.0, program_rss: None, limit: None }
    }

    #[test]
    fn a_configuration_is_repeated_until_more_runs_cannot_change_its_figure() {
        let (done, over) = (Fate::Finished, Fate::OverBudget);
        let fixed = Config::Dlm(Some(64 << 10));
        for c in [fixed, Config::Zram, Config::Disk] {
            assert!(!c.settled(&[&run(c, done.clone()), &run(c, done.clone())]), "{}", c.label());
            assert!(c.settled(&[&run(c, done.clone()), &run(c, over.clone())]), "{}", c.label());
            assert!(c.settled(&[&run(c, Fate::Failed("wrong output".into()))]), "{}", c.label());
        }
        // auto gives the swap groups' limit: repeated until most of its runs ran out of budget.
        let auto = Config::Dlm(None);
        let runs: Vec<Run> = (0..DLM_REPS).map(|_| run(auto, over.clone())).collect();
        let majority = DLM_REPS / 2 + 1;
        assert!(!auto.settled(&runs.iter().take(majority - 1).collect::<Vec<_>>()));
        assert!(auto.settled(&runs.iter().take(majority).collect::<Vec<_>>()));
        assert!(!auto.settled(&[&run(auto, Fate::Failed("x".into())), &run(auto, done)]));
        assert!(!Config::Plain.settled(&[&run(Config::Plain, over)]));
        assert!(Config::Dlm(None).repetitions() >= Config::Plain.repetitions().max(3));
    }
}
