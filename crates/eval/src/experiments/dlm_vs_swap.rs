//! `dlm-vs-swap`: DLM under an unmodified program against Linux's own paging (issues 9 §5 and 23).
//!
//! The program is the BT-like solver of `dlm-autotune` written as plain C
//! (`crates/eval/programs/bt_like.c`: seven malloc'd N³ arrays, a fixed number of iterations,
//! a checksum and per-iteration times on stdout), compiled here with `cc`. Four ways to run it:
//! - **all local**: on its own, in a memory cgroup with no limit (to measure its footprint);
//! - **Linux swap on zram** (the like-for-like baseline: DLM's servers keep the pages in RAM,
//!   and so does zram, compressed): in a memory cgroup whose limit (v1 memory.limit_in_bytes)
//!   is the local memory DLM gets plus what the group is charged for beyond the arrays
//!   (below), with `/dev/zram0` as swap ([`crate::paging::zram_swap`]: lz4 where offered);
//! - **Linux swap on disk**: the same limit with a swap file on the disk the results go to (the
//!   repo's disk, never tmpfs);
//! - **DLM**: `pagewise run --page-size auto --local-mem SAME --spawn-servers 2`, the shim
//!   routing the arrays into DLM memory (two spawned local memory servers, as in
//!   `dlm-autotune`), the unit tuned over windows from 128 KiB down to 16 KiB.
//!
//! The zram device and the swap file are set up and removed through the settings guard, and
//! each is on only while one of its runs runs ([`crate::paging::run_limited_with_swap`], which
//! also explains why the group's statistics are refreshed every 10 ms during those runs), so
//! other work on the machine never sees swap. zram's compressed pool is not charged to the
//! group: the table reports its peak next to the limit, as DLM's servers' memory is not in
//! DLM's local memory either.
//!
//! Local memory is a share of the arrays (quick: 50% and 10%; full: 50/25/10/5%), rounded down
//! to whole 128 KiB units. Repetitions are interleaved (all configurations of repetition 0,
//! then of repetition 1, …), and each DLM/zram and DLM/disk ratio is also taken per repetition
//! (runs seconds apart), whose extremes are the `_min`/`_max` keys. Every run must print the
//! same checksum — a mismatch fails the experiment. The time compared is the program's own
//! loop time (from its first iteration to its last, so neither process start, server start
//! nor the initialisation of the arrays is in it); a run over the time budget is stopped and
//! counted as the budget, which makes the ratios it enters bounds (`*_censored`).
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

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, ensure, Context as _};
use pagewise_dlm::process::pagewise_binary;
use pagewise_kernel::cgroup::{MemCgroup, Version};
use pagewise_kernel::swap::{SwapFile, SwapSpace, ZramSwap};
use pagewise_kernel::SettingsGuard;

use crate::paging::{run_limited_with_swap, run_with_budget, zram_swap};
use crate::{human_bytes, Context, Experiment, Report, Table};

mod figures;

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

/// One configuration; the number is the local memory in percent of the arrays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Config {
    Local,
    /// Linux swap on zram under a memory cgroup limit.
    Zram(usize),
    /// Linux swap on a disk swap file under the same limit.
    DiskSwap(usize),
    Dlm(usize),
}

/// How a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fate {
    Finished,
    /// Stopped at the time budget.
    OverBudget,
    /// Killed by the kernel's OOM killer of its memory cgroup (Linux swap runs: reclaim could
    /// not keep the group under its limit).
    OomKilled,
}

/// One run's outcome.
pub(crate) struct Run {
    pub fate: Fate,
    /// What the program printed, when it finished.
    pub out: Option<ProgramOutput>,
    /// Process wall time (includes start-up and, for DLM, spawning the servers).
    pub wall: f64,
    /// Swap runs: major faults of the group during the run.
    pub majfaults: Option<u64>,
    /// zram runs: the most RAM zram's compressed pool took during the run.
    pub zram_peak: Option<u64>,
    /// DLM runs: the tuner's decisions (`pagewise run --decisions`), written when the program
    /// exits.
    pub decisions: Vec<serde_json::Value>,
}

impl Run {
    fn new(fate: Fate, out: Option<ProgramOutput>, wall: f64) -> Self {
        Run { fate, out, wall, majfaults: None, zram_peak: None, decisions: Vec::new() }
    }

    /// DLM runs: the unit the tuner ended at.
    pub fn final_unit(&self) -> Option<usize> {
        self.decisions.last()?["new_size"].as_u64().map(|s| s as usize)
    }

    /// The loop time; the budget (a lower bound) when stopped; NaN (left out of medians) when
    /// OOM-killed.
    pub fn secs(&self, budget: Duration) -> f64 {
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
        // A private directory per compile (mkdtemp, 0700): the program is run as root, so no
        // other user may plant it or its source (issue 23).
        let scratch = pagewise_kernel::private_dir::PrivateDir::new("dlm-vs-swap")?;
        let src = scratch.join("bt_like.c");
        std::io::Write::write_all(&mut pagewise_kernel::private_dir::create_new_file(&src, 0o600)?, SOURCE.as_bytes())
            .with_context(|| format!("writing {}", src.display()))?;
        let bin = scratch.join("bt_like");
        let out = Command::new("cc")
            .args(["-O2", "-o"])
            .arg(&bin)
            .arg(&src)
            .output()
            .context("running cc (a C compiler is needed to build the test program)")?;
        ensure!(out.status.success(), "cc {} failed:\n{}", src.display(), String::from_utf8_lossy(&out.stderr));
        Ok(Program { dir: scratch.keep(), bin })
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
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
    let mut t = Table::new(["window", "working set", "local pages", "page size", "wall s per CPU s", "why"]);
    for d in ds {
        let size = |k: &str| human_bytes(d[k].as_u64().unwrap_or(0));
        t.row([
            d["iteration"].to_string(),
            d["working_set"].to_string(),
            d["local_units"].to_string(),
            format!("{} → {}", size("old_size"), size("new_size")),
            format!("{:.1}", d["loop_time"].as_f64().unwrap_or(f64::NAN)),
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
    zram: &'a ZramSwap,
    disk_swap: &'a SwapFile,
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
/// group of its own, for at least 10 iterations (so that sampling every [`crate::paging::TICK`] sees it after
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
            Ok(Run::new(fate, out, wall))
        }
        Config::Zram(r) | Config::DiskSwap(r) => {
            let swap: &dyn SwapSpace = if matches!(c, Config::Zram(_)) { s.zram } else { s.disk_swap };
            let limit = local_bytes(s.total, r) as u64 + s.footprint;
            let mut cmd = Command::new(s.bin);
            cmd.args(&args);
            let ran = run_limited_with_swap(cmd, s.swap_group, limit, swap, s.budget)?;
            let mut run = if ran.oom_killed && ran.status.is_some_and(|st| !st.success()) {
                Run::new(Fate::OomKilled, None, ran.wall_s)
            } else {
                let what = format!("the program under the cgroup limit with {}", swap.describe());
                let out = finished_output(&what, ran.status, &ran.stdout, &ran.stderr)?;
                ensure!(
                    ran.major_faults > 0,
                    "the program ran at {r}% under a {} limit without a major fault: the limit did not apply",
                    human_bytes(limit)
                );
                let fate = if out.is_some() { Fate::Finished } else { Fate::OverBudget };
                Run::new(fate, out, ran.wall_s)
            };
            run.majfaults = Some(ran.major_faults);
            run.zram_peak = ran.swap_ram_peak;
            Ok(run)
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
            let mut run = Run::new(fate, out, wall);
            run.decisions = read_decisions(&decisions);
            Ok(run)
        }
    }
}

impl Experiment for DlmVsSwap {
    fn name(&self) -> &'static str {
        "dlm-vs-swap"
    }

    fn description(&self) -> &'static str {
        "an unmodified C program (the BT-like solver) under `pagewise run --page-size auto` vs Linux's own paging at the same local memory (a memory cgroup limit with swap on zram, the like-for-like baseline, and with a disk swap file), and vs all memory local (issues 9, 23)"
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

        // The swap spaces are recorded in the guard before the groups, so the groups (and
        // their tasks) are gone before they are swapped off. The swap file goes next to the
        // results (the repo's disk when run from it).
        let guard = SettingsGuard::new();
        let disk_swap = SwapFile::create(&guard, ctx.out_dir.join("swapfile"), swap_bytes(total))
            .context("creating the swap file (next to the results)")?;
        let zram = zram_swap(&guard, swap_bytes(total))?;
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
            zram: &zram,
            disk_swap: &disk_swap,
            scratch: &program.dir,
            footprint: 0,
        };
        // What the group charges beyond the arrays, added to the swap group's limit (module doc).
        let footprint = measure_footprint(&program.bin, n, iterations, total, budget, &local_group)
            .context("measuring the program's footprint")?;
        setup.footprint = footprint.beyond_arrays();

        let mut configs = vec![Config::Local];
        for &r in &ratios {
            configs.extend([Config::Zram(r), Config::DiskSwap(r), Config::Dlm(r)]);
        }
        ctx.start_progress((configs.len() * reps) as u64, "runs");
        ctx.message(format!("{n}³ grid, {} arrays, {}", human_bytes(total as u64), zram.describe()));
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
        let facts = figures::Facts {
            n,
            iterations,
            reps,
            total,
            budget,
            ratios,
            footprint,
            zram: zram.describe(),
            disk_swap_dir: disk_swap.path().parent().map(|p| p.display().to_string()).unwrap_or_default(),
        };
        let swap_path = disk_swap.path().to_path_buf();
        if let Some(e) = guard.restore().into_iter().next() {
            bail!("the settings guard could not restore: {e}");
        }
        ensure!(!swap_path.exists(), "the swap file {} was not removed", swap_path.display());
        Ok(figures::report(&facts, &configs, &runs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Directories another user (uid 65534) made at the names the old code used —
    /// `pagewise-dlm-vs-swap-{pid}-{k}` in the temporary directory, holding symlinks named like
    /// the source and the program to a file of ours — are neither written through nor used:
    /// the program that runs as root is built in a private directory (issue 23).
    #[test]
    fn the_program_is_built_in_a_private_directory_whatever_was_planted() {
        use std::os::unix::fs::MetadataExt;
        let ours = pagewise_kernel::private_dir::PrivateDir::new("victim").unwrap();
        let victim = ours.join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let base = std::env::temp_dir().join(format!("pagewise-dlm-vs-swap-{}", std::process::id()));
        let script = format!(
            "for k in $(seq 0 31); do d='{b}'-$k; mkdir -m 0777 \"$d\" && ln -s '{v}' \"$d/bt_like.c\" && ln -s '{v}' \"$d/bt_like\" || exit 1; done",
            b = base.display(),
            v = victim.display()
        );
        let planted = pagewise_kernel::testing::run_as_user(65534, &script);
        let program = planted.then(Program::compile);
        for k in 0..32 {
            let _ = std::fs::remove_dir_all(format!("{}-{k}", base.display()));
        }
        let Some(program) = program else { return };
        let program = program.unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious", "written through a planted symlink");
        let meta = std::fs::symlink_metadata(&program.dir).unwrap();
        assert_eq!((meta.uid(), meta.mode() & 0o7777), (0, 0o700), "{}", program.dir.display());
        assert!(program.bin.starts_with(&program.dir) && program.bin.is_file());
    }

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

    /// The zram baseline end to end: the program under a memory cgroup limit far below its
    /// arrays, with zram swap on for the run, gives the all-local checksum; its pages went
    /// through the device (major faults, the pool's peak); the swap is off after the run and
    /// the guard resets the device.
    #[test]
    fn the_program_under_a_limit_with_zram_swap_gives_the_local_checksum() {
        use crate::paging::{run_limited_with_swap, zram_swap, ZRAM_DEVICE};
        // SAFETY: no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return pagewise_kernel::testing::skip("zram setup and swapon(2) need root");
        }
        if !Path::new("/sys/block").join(ZRAM_DEVICE).exists() {
            return pagewise_kernel::testing::skip(
                "no /sys/block/zram0: kernel without zram, or the module is not loaded",
            );
        }
        if pagewise_kernel::cgroup::v1_memory_root().is_none() && pagewise_kernel::cgroup::v2_memory_root().is_none() {
            return pagewise_kernel::testing::skip("no memory cgroup controller");
        }
        let p = Program::compile().unwrap();
        let (n, iterations) = (48, 3);
        let total = n * n * n * 8 * ARRAYS;
        let args = [n.to_string(), iterations.to_string()];
        let local = Command::new(&p.bin).args(&args).output().unwrap();
        assert!(local.status.success());
        let local = parse_output(&String::from_utf8_lossy(&local.stdout)).unwrap();
        {
            let guard = SettingsGuard::new_without_signal_handler();
            let zram = zram_swap(&guard, swap_bytes(total)).unwrap();
            let g = MemCgroup::create(&guard, &format!("dlm-vs-swap-zram-test-{}", std::process::id())).unwrap();
            let mut cmd = Command::new(&p.bin);
            cmd.args(&args);
            let limit = (total / 4) as u64 + (2 << 20);
            let run = run_limited_with_swap(cmd, &g, limit, &zram, Duration::from_secs(120)).unwrap();
            assert!(run.succeeded() && !run.oom_killed, "{run:?}");
            assert_eq!(parse_output(&run.stdout).unwrap().checksum, local.checksum, "the same result as all local");
            assert!(run.major_faults > 0, "pages came back from swap: {run:?}");
            assert!(run.swap_ram_peak.is_some_and(|b| b > 0), "the pool held them: {run:?}");
            assert!(!zram.is_on().unwrap(), "swap is off after the run");
        }
        let initstate = std::fs::read_to_string(Path::new("/sys/block").join(ZRAM_DEVICE).join("initstate")).unwrap();
        assert_eq!(initstate.trim(), "0", "the guard reset the device");
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
