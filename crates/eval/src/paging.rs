//! Linux's own paging as a baseline: a program run in a memory cgroup whose limit is the local
//! memory under test, with swap on — swap on zram (the same RAM, compressed: what a one-host
//! user would pick) or a swap file on disk — only while it runs.
//!
//! Used by `dlm-vs-swap` and by any experiment that compares DLM with what Linux already does.
//! The pieces:
//! - [`zram_swap`] sets up `/dev/zram0` as swap through the settings guard
//!   ([`pagewise_kernel::swap::ZramSwap`]); [`pagewise_kernel::swap::SwapFile`] makes a swap
//!   file. Both are [`SwapSpace`]s, off until a run turns them on.
//! - [`run_limited_with_swap`] runs one command under the limit with the swap on, and reports
//!   how it ended, its major faults and, for zram, the RAM the compressed pool took at its peak
//!   (zram's pool is not charged to the cgroup: that memory comes on top of the limit, as a DLM
//!   server's memory comes on top of DLM's local memory).
//! - [`run_with_budget`] runs any command with a time budget in its own process group.
//!
//! # Why the group's statistics are refreshed during a run
//! At 10% local memory (4.6 MiB for 47 MiB of arrays in `dlm-vs-swap`) the group's OOM killer
//! killed about one run in three (7 of 23 in a shell reproduction of a swap run) with most of
//! the swap free. Traced (vmscan tracepoints, Linux 6.18): before each kill, 18 reclaim rounds
//! in a row freed 0 pages in 0.2 ms without scanning a page, and the group's memory.stat at the
//! kill read `inactive_anon 0`, `active_anon 5.0 MiB`. Reclaim evicts from the inactive list
//! only, and moves anonymous pages from the active list to it only when the group's statistics
//! say the inactive list is low or new refaults were seen (`inactive_is_low()`,
//! `prepare_scan_control()`, `shrink_lruvec()`, mm/vmscan.c). Those statistics are per-CPU
//! counters summed every 2 s (and by readers of memory.stat); reclaim does not sum them itself
//! unless that is late. In a 5 MiB group paging tens of thousands of pages a second, the real
//! inactive list empties while the summed counters, up to 2 s old, still say it is not low:
//! nothing is deactivated, the rounds free nothing, and try_charge_memcg() declares OOM after
//! MAX_RECLAIM_RETRIES. The traces show the active list aged only in bursts 2 s apart.
//! Swappiness 100 for the group and page-cluster 0 each left kills (1 in 8), as the mechanism
//! does not involve them. So during a run the group's memory.stat is read every [`TICK`]
//! ([`MemCgroup::refresh_stats`]), which sums the counters: reclaim then decides on sizes at
//! most 10 ms old. No run was killed since (0 of 26 in the shell reproduction, 0 of 9 in three
//! runs of `dlm-vs-swap`; a read every 50 or 200 ms also gave 0 of 8). This gives the group no
//! memory; a read costs about 0.1 ms of the caller's thread. Interleaved at 10%, reading every
//! 10 ms against every 200 ms changed the loop time by a median factor of 0.97 [0.71–1.09]
//! (6 pairs, loaded machine) and the major faults by +3%. Runs otherwise use the kernel's
//! defaults (swappiness 60, page-cluster read-ahead 8 pages).

use std::io::Read;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use pagewise_kernel::cgroup::MemCgroup;
use pagewise_kernel::swap::{SwapSpace, ZramSwap};
use pagewise_kernel::SettingsGuard;

/// How often [`run_with_budget`] checks on the child and calls its tick.
pub const TICK: Duration = Duration::from_millis(10);

/// The zram device the baseline uses.
pub const ZRAM_DEVICE: &str = "zram0";

/// The compression algorithm of the baseline when the device offers it: lz4, the default of
/// Debian's zram-tools (`zramswap`: `ALGO:=lz4`), fast to decompress. Otherwise the device's
/// own default (lzo-rle on Linux 6.18).
pub const ZRAM_ALGORITHM: &str = "lz4";

/// Set up [`ZRAM_DEVICE`] as swap for `bytes` of uncompressed pages (rounded up to whole
/// MiB), compressing with [`ZRAM_ALGORITHM`] where offered; recorded in `guard`, which swaps it
/// off and resets the device. Off until a run turns it on.
pub fn zram_swap(guard: &SettingsGuard, bytes: u64) -> anyhow::Result<ZramSwap> {
    let offered = ZramSwap::algorithms(ZRAM_DEVICE).with_context(|| format!("reading {ZRAM_DEVICE}'s algorithms"))?;
    let algorithm = offered.available.iter().any(|a| a == ZRAM_ALGORITHM).then_some(ZRAM_ALGORITHM);
    let bytes = bytes.div_ceil(1 << 20) << 20;
    ZramSwap::create(guard, ZRAM_DEVICE, bytes, algorithm)
        .with_context(|| format!("setting up {ZRAM_DEVICE} as swap ({} MiB)", bytes >> 20))
}

/// Spawn `cmd` in its own process group (so a stop reaches what it started, e.g. the servers
/// and the program under `pagewise run`), killed if this process dies; wait up to `budget`,
/// calling `tick` (if any) every [`TICK`] while the child runs (a failing tick stops the child
/// and is returned). Returns (stdout, stderr, exit status (None: stopped at the budget), wall
/// seconds).
pub fn run_with_budget(
    mut cmd: Command,
    budget: Duration,
    mut tick: Option<&mut dyn FnMut() -> anyhow::Result<()>>,
) -> anyhow::Result<(String, String, Option<ExitStatus>, f64)> {
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
        crate::programs::stop_group(pgid)?;
        child.wait()?;
    }
    let (stdout, stderr) = (out.join().unwrap_or_default(), err.join().unwrap_or_default());
    if let Some(e) = failed {
        return Err(e.context(format!("while running {cmd:?} (stopped)")));
    }
    Ok((stdout, stderr, status, wall))
}

/// How a run under a memory limit with swap went.
#[derive(Debug)]
pub struct LimitedRun {
    pub stdout: String,
    pub stderr: String,
    /// None: stopped at the time budget.
    pub status: Option<ExitStatus>,
    /// Process wall time, start-up included.
    pub wall_s: f64,
    /// The group's major faults during the run (v1 `total_pgmajfault`, v2 `pgmajfault`):
    /// pages read back from swap, and from files.
    pub major_faults: u64,
    /// The group's OOM killer killed a task during the run (reclaim could not keep it under
    /// its limit).
    pub oom_killed: bool,
    /// The most RAM the swap space itself took during the run (zram's compressed pool; None
    /// for a swap file).
    pub swap_ram_peak: Option<u64>,
}

impl LimitedRun {
    /// Ran to the end with exit status 0.
    pub fn succeeded(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
}

/// The group's major faults so far (v1 `total_pgmajfault`, v2 `pgmajfault`).
pub fn major_faults(cg: &MemCgroup) -> anyhow::Result<u64> {
    let stat = cg.stat()?;
    Ok(stat.get("total_pgmajfault").or_else(|| stat.get("pgmajfault")).copied().unwrap_or(0))
}

/// Run `cmd` in `group` with its memory limit set to `limit` bytes and `swap` on for this run
/// only (swapped off right after, so nothing else on the machine pages to it between runs),
/// within `budget`, refreshing the group's statistics every [`TICK`] (module doc). The group
/// keeps the limit afterwards.
pub fn run_limited_with_swap(
    cmd: Command,
    group: &MemCgroup,
    limit: u64,
    swap: &dyn SwapSpace,
    budget: Duration,
) -> anyhow::Result<LimitedRun> {
    let mut cmd = cmd;
    group.set_limit(Some(limit)).with_context(|| format!("limiting {} to {limit} bytes", group.path().display()))?;
    let faults_before = major_faults(group)?;
    let kills_before = group.oom_kills()?;
    swap.reset_ram_peak()?;
    swap.on().with_context(|| format!("turning on {}", swap.describe()))?;
    let ran = (|| {
        group.spawn_into(&mut cmd)?;
        let mut refresh = || group.refresh_stats().context("refreshing the group's statistics");
        run_with_budget(cmd, budget, Some(&mut refresh))
    })();
    // Off at once (the program's swap entries went with it).
    let off = swap.off().with_context(|| format!("turning off {}", swap.describe()));
    let (stdout, stderr, status, wall_s) = ran?;
    off?;
    Ok(LimitedRun {
        stdout,
        stderr,
        status,
        wall_s,
        major_faults: major_faults(group)?.saturating_sub(faults_before),
        oom_killed: group.oom_kills()? > kills_before,
        swap_ram_peak: swap.ram_peak()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::bail;

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

    /// A command over its budget is stopped, with what it started (its process group).
    #[test]
    fn a_command_over_its_budget_is_stopped_with_its_group() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "sleep 600 & echo started; wait"]);
        let t = Instant::now();
        let (out, _, status, _) = run_with_budget(cmd, Duration::from_millis(300), None).unwrap();
        assert!(status.is_none() && out.contains("started"), "{status:?} {out:?}");
        assert!(t.elapsed() < Duration::from_secs(30));
    }
}
