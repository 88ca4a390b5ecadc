//! The unmodified path against the library path: bt_like.c under `pagewise run` against the
//! same source with its arrays from `dlm_alloc` (crates/eval/programs/bt_library.c, linked with
//! libpagewise), at the same fixed unit, local memory and number of servers (two, spawned by
//! `pagewise run` for one side and here for the other). The figure is the solver's own loop
//! time, so neither start-up nor the servers' start is in it. Every run must print the same
//! checksum.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, ensure, Context as _};
use pagewise_dlm::process::ServerProcess;
use serde_json::json;

use crate::experiments::dlm_vs_swap::parse_output;
use crate::programs::{self, DlmFlags, Job, Scratch, Wrap};
use crate::stats::Paired;
use crate::{human_bytes, Context, Mode, Report, Summary, Table};

const BT_LIKE: &str = include_str!("../../../programs/bt_like.c");
const BT_LIBRARY: &str = include_str!("../../../programs/bt_library.c");
/// bt_like's arrays.
const ARRAYS: u64 = 7;
/// Pairs per case. The difference sought is a few percent, where single runs on this VM kind
/// spread ±15%: with 6 pairs (the fewest whose median has a 95% interval,
/// `stats::median_ci95`) the interval was the pairs' whole range, 0.91–1.29 at 4 KiB; with 16
/// it runs from the 4th to the 13th. A pair takes 1–3 s.
const REPS: usize = 16;
/// (unit, percent of the arrays as local memory).
const CASES: [(u64, u64); 2] = [(4 << 10, 5), (128 << 10, 50)];
/// Progress steps: both sides of each case, each repetition.
pub(crate) const STEPS: usize = CASES.len() * 2 * REPS;

/// One unit size's loop times: (unit, percent, local bytes, under `pagewise run`, library).
type Case = (u64, u64, u64, Vec<f64>, Vec<f64>);

/// Loop times per case.
pub(crate) struct PathComparison {
    n: usize,
    cases: Vec<Case>,
}

impl PathComparison {
    pub(crate) fn json(&self) -> serde_json::Value {
        json!({"grid_n": self.n, "cases": self.cases.iter().map(|(unit, pct, local, run, lib)| json!({
            "unit": unit, "percent": pct, "local_bytes": local, "run_loop_s": run, "library_loop_s": lib,
        })).collect::<Vec<_>>()})
    }
}

fn compile(dir: &Path, pagewise: &Path) -> anyhow::Result<(PathBuf, PathBuf)> {
    std::fs::write(dir.join("bt_like.c"), BT_LIKE)?;
    std::fs::write(dir.join("bt_library.c"), BT_LIBRARY)?;
    let libdir = pagewise.parent().context("the pagewise binary has no directory")?;
    ensure!(libdir.join("libpagewise.so").is_file(), "no libpagewise.so next to {}", pagewise.display());
    let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../include");
    let cc = |out: &str, src: &str, lib: bool| -> anyhow::Result<PathBuf> {
        let mut cmd = Command::new("cc");
        cmd.args(["-O2", "-o", out, src]).current_dir(dir);
        if lib {
            cmd.arg("-I")
                .arg(&include)
                .arg("-L")
                .arg(libdir)
                .arg(format!("-Wl,-rpath,{}", libdir.display()))
                .arg("-lpagewise");
        }
        let o = cmd.output().context("running cc")?;
        ensure!(o.status.success(), "cc {src} failed:\n{}", String::from_utf8_lossy(&o.stderr));
        Ok(dir.join(out))
    };
    Ok((cc("bt_like", "bt_like.c", false)?, cc("bt_library", "bt_library.c", true)?))
}

/// (base page, sets) as `pagewise run --page-size` makes them (crates/cli/src/run.rs).
fn unit_layout(unit: u64) -> (u64, u64) {
    let base = unit.min(16 << 10);
    (base, unit / base)
}

pub(crate) fn compare(ctx: &Context, pagewise: &Path, mode: Mode) -> anyhow::Result<PathComparison> {
    let n: usize = mode.pick(64, 96);
    let iterations = mode.pick(3, 6).to_string();
    let scratch = Scratch::new("dlm-programs-library")?;
    let (plain_bin, lib_bin) = compile(scratch.path(), pagewise)?;
    let arrays = (n * n * n * 8) as u64 * ARRAYS;
    let budget = Duration::from_secs(mode.pick(120, 900));
    // The library build's servers take a secret of this comparison, handed to the program in
    // its environment (never argv); `pagewise run` makes its own.
    let secret = pagewise_dlm::auth::Secret::generate()?;
    let servers = [ServerProcess::spawn(pagewise, "8G", &secret)?, ServerProcess::spawn(pagewise, "8G", &secret)?];
    let addrs: Vec<String> = servers.iter().map(|s| s.addr.clone()).collect();
    let mut reference: Option<String> = None;
    let mut out = PathComparison { n, cases: Vec::new() };
    for &(unit, pct) in &CASES {
        let local = ((arrays * pct / 100) >> 20 << 20).max(2 * unit).max(1 << 20);
        let (mut run_s, mut lib_s) = (Vec::new(), Vec::new());
        for rep in 0..REPS {
            for library in [false, true] {
                ctx.message(format!(
                    "bt_like {} at {pct}%: {} #{rep}",
                    human_bytes(unit),
                    if library { "library" } else { "pagewise run" }
                ));
                let job = Job {
                    name: "bt_like".into(),
                    argv: vec![
                        if library { &lib_bin } else { &plain_bin }.display().to_string(),
                        n.to_string(),
                        iterations.clone(),
                    ],
                    env: Vec::new(),
                    cwd: scratch.path().to_path_buf(),
                    canon: programs::Canon::Stdout,
                };
                let cmd = if library {
                    let (base, sets) = unit_layout(unit);
                    let mut c = job.command(pagewise, &Wrap::Plain);
                    c.env("PAGEWISE_DLM_SERVERS", addrs.join(","))
                        .env(pagewise_dlm::auth::SECRET_ENV, secret.as_env_value())
                        .env("PAGEWISE_DLM_LOCAL_MEM", local.to_string())
                        .env("PAGEWISE_DLM_PAGE_SIZE", base.to_string())
                        .env("PAGEWISE_DLM_MAX_SET", sets.to_string())
                        .env("PAGEWISE_DLM_SET_COUNT", sets.to_string())
                        .env("PAGEWISE_DLM_AUTO_TUNE", "0");
                    c
                } else {
                    let flags = DlmFlags {
                        page_size: Some(unit),
                        max_page_size: unit,
                        local_mem: local,
                        servers: 2,
                        min_alloc: 1 << 20,
                        decisions: None,
                    };
                    job.command(pagewise, &Wrap::Dlm(flags))
                };
                let o = programs::run(cmd, budget, None)?;
                let side = if library { "the library build" } else { "pagewise run" };
                match o.status {
                    None => bail!("bt_like, {side}, {} at {pct}%: over the {budget:?} budget", human_bytes(unit)),
                    Some(st) if !st.success() => bail!("bt_like, {side}: {st}\n{}", programs::tail(&o.stderr, 20)),
                    _ => {}
                }
                let parsed = parse_output(&o.stdout.head)?;
                match &reference {
                    None => reference = Some(parsed.checksum.clone()),
                    Some(x) => {
                        ensure!(*x == parsed.checksum, "bt_like, {side}: checksum {} differs from {x}", parsed.checksum)
                    }
                }
                if library { &mut lib_s } else { &mut run_s }.push(parsed.loop_secs);
                ctx.tick();
            }
        }
        out.cases.push((unit, pct, local, run_s, lib_s));
    }
    for s in servers {
        let _ = s.stop();
    }
    Ok(out)
}

pub(crate) fn add_to(report: &mut Report, c: &PathComparison) {
    let mut t = Table::new(["unit", "local", "pagewise run s", "library s", "run / library, paired [95%]"]);
    for (unit, pct, local, run, lib) in &c.cases {
        let paired = Paired::of(run, lib, |s| *s);
        t.row([
            human_bytes(*unit),
            format!("{pct}% ({})", human_bytes(*local)),
            Summary::of(run).display(3),
            Summary::of(lib).display(3),
            paired.display(3),
        ]);
        paired.report(report, &format!("run_vs_library_time_{}k", unit >> 10));
    }
    report.table(
        format!(
            "The unmodified path against the library path: bt_like ({}³ grid, 7 arrays) under `pagewise run` vs the same source calling dlm_alloc; loop seconds, median [min–max] of {REPS} interleaved pairs; the ratio is the median of the pairs' ratios with its 95% interval",
            c.n
        ),
        t,
    );
    report.note("Target (issue 22): `pagewise run` within 1.1× of the library path at 4 KiB and 128 KiB units (`run_vs_library_time_4k`, `_128k`).");
}
