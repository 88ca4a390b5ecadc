//! `dlm-vs-swap`: DLM under an unmodified program against Linux's own paging (issue 9 §5).
//!
//! The program is the BT-like solver of `dlm-autotune` written as plain C
//! (`crates/eval/programs/bt_like.c`: seven malloc'd N³ arrays, a fixed number of iterations,
//! a checksum and per-iteration times on stdout), compiled here with `cc`. Three ways to run it:
//! - **all local**: on its own, in a memory cgroup with no limit (to measure its footprint);
//! - **Linux swap**: in a memory cgroup whose limit (v1 memory.limit_in_bytes) is the local
//!   memory DLM gets plus what the group is charged for beyond the arrays (below), with a swap
//!   file on the disk the results go to (the repo's disk, never tmpfs). The swap file is made
//!   and removed through the settings guard, and it is on only while a swap run runs, so other
//!   work on the machine never sees swap;
//! - **DLM**: `pagewise run --page-size auto --local-mem SAME --spawn-servers 2`, the shim
//!   routing the arrays into DLM memory (two spawned local memory servers, as in
//!   `dlm-autotune`), the unit tuned over windows from 128 KiB down to 16 KiB.
//!
//! Local memory is a share of the arrays (quick: 50% and 10%; full: 50/25/10/5%), rounded down
//! to whole 128 KiB units. Repetitions are interleaved (all configurations of repetition 0,
//! then of repetition 1, …). Every run must print the same checksum — a mismatch fails the
//! experiment. The time compared is the program's own loop time (from its first iteration to
//! its last, so neither process start, server start nor the initialisation of the arrays is
//! in it); a run over the time budget is stopped and reported as censored.
//!
//! What the limit counts: a v1 memory cgroup charges the program's anonymous memory (the
//! arrays, its stack, libc's heap and data; pages in the swap cache count while resident) and
//! its kernel memory (page tables and other kernel allocations, memory.kmem.usage_in_bytes,
//! which v1 also charges to memory.usage_in_bytes), plus up to 64 pages per CPU that the kernel
//! pre-charges in batches (MEMCG_CHARGE_BATCH) and hands out page by page. The program's text
//! is page cache charged to whoever read it first, not to the group. DLM's limit counts only
//! the arrays' resident units (the runtime's own buffers are outside it). So that the arrays
//! get the same memory in both, an all-local run before the others samples the group's
//! anonymous and kernel memory every 10 ms and the swap limit is DLM's local memory plus their
//! peak beyond the arrays (`program_overhead_bytes`; at 96³ about 128 KiB of anonymous and
//! 160 KiB of kernel memory). The pre-charged batches are left out: near the limit the kernel
//! charges page by page and drains them before it gives up. (Earlier versions added the
//! group's peak usage beyond the arrays, 512 KiB, which holds them.)
//!
//! Why the swap group's statistics are refreshed: at 10% (4.6 MiB for 47 MiB of arrays) the
//! group's OOM killer killed about one run in three (7 of 23 in a shell reproduction of a swap
//! run) with most of the swap file free. Traced (vmscan tracepoints, Linux 6.18): before each
//! kill, 18 reclaim rounds in a row freed 0 pages in 0.2 ms without scanning a page, and the
//! group's memory.stat at the kill read `inactive_anon 0`, `active_anon 5.0 MiB`. Reclaim
//! evicts from the inactive list only, and moves anonymous pages from the active list to it
//! only when the group's statistics say the inactive list is low or new refaults were seen
//! (`inactive_is_low()`, `prepare_scan_control()`, `shrink_lruvec()`, mm/vmscan.c). Those
//! statistics are per-CPU counters summed every 2 s (and by readers of memory.stat); reclaim
//! does not sum them itself unless that is late. In a 5 MiB group paging tens of thousands of
//! pages a second, the real inactive list empties while the summed counters, up to 2 s old,
//! still say it is not low: nothing is deactivated, the rounds free nothing, and
//! try_charge_memcg() declares OOM after MAX_RECLAIM_RETRIES. The traces show the active list
//! aged only in bursts 2 s apart. Swappiness 100 for the group and page-cluster 0 each left
//! kills (1 in 8), as the mechanism does not involve them. So during a swap run the
//! experiment reads the swap group's memory.stat every 10 ms ([`MemCgroup::refresh_stats`]),
//! which sums the counters: reclaim then decides on sizes at most 10 ms old. No run was
//! killed since (0 of 26 in the shell reproduction, 0 of 9 in three runs of the experiment;
//! a read every 50 or 200 ms also gave 0 of 8). This gives the group no memory; a read costs
//! about 0.1 ms of the experiment's own thread. Interleaved at 10%, reading every 10 ms
//! against every 200 ms changed the loop time by a median factor of 0.97 [0.71–1.09] (6
//! pairs, loaded machine) and the major faults by +3%. OOM kills that still happen are shown
//! in the table and counted in `swap_runs_oom_killed`.
//! Swap runs otherwise use the kernel's defaults (swappiness 60, page-cluster read-ahead).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use pagewise_dlm::process::pagewise_binary;
use pagewise_kernel::cgroup::{MemCgroup, Version};
use pagewise_kernel::swap::SwapFile;
use pagewise_kernel::SettingsGuard;
use serde_json::json;

use crate::{human_bytes, ratio, Context, Experiment, Plot, Report, Summary, Table};

pub struct DlmVsSwap;

/// The program's source, compiled by the experiment.
const SOURCE: &str = include_str!("../../programs/bt_like.c");
/// bt_like's arrays.
const ARRAYS: usize = 7;
/// Local memory is rounded down to a multiple of the largest DLM unit.
const MAX_UNIT: usize = 128 << 10;

/// What one run of the program printed on stdout.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ProgramOutput {
    /// Seconds per iteration, in order.
    pub iterations: Vec<f64>,
    /// Seconds from the first iteration's start to the last one's end.
    pub loop_secs: f64,
    pub checksum: String,
}

/// Parse bt_like's stdout: `iteration K SECONDS` lines (K = 0, 1, …), `loop SECONDS`,
/// `checksum HEX`. Anything else is an error (the program, or something routing its memory,
/// misbehaved).
pub(crate) fn parse_output(text: &str) -> anyhow::Result<ProgramOutput> {
    let mut iterations = Vec::new();
    let mut loop_secs = None;
    let mut checksum = None;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let secs = |s: &str| -> anyhow::Result<f64> {
            let v: f64 = s.parse().with_context(|| format!("bad seconds in {line:?}"))?;
            ensure!(v.is_finite() && v >= 0.0, "bad seconds in {line:?}");
            Ok(v)
        };
        match f.as_slice() {
            ["iteration", k, s] => {
                let k: usize = k.parse().with_context(|| format!("bad iteration number in {line:?}"))?;
                ensure!(k == iterations.len(), "iteration {k} out of order in {line:?}");
                iterations.push(secs(s)?);
            }
            ["loop", s] => loop_secs = Some(secs(s)?),
            ["checksum", h] if h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()) => {
                checksum = Some(h.to_string())
            }
            _ => bail!("unexpected line in the program's output: {line:?}"),
        }
    }
    Ok(ProgramOutput {
        iterations,
        loop_secs: loop_secs.context("the program printed no `loop` line")?,
        checksum: checksum.context("the program printed no checksum")?,
    })
}

/// How many allocations `pagewise run`'s shim put in DLM memory, from its report on stderr
/// (`pagewise: N allocation(s) on dlm memory, …`).
pub(crate) fn routed_allocations(stderr: &str) -> Option<u64> {
    stderr
        .lines()
        .find_map(|l| l.strip_prefix("pagewise: ")?.split(" allocation(s) on dlm memory").next()?.parse().ok())
}

/// Local memory for `percent` of `total` bytes: whole 128 KiB units, at least two.
pub(crate) fn local_bytes(total: usize, percent: usize) -> usize {
    ((total * percent / 100) / MAX_UNIT * MAX_UNIT).max(2 * MAX_UNIT)
}

/// The swap file's size: room for all the arrays (what a limit could push out) plus 64 MiB
/// for the rest of the program, in whole MiB.
pub(crate) fn swap_bytes(total: usize) -> u64 {
    ((total as u64).div_ceil(1 << 20) + 64) << 20
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Config {
    Local,
    Swap(usize),
    Dlm(usize),
}

/// How a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Finished,
    /// Stopped at the time budget.
    OverBudget,
    /// Killed by the kernel's OOM killer of its memory cgroup (Linux swap runs: reclaim could
    /// not keep the group under its limit).
    OomKilled,
}

/// One run's outcome.
struct Run {
    fate: Fate,
    /// What the program printed, when it finished.
    out: Option<ProgramOutput>,
    /// Process wall time (includes start-up and, for DLM, spawning the servers).
    wall: f64,
    /// Swap runs: major faults of the group during the run.
    majfaults: Option<u64>,
    /// DLM runs: the tuner's decisions (`pagewise run --decisions`), written when the program
    /// exits.
    decisions: Vec<serde_json::Value>,
}

impl Run {
    /// DLM runs: the unit the tuner ended at.
    fn final_unit(&self) -> Option<usize> {
        self.decisions.last()?["new_size"].as_u64().map(|s| s as usize)
    }
}

impl Run {
    /// The loop time; the budget (a lower bound) when stopped; NaN (left out of medians) when
    /// OOM-killed.
    fn secs(&self, budget: Duration) -> f64 {
        match (&self.out, self.fate) {
            (Some(o), _) => o.loop_secs,
            (None, Fate::OverBudget) => budget.as_secs_f64(),
            _ => f64::NAN,
        }
    }
}

/// The compiled program in a scratch directory, removed on drop.
struct Program {
    dir: PathBuf,
    bin: PathBuf,
}

impl Program {
    fn compile() -> anyhow::Result<Self> {
        // One directory per compile (tests compile it in parallel in one process).
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("pagewise-dlm-vs-swap-{}-{k}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let src = dir.join("bt_like.c");
        std::fs::write(&src, SOURCE).with_context(|| format!("writing {}", src.display()))?;
        let bin = dir.join("bt_like");
        let out = Command::new("cc")
            .args(["-O2", "-o"])
            .arg(&bin)
            .arg(&src)
            .output()
            .context("running cc (a C compiler is needed to build the test program)")?;
        ensure!(out.status.success(), "cc {} failed:\n{}", src.display(), String::from_utf8_lossy(&out.stderr));
        Ok(Program { dir, bin })
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// How often the waiting loop of [`run_with_budget`] checks on the child and calls its tick.
const TICK: Duration = Duration::from_millis(10);

/// Spawn `cmd` in its own process group (so a stop reaches what it started, e.g. the servers
/// and the program under `pagewise run`), killed if this experiment dies; wait up to `budget`,
/// calling `tick` (if any) every [`TICK`] while the child runs (a failing tick stops the child
/// and is returned). Returns (stdout, stderr, exit status (None: stopped at the budget), wall
/// seconds).
fn run_with_budget(
    mut cmd: Command,
    budget: Duration,
    mut tick: Option<&mut dyn FnMut() -> anyhow::Result<()>>,
) -> anyhow::Result<(String, String, Option<std::process::ExitStatus>, f64)> {
    use std::os::unix::process::CommandExt;
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    // SAFETY: prctl only, async-signal-safe.
    unsafe { cmd.pre_exec(|| pagewise_kernel::signal::set_parent_death_signal(libc::SIGKILL)) };
    let t = Instant::now();
    let mut child = cmd.spawn().with_context(|| format!("starting {cmd:?}"))?;
    let pgid = child.id() as i32;
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("piped")));
    let err = drain(Box::new(child.stderr.take().expect("piped")));
    let deadline = t + budget;
    let mut failed = None;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break Some(st);
        }
        if Instant::now() > deadline {
            break None;
        }
        if let Some(f) = tick.as_mut() {
            if let Err(e) = f() {
                failed = Some(e);
                break None;
            }
        }
        std::thread::sleep(TICK);
    };
    let wall = t.elapsed().as_secs_f64();
    if status.is_none() {
        // The leader is not reaped yet, so its pid (the group's id) cannot have been reused.
        let _ = pagewise_kernel::signal::kill_process_group(pgid, libc::SIGKILL);
        child.wait()?;
    }
    let (stdout, stderr) = (out.join().unwrap_or_default(), err.join().unwrap_or_default());
    if let Some(e) = failed {
        return Err(e.context(format!("while running {cmd:?} (stopped)")));
    }
    Ok((stdout, stderr, status, wall))
}

/// A run that must have succeeded if it finished: its output parsed, or an error with its
/// stderr.
fn finished_output(
    what: &str,
    status: Option<std::process::ExitStatus>,
    stdout: &str,
    stderr: &str,
) -> anyhow::Result<Option<ProgramOutput>> {
    match status {
        None => Ok(None),
        Some(st) if st.success() => Ok(Some(parse_output(stdout)?)),
        Some(st) => bail!("{what} failed ({st}):\n{stderr}"),
    }
}

/// The group's major faults so far (v1 `total_pgmajfault`, v2 `pgmajfault`).
fn majfaults(cg: &MemCgroup) -> anyhow::Result<u64> {
    let stat = cg.stat()?;
    Ok(stat.get("total_pgmajfault").or_else(|| stat.get("pgmajfault")).copied().unwrap_or(0))
}

/// The decisions in a `pagewise run --decisions` file (none when it was not written).
fn read_decisions(path: &Path) -> Vec<serde_json::Value> {
    let read = || -> Option<Vec<serde_json::Value>> {
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
        v["decisions"].as_array().cloned()
    };
    read().unwrap_or_default()
}

/// The tuner's windows as the seed's per-iteration table.
fn decisions_table(ds: &[serde_json::Value]) -> Table {
    let mut t = Table::new(["window", "working set", "local pages", "page size", "time in faults", "why"]);
    for d in ds {
        let size = |k: &str| human_bytes(d[k].as_u64().unwrap_or(0));
        t.row([
            d["iteration"].to_string(),
            d["working_set"].to_string(),
            d["local_units"].to_string(),
            format!("{} → {}", size("old_size"), size("new_size")),
            format!("{:.0}%", d["loop_time"].as_f64().unwrap_or(f64::NAN) * 100.0),
            d["reason"].as_str().unwrap_or("").to_string(),
        ]);
    }
    t
}

struct Setup<'a> {
    bin: &'a Path,
    pagewise: &'a Path,
    n: usize,
    iterations: usize,
    total: usize,
    budget: Duration,
    local_group: &'a MemCgroup,
    swap_group: &'a MemCgroup,
    swap: &'a SwapFile,
    scratch: &'a Path,
    /// Added to the swap group's limit: what the group is charged for beyond the arrays
    /// ([`measure_footprint`]).
    footprint: u64,
}

/// What a memory cgroup charges for the program beyond its arrays, measured in an all-local
/// run: the limit of the swap group is DLM's local memory plus `beyond_arrays()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Footprint {
    /// Anonymous memory beyond the arrays (stack, libc's heap and data), at the sample where
    /// anonymous plus kernel memory peaked.
    anon_beyond_arrays: u64,
    /// Kernel memory charged to the group (page tables and other kernel allocations; v1
    /// memory.kmem.usage_in_bytes, v2 memory.stat `kernel`) at that sample.
    kernel: u64,
    /// The group's peak usage minus the arrays (the earlier measure): it also holds the
    /// pages the kernel pre-charges per CPU in batches of 64 (MEMCG_CHARGE_BATCH), which are
    /// not memory the program uses. Reported, not added to the limit.
    peak_usage_beyond_arrays: u64,
}

impl Footprint {
    fn beyond_arrays(&self) -> u64 {
        self.anon_beyond_arrays + self.kernel
    }
}

/// The group's anonymous memory (v1 `total_rss`, v2 `anon`) and kernel memory.
fn anon_and_kernel(cg: &MemCgroup) -> anyhow::Result<(u64, u64)> {
    let stat = cg.stat()?;
    let get = |k: &str| stat.get(k).copied().unwrap_or(0);
    Ok(match cg.version() {
        Version::V1 => (get("total_rss"), cg.slab_bytes()?),
        Version::V2 => (get("anon"), get("kernel")),
    })
}

/// Run the program `bin` on an `n`³ grid (arrays of `total` bytes) all local in `group`, a
/// group of its own, for at least 10 iterations (so that sampling every [`TICK`] sees it after
/// it touched all its arrays), and measure [`Footprint`].
fn measure_footprint(
    bin: &Path,
    n: usize,
    iterations: usize,
    total: usize,
    budget: Duration,
    group: &MemCgroup,
) -> anyhow::Result<Footprint> {
    let mut cmd = Command::new(bin);
    cmd.args([n.to_string(), iterations.max(10).to_string()]);
    group.spawn_into(&mut cmd)?;
    let mut peak = (0u64, 0u64);
    let mut sample = || -> anyhow::Result<()> {
        let (anon, kernel) = anon_and_kernel(group)?;
        if anon + kernel > peak.0 + peak.1 {
            peak = (anon, kernel);
        }
        Ok(())
    };
    let (out, err, status, _) = run_with_budget(cmd, budget, Some(&mut sample))?;
    finished_output("the program", status, &out, &err)?.context("the all-local run hit the time budget")?;
    let (anon, kernel) = peak;
    let total = total as u64;
    ensure!(
        anon >= total,
        "the all-local run was never seen with its arrays resident (peak anonymous memory {} < {}): cannot measure its footprint",
        human_bytes(anon),
        human_bytes(total)
    );
    Ok(Footprint {
        anon_beyond_arrays: anon - total,
        kernel,
        peak_usage_beyond_arrays: group.max_usage()?.saturating_sub(total),
    })
}

fn run_one(s: &Setup, c: Config) -> anyhow::Result<Run> {
    let args = [s.n.to_string(), s.iterations.to_string()];
    match c {
        Config::Local => {
            let mut cmd = Command::new(s.bin);
            cmd.args(&args);
            s.local_group.spawn_into(&mut cmd)?;
            let (out, err, status, wall) = run_with_budget(cmd, s.budget, None)?;
            let out = finished_output("the program", status, &out, &err)?;
            let fate = if out.is_some() { Fate::Finished } else { Fate::OverBudget };
            Ok(Run { fate, out, wall, majfaults: None, decisions: Vec::new() })
        }
        Config::Swap(r) => {
            s.swap_group.set_limit(Some(local_bytes(s.total, r) as u64 + s.footprint))?;
            let before = majfaults(s.swap_group)?;
            let kills_before = s.swap_group.oom_kills()?;
            s.swap.on()?;
            let mut cmd = Command::new(s.bin);
            cmd.args(&args);
            s.swap_group.spawn_into(&mut cmd)?;
            // The kernel's reclaim decides whether to age the active anonymous list on
            // statistics flushed every 2 s; refreshed every TICK instead, so that it does not
            // OOM-kill the program with swap free (module doc, MemCgroup::refresh_stats).
            let mut refresh = || s.swap_group.refresh_stats().context("refreshing the swap group's statistics");
            let ran = run_with_budget(cmd, s.budget, Some(&mut refresh));
            // Off at once (the program's swap entries went with it), so nothing else on the
            // machine pages to it between runs.
            let off = s.swap.off();
            let (out, err, status, wall) = ran?;
            off?;
            let faults = majfaults(s.swap_group)? - before;
            let oom_killed = s.swap_group.oom_kills()? > kills_before;
            if oom_killed && status.is_some_and(|st| !st.success()) {
                return Ok(Run {
                    fate: Fate::OomKilled,
                    out: None,
                    wall,
                    majfaults: Some(faults),
                    decisions: Vec::new(),
                });
            }
            let out = finished_output("the program under the cgroup limit", status, &out, &err)?;
            let fate = if out.is_some() { Fate::Finished } else { Fate::OverBudget };
            ensure!(
                faults > 0,
                "the program ran at {r}% under a {} limit without a major fault: the limit did not apply",
                human_bytes(local_bytes(s.total, r) as u64)
            );
            Ok(Run { fate, out, wall, majfaults: Some(faults), decisions: Vec::new() })
        }
        Config::Dlm(r) => {
            let decisions = s.scratch.join(format!("decisions-{r}.json"));
            let _ = std::fs::remove_file(&decisions);
            let mut cmd = Command::new(s.pagewise);
            cmd.args(["run", "--page-size", "auto", "--spawn-servers", "2", "--local-mem"])
                .arg(local_bytes(s.total, r).to_string())
                .arg("--decisions")
                .arg(&decisions)
                .arg("--")
                .arg(s.bin)
                .args(&args);
            let (out, err, status, wall) = run_with_budget(cmd, s.budget, None)?;
            let out = finished_output("pagewise run", status, &out, &err)?;
            if out.is_some() {
                let routed = routed_allocations(&err).unwrap_or(0);
                ensure!(
                    routed >= ARRAYS as u64,
                    "pagewise run put {routed} allocation(s) in DLM memory, not the program's {ARRAYS} arrays:\n{err}"
                );
            }
            let fate = if out.is_some() { Fate::Finished } else { Fate::OverBudget };
            Ok(Run { fate, out, wall, majfaults: None, decisions: read_decisions(&decisions) })
        }
    }
}

impl Experiment for DlmVsSwap {
    fn name(&self) -> &'static str {
        "dlm-vs-swap"
    }

    fn description(&self) -> &'static str {
        "an unmodified C program (the BT-like solver) under `pagewise run --page-size auto` vs Linux's own paging (memory cgroup limit + swap file) at the same local memory, and vs all memory local (issue 9)"
    }

    fn run(&self, ctx: &mut Context) -> anyhow::Result<Report> {
        let pagewise = pagewise_binary()?;
        let n: usize = ctx.mode.pick(96, 96);
        let iterations: usize = ctx.mode.pick(4, 10);
        let reps: usize = 3;
        let budget = Duration::from_secs(ctx.mode.pick(30, 300));
        let ratios: Vec<usize> = ctx.mode.pick(vec![50, 10], vec![50, 25, 10, 5]);
        let total = n * n * n * 8 * ARRAYS;
        let program = Program::compile()?;

        // The swap file goes next to the results (the repo's disk when run from it) and is
        // recorded in the guard before the groups, so the groups (and their tasks) are gone
        // before it is swapped off.
        let guard = SettingsGuard::new();
        let swap = SwapFile::create(&guard, ctx.out_dir.join("swapfile"), swap_bytes(total))
            .context("creating the swap file (next to the results)")?;
        let parent = MemCgroup::create(&guard, &format!("dlm-vs-swap-{}", std::process::id()))?;
        let local_group = parent.create_child(&guard, "local")?;
        let swap_group = parent.create_child(&guard, "swap")?;
        let mut setup = Setup {
            bin: &program.bin,
            pagewise: &pagewise,
            n,
            iterations,
            total,
            budget,
            local_group: &local_group,
            swap_group: &swap_group,
            swap: &swap,
            scratch: &program.dir,
            footprint: 0,
        };
        // What the group charges beyond the arrays, added to the swap group's limit (module doc).
        let footprint = measure_footprint(&program.bin, n, iterations, total, budget, &local_group)
            .context("measuring the program's footprint")?;
        let overhead = footprint.beyond_arrays();
        setup.footprint = overhead;

        let mut configs = vec![Config::Local];
        for &r in &ratios {
            configs.push(Config::Swap(r));
            configs.push(Config::Dlm(r));
        }
        ctx.start_progress((configs.len() * reps) as u64, "runs");
        ctx.message(format!("{n}³ grid, {} arrays, swap file {}", human_bytes(total as u64), swap.path().display()));
        let mut reference: Option<String> = None;
        let runs = crate::interleave(ctx, &configs, reps, |&c, rep| {
            let run = run_one(&setup, c).with_context(|| format!("{c:?}, repetition {rep}"))?;
            if let Some(o) = &run.out {
                match &reference {
                    None => reference = Some(o.checksum.clone()),
                    Some(x) => ensure!(
                        *x == o.checksum,
                        "{c:?}, repetition {rep}: checksum {} differs from the first run's {x} (wrong data)",
                        o.checksum
                    ),
                }
            }
            Ok(run)
        })?;
        let swap_path = swap.path().to_path_buf();
        if let Some(e) = guard.restore().into_iter().next() {
            bail!("the settings guard could not restore: {e}");
        }
        ensure!(!swap_path.exists(), "the swap file {} was not removed", swap_path.display());

        // Report.
        let summary = |rs: &[Run]| {
            let mut s = Summary::of(&rs.iter().map(|r| r.secs(budget)).collect::<Vec<_>>());
            if s.n == 0 {
                // No run finished (all OOM-killed): no time, so no ratio (null), never 0 s.
                s.median = f64::NAN;
            }
            s
        };
        // '>' some runs hit the budget; "(k OOM)" k runs were OOM-killed and left out.
        let shown = |rs: &[Run]| {
            let sum = summary(rs);
            let ooms = rs.iter().filter(|r| r.fate == Fate::OomKilled).count();
            let over = rs.iter().any(|r| r.fate == Fate::OverBudget);
            let base = if sum.n == 0 { "—".to_string() } else { sum.display(3) };
            format!(
                "{base}{}{}",
                if over { " >" } else { "" },
                if ooms > 0 { format!(" ({ooms} OOM-killed)") } else { String::new() }
            )
        };
        let idx = |c: Config| configs.iter().position(|&x| x == c).expect("configured");
        let local = summary(&runs[0]);
        let mut report = Report::default();
        let oom_total: usize = runs.iter().flatten().filter(|r| r.fate == Fate::OomKilled).count();
        let mut table = Table::new([
            "local memory",
            "all local s",
            "Linux swap s",
            "DLM s",
            "DLM / swap",
            "DLM / local",
            "swap / local",
            "swap major faults",
            "DLM final unit",
        ]);
        let mut plot = Plot::new("BT-like solver, unmodified", "local memory (% of arrays)", "loop time (s)");
        let (mut swap_pts, mut dlm_pts, mut local_pts) = (Vec::new(), Vec::new(), Vec::new());
        let mut data = Vec::new();
        for (i, c) in configs.iter().enumerate() {
            for (rep, run) in runs[i].iter().enumerate() {
                let (kind, r) = match c {
                    Config::Local => ("local", 100),
                    Config::Swap(r) => ("swap", *r),
                    Config::Dlm(r) => ("dlm", *r),
                };
                data.push(json!({"config": kind, "ratio": r, "local_bytes": local_bytes(total, r), "rep": rep,
                    "loop_s": run.out.as_ref().map(|o| o.loop_secs), "iterations_s": run.out.as_ref().map(|o| o.iterations.clone()),
                    "wall_s": run.wall, "fate": format!("{:?}", run.fate), "major_faults": run.majfaults,
                    "final_unit": run.final_unit()}));
            }
        }
        for &r in &ratios {
            let (sw, dl) = (&runs[idx(Config::Swap(r))], &runs[idx(Config::Dlm(r))]);
            let (s, d) = (summary(sw), summary(dl));
            let faults = Summary::of(&sw.iter().filter_map(|x| x.majfaults.map(|f| f as f64)).collect::<Vec<_>>());
            let units: Vec<String> =
                dl.iter().map(|x| x.final_unit().map_or("—".into(), |u| human_bytes(u as u64))).collect();
            table.row([
                format!("{r}% ({})", human_bytes(local_bytes(total, r) as u64)),
                local.display(3),
                shown(sw),
                shown(dl),
                format!("{:.3}", ratio(d.median, s.median)),
                format!("{:.2}", ratio(d.median, local.median)),
                format!("{:.2}", ratio(s.median, local.median)),
                format!("{:.0}", faults.median),
                units.join(", "),
            ]);
            report.figure(&format!("dlm_vs_swap_time_{r}pct"), ratio(d.median, s.median));
            report.figure(&format!("dlm_vs_local_time_{r}pct"), ratio(d.median, local.median));
            report.figure(&format!("swap_vs_local_time_{r}pct"), ratio(s.median, local.median));
            swap_pts.push((r as f64, s.median));
            dlm_pts.push((r as f64, d.median));
            local_pts.push((r as f64, local.median));
        }
        let smallest = *ratios.iter().min().expect("ratios");
        let (sw, dl) = (&runs[idx(Config::Swap(smallest))], &runs[idx(Config::Dlm(smallest))]);
        let (s, d) = (summary(sw).median, summary(dl).median);
        let mut summary_first = serde_json::Map::new();
        summary_first.insert("dlm_vs_swap_time".into(), ratio(d, s).into());
        summary_first.insert("dlm_vs_local_time".into(), ratio(d, local.median).into());
        summary_first.append(&mut report.summary);
        report.summary = summary_first;
        report.figure("local_s", local.median);
        report.figure("arrays_bytes", total as u64);
        report.figure("program_overhead_bytes", overhead);
        report.figure("program_anon_beyond_arrays_bytes", footprint.anon_beyond_arrays);
        report.figure("program_kernel_bytes", footprint.kernel);
        report.figure("program_peak_usage_beyond_arrays_bytes", footprint.peak_usage_beyond_arrays);
        report.figure("swap_stats_refresh_ms", TICK.as_millis() as u64);
        report.figure("swap_runs_oom_killed", oom_total as u64);
        report.figure("grid_n", n as u64);
        report.figure("iterations", iterations as u64);
        report.table(
            format!(
                "Loop time, median [min–max] of {reps} interleaved runs ({n}³ grid, {ARRAYS} malloc'd arrays = {}, {iterations} iterations; DLM: 2 local servers, auto from 128 KiB)",
                human_bytes(total as u64)
            ),
            table,
        );
        // Per iteration at the smallest ratio: where each configuration spends its time.
        let mut per_it = Table::new(["iteration", "all local s", "Linux swap s", "DLM s"]);
        let median_it = |rs: &[Run], k: usize| {
            let v: Vec<f64> = rs.iter().filter_map(|r| r.out.as_ref()?.iterations.get(k).copied()).collect();
            if v.is_empty() {
                "—".to_string()
            } else {
                format!("{:.3}", Summary::of(&v).median)
            }
        };
        for k in 0..iterations {
            per_it.row([k.to_string(), median_it(&runs[0], k), median_it(sw, k), median_it(dl, k)]);
        }
        report.table(format!("Per-iteration time at {smallest}% local memory (median of {reps})"), per_it);
        if let Some(first) = dl.iter().find(|r| !r.decisions.is_empty()) {
            report.table(
                format!("DLM tuner windows at {smallest}% local memory (first run that finished)"),
                decisions_table(&first.decisions),
            );
        }
        plot.series("Linux swap (cgroup limit)", swap_pts);
        plot.series("DLM (pagewise run, auto)", dlm_pts);
        plot.series("all local", local_pts);
        report.plots.push(plot);
        report.data = json!(data);
        report.note(format!(
            "`dlm_vs_swap_time` = DLM / Linux swap at {smallest}% local memory (below 1: DLM faster). The swap limit is \
             memory.limit_in_bytes = DLM's --local-mem plus what the group is charged for beyond the arrays, measured in \
             an all-local run first: {} = {} of other anonymous memory (stack, libc) + {} of kernel memory (page tables); \
             the group's peak usage was {} beyond the arrays, the rest being the kernel's per-CPU charge batches, not \
             added. So the arrays get the same memory in both. The swap group's memory.stat is read every {} ms during \
             a swap run: that flushes the kernel's per-CPU statistics, which reclaim otherwise sees up to 2 s old and \
             which decide whether it ages the active anonymous list; with them stale, the group's reclaim found an \
             empty inactive list, freed nothing in 18 rounds in a row and OOM-killed the program with swap free (module \
             doc). Swappiness and page-cluster are the kernel's defaults. The swap file lives on the results' \
             filesystem ({}); '>' marks runs stopped at the {} s budget (counted as the budget); 'OOM-killed' runs were \
             killed by the swap group's OOM killer all the same and are left out of the median (no finished run: no \
             ratio). Every finished run printed the same checksum.",
            human_bytes(overhead),
            human_bytes(footprint.anon_beyond_arrays),
            human_bytes(footprint.kernel),
            human_bytes(footprint.peak_usage_beyond_arrays),
            TICK.as_millis(),
            swap_path.parent().map(|p| p.display().to_string()).unwrap_or_default(),
            budget.as_secs()
        ));
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_output_parses_and_bad_output_is_refused() {
        let o = parse_output("iteration 0 0.5\niteration 1 0.25\nloop 0.750001\nchecksum 68dd9913dbada891\n").unwrap();
        assert_eq!(o.iterations, vec![0.5, 0.25]);
        assert_eq!(o.loop_secs, 0.750001);
        assert_eq!(o.checksum, "68dd9913dbada891");
        assert!(parse_output("iteration 0 0.5\nloop 0.5\n").is_err(), "no checksum");
        assert!(parse_output("iteration 1 0.5\nloop 0.5\nchecksum 68dd9913dbada891\n").is_err(), "out of order");
        assert!(parse_output("loop 0.5\nchecksum 68dd99\n").is_err(), "short checksum");
        assert!(parse_output("loop -1\nchecksum 68dd9913dbada891\n").is_err());
        assert!(parse_output("Segmentation fault\nloop 1\nchecksum 68dd9913dbada891\n").is_err());
    }

    #[test]
    fn routing_report_is_read_from_the_shims_stderr() {
        let err = "iteration 0\npagewise: 7 allocation(s) on dlm memory, 0 refused (left in libc)\n";
        assert_eq!(routed_allocations(err), Some(7));
        assert_eq!(routed_allocations("pagewise: 2 allocation(s) on hps memory, 0 refused\n"), None);
        assert_eq!(routed_allocations(""), None);
    }

    #[test]
    fn local_memory_is_whole_units_and_the_swap_file_holds_the_arrays() {
        let total = 96 * 96 * 96 * 8 * ARRAYS;
        for p in [50, 25, 10, 5] {
            let l = local_bytes(total, p);
            assert_eq!(l % MAX_UNIT, 0);
            assert!(l <= total * p / 100 && l + MAX_UNIT > total * p / 100);
        }
        assert_eq!(local_bytes(1000, 5), 2 * MAX_UNIT);
        let s = swap_bytes(total);
        assert!(s >= total as u64 + (64 << 20) && s.is_multiple_of(1 << 20));
    }

    /// The budget loop calls its tick while the child runs, and a failing tick stops the child
    /// and is the error.
    #[test]
    fn the_tick_runs_while_the_child_runs_and_its_error_stops_it() {
        let mut ticks = 0;
        let mut count = || -> anyhow::Result<()> {
            ticks += 1;
            Ok(())
        };
        let mut cmd = Command::new("sleep");
        cmd.arg("0.2");
        let (_, _, status, _) = run_with_budget(cmd, Duration::from_secs(60), Some(&mut count)).unwrap();
        assert!(status.unwrap().success());
        assert!(ticks >= 1, "ticked {ticks} times");
        let mut fail = || -> anyhow::Result<()> { bail!("tick failed on purpose") };
        let mut cmd = Command::new("sleep");
        cmd.arg("600");
        let e = run_with_budget(cmd, Duration::from_secs(600), Some(&mut fail)).unwrap_err();
        assert!(format!("{e:#}").contains("tick failed on purpose"), "{e:#}");
    }

    /// The footprint of the program beyond its arrays is measured from its group: its arrays
    /// were seen resident, the rest is small and non-zero (a stack and page tables at least),
    /// and the group's peak usage holds it all.
    #[test]
    fn the_programs_footprint_beyond_its_arrays_is_measured() {
        if pagewise_kernel::cgroup::v1_memory_root().is_none() && pagewise_kernel::cgroup::v2_memory_root().is_none() {
            pagewise_kernel::testing::skip("no memory cgroup controller");
            return;
        }
        let p = Program::compile().unwrap();
        let guard = SettingsGuard::new_without_signal_handler();
        let g = MemCgroup::create(&guard, &format!("dlm-vs-swap-test-{}", std::process::id())).unwrap();
        let n = 48;
        let total = n * n * n * 8 * ARRAYS;
        let f = measure_footprint(&p.bin, n, 3, total, Duration::from_secs(120), &g).unwrap();
        assert!(f.anon_beyond_arrays > 0 && f.kernel > 0, "{f:?}");
        assert!(f.beyond_arrays() < 8 << 20, "{f:?}");
        assert!(f.peak_usage_beyond_arrays >= f.beyond_arrays(), "{f:?}");
    }

    /// The embedded program compiles, runs, and gives the same checksum at every run (its
    /// arithmetic does not depend on where its memory is).
    #[test]
    fn the_program_compiles_and_is_deterministic() {
        let p = Program::compile().unwrap();
        let run = || {
            let out = Command::new(&p.bin).args(["12", "3"]).output().unwrap();
            assert!(out.status.success());
            parse_output(&String::from_utf8_lossy(&out.stdout)).unwrap()
        };
        let (a, b) = (run(), run());
        assert_eq!(a.iterations.len(), 3);
        assert_eq!(a.checksum, b.checksum);
        let bad = Command::new(&p.bin).args(["1", "3"]).output().unwrap();
        assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("N must be"));
    }
}
