//! Running an experiment: mode, progress, interleaved repetitions, and the results directory.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use crate::report::{write_svg, Report};

/// How big a run is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Minutes on 2 cores; what `make eval` runs.
    Quick,
    /// The paper's sizes where the machine allows.
    Full,
}

impl Mode {
    /// Pick the quick or full value.
    pub fn pick<T>(self, quick: T, full: T) -> T {
        match self {
            Mode::Quick => quick,
            Mode::Full => full,
        }
    }
}

/// An experiment reproducing (part of) a paper's evaluation.
pub trait Experiment: Sync {
    /// `pagewise eval NAME`.
    fn name(&self) -> &'static str;
    /// One line: what it compares, against which baselines.
    fn description(&self) -> &'static str;
    /// Run it; every configuration side by side in this one run.
    fn run(&self, ctx: &mut Context) -> anyhow::Result<Report>;
    /// Whether it runs its memory servers on other hosts of a testbed under `--net PROFILE`
    /// (`Context::net`, crate::net::ServerHosts).
    fn runs_across_hosts(&self) -> bool {
        false
    }
}

/// What an experiment gets from the harness.
pub struct Context {
    pub mode: Mode,
    /// The experiment's results directory (already created).
    pub out_dir: PathBuf,
    /// `--net PROFILE`: the memory servers go on testbed hosts behind links of this profile.
    pub net: Option<&'static pagewise_kernel::testbed::NetProfile>,
    /// `--host-memory`: the state of the host's memory a measured run starts from
    /// ([`prepare_host_memory`]).
    pub host_memory: HostMemory,
    progress: ProgressBar,
}

/// The state of the host's memory a measured run of a program starts from, on a VM whose
/// balloon reports free pages ([`pagewise_kernel::page_reporting`]; elsewhere every page is
/// backed and the two are one). The programs' experiments (hps-programs, dlm-programs) time
/// allocating memory with the rest of the program, and the two states give different answers:
/// in hps-programs' quick runs THP `always` ran the JVM in 0.83× plain's time from backed
/// memory, and in 1.40× from memory taken back (GNU sort: 1.04×, 1.13×).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HostMemory {
    /// What the program allocates the host has taken back and must back again, a fault at a
    /// time: a program started on a VM that has been idle (the default).
    #[default]
    TakenBack,
    /// What the program allocates is backed: as on bare metal, or right after another
    /// program freed it.
    Backed,
}

impl HostMemory {
    pub fn name(self) -> &'static str {
        match self {
            HostMemory::TakenBack => "taken-back",
            HostMemory::Backed => "backed",
        }
    }
}

impl std::str::FromStr for HostMemory {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s {
            "taken-back" => Ok(HostMemory::TakenBack),
            "backed" => Ok(HostMemory::Backed),
            _ => anyhow::bail!("{s:?} is neither `taken-back` nor `backed`"),
        }
    }
}

impl Context {
    /// Set the total number of steps of the progress bar and a message.
    pub fn start_progress(&mut self, total: u64, message: impl Into<String>) {
        self.progress.set_length(total);
        self.progress.set_position(0);
        self.progress.set_message(message.into());
    }

    pub fn tick(&self) {
        self.progress.inc(1);
    }

    pub fn message(&self, message: impl Into<String>) {
        self.progress.set_message(message.into());
    }

    /// Print a line above the progress bar.
    pub fn log(&self, line: impl AsRef<str>) {
        self.progress.println(line.as_ref());
    }
}

/// Run `measure(config, rep)` for every configuration and repetition, interleaved so that
/// drift of the machine hits every configuration alike, and counterbalanced: repetition `r`
/// starts at configuration `r mod n` (A B C, B C A, C A B, …), so no configuration always
/// runs right after the same other one. What a run leaves behind — memory freed a moment ago
/// is still backed by the host, memory freed seconds ago is not ([`prepare_host_memory`]);
/// warm caches — otherwise favours one position in the order every time: on hps-programs'
/// numpy run, back-to-back runs alternated between 1.9 s and 2.5 s, and a fixed order turned
/// that into a 1.16× "difference" between two configurations that, settled, ran alike. The
/// first run of all is always `configs[0]` (experiments take their reference output from it).
/// Returns the results per configuration, in repetition order.
pub fn interleave<C, T>(
    ctx: &Context,
    configs: &[C],
    reps: usize,
    mut measure: impl FnMut(&C, usize) -> anyhow::Result<T>,
) -> anyhow::Result<Vec<Vec<T>>> {
    let mut out: Vec<Vec<T>> = configs.iter().map(|_| Vec::with_capacity(reps)).collect();
    for rep in 0..reps {
        for k in 0..configs.len() {
            let i = (rep + k) % configs.len();
            out[i].push(measure(&configs[i], rep)?);
            ctx.tick();
        }
    }
    Ok(out)
}

/// Wait until the host has taken back the memory earlier runs freed (free page reporting,
/// [`pagewise_kernel::page_reporting`]), so that the next run allocates from the same state
/// as every other: memory the host has to back again, as on a machine that has been idle.
fn settle_host_memory(ctx: &Context, reporting: &pagewise_kernel::page_reporting::PageReporting) {
    let s = pagewise_kernel::page_reporting::settle(Some(reporting), Default::default());
    if s.gave_up {
        ctx.log(format!("free page reporting still at work after {:.0} s; measuring anyway", s.waited.as_secs_f64()));
    }
}

/// Bring the host's memory to the state `--host-memory` asks for, before a measured run that
/// allocates about `bytes`: reporting idle, and for `backed`, `bytes` of free memory (at most
/// half of what is available) faulted in and freed
/// ([`pagewise_kernel::page_reporting::back_free_memory`]), where the run's allocations find it.
/// Returns at once where nothing reports free pages. An experiment whose runs allocate and
/// free a lot calls it before each measured run.
pub fn prepare_host_memory(ctx: &Context, bytes: u64) -> anyhow::Result<()> {
    let Some(reporting) = pagewise_kernel::page_reporting::probe() else {
        return Ok(());
    };
    settle_host_memory(ctx, &reporting);
    if ctx.host_memory == HostMemory::TakenBack {
        return Ok(());
    }
    let available = pagewise_kernel::procfs::read_meminfo()?.mem_available.unwrap_or(0);
    let bytes = bytes.min(available / 2);
    pagewise_kernel::page_reporting::back_free_memory(bytes as usize)
        .with_context(|| format!("backing {} of free memory", crate::human_bytes(bytes)))
}

/// Where servers and the client of an experiment run: different CPUs when there are two or
/// more, so that neither waits for the other's time slice.
#[derive(Clone, Copy, Debug)]
pub struct Placement {
    pub server: usize,
    pub client: usize,
}

/// The first online CPU for the client, the last for the servers; None on one CPU.
pub fn placement() -> Option<Placement> {
    let cpus = pagewise_kernel::cpu::online_cpus().ok()?;
    let (first, last) = (*cpus.first()?, *cpus.last()?);
    (first != last).then_some(Placement { server: last, client: first })
}

/// Pins the calling thread (and the threads it starts) to a CPU until dropped.
pub struct PinnedThread {
    previous: std::collections::BTreeSet<usize>,
}

impl PinnedThread {
    pub fn to(cpu: usize) -> anyhow::Result<Self> {
        let previous = pagewise_kernel::cpu::affinity(0)?;
        pagewise_kernel::cpu::pin_to(cpu)?;
        Ok(PinnedThread { previous })
    }
}

impl Drop for PinnedThread {
    fn drop(&mut self) {
        let _ = pagewise_kernel::cpu::set_affinity(&self.previous);
    }
}

/// Facts about the machine recorded with every result.
pub fn machine_facts() -> serde_json::Value {
    let caps = pagewise_kernel::probe::probe();
    json!({
        "kernel": caps.kernel_release,
        "cpus": pagewise_kernel::cpu::online_cpus().map(|c| c.len()).unwrap_or(0),
        "mem_total_bytes": pagewise_kernel::procfs::read_meminfo().map(|m| m.mem_total).unwrap_or(0),
        "thp_enabled": pagewise_kernel::thp::thp_mode().unwrap_or_default(),
        "free_page_reporting": pagewise_kernel::page_reporting::probe(),
        "commit": source_commit(),
    })
}

/// The commit of the source tree the run came from (`git describe --always --dirty` in the
/// working directory), when there is one: it tells a reader which code produced a figure.
fn source_commit() -> Option<String> {
    let out = std::process::Command::new("git").args(["describe", "--always", "--dirty"]).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Where the results of experiment `name` in `mode` go: `out_root/NAME` for quick mode,
/// `out_root/NAME-full` for full mode, so that `make eval` (quick) never overwrites the
/// results of a full run and both can be shown side by side.
pub fn result_dir(out_root: &Path, name: &str, mode: Mode) -> PathBuf {
    match mode {
        Mode::Quick => out_root.join(name),
        Mode::Full => out_root.join(format!("{name}-full")),
    }
}

/// Where a run with the memory servers behind a testbed profile's links writes: `net-PROFILE/`
/// inside [`result_dir`].
pub fn result_dir_on(
    out_root: &Path,
    name: &str,
    mode: Mode,
    net: Option<&'static pagewise_kernel::testbed::NetProfile>,
) -> PathBuf {
    let dir = result_dir(out_root, name, mode);
    match net {
        None => dir,
        Some(p) => dir.join(format!("net-{}", p.name)),
    }
}

/// Run one experiment and write `result_dir(out_root, NAME, mode)/{result.json, table.md,
/// plot.svg}`. Returns the Markdown it printed.
pub fn run_experiment(exp: &dyn Experiment, mode: Mode, out_root: &Path, quiet: bool) -> anyhow::Result<String> {
    run_experiment_on(exp, mode, None, HostMemory::default(), out_root, quiet)
}

/// [`run_experiment`], with the memory servers on testbed hosts behind links of `net`: the
/// results go to `out_root/NAME/net-PROFILE/`, keyed by profile.
pub fn run_experiment_on(
    exp: &dyn Experiment,
    mode: Mode,
    net: Option<&'static pagewise_kernel::testbed::NetProfile>,
    host_memory: HostMemory,
    out_root: &Path,
    quiet: bool,
) -> anyhow::Result<String> {
    if net.is_some() && !exp.runs_across_hosts() {
        anyhow::bail!("{} does not run across the testbed (--net)", exp.name());
    }
    let out_dir = result_dir_on(out_root, exp.name(), mode, net);
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let progress = if quiet { ProgressBar::hidden() } else { ProgressBar::new(0) };
    progress.set_style(
        ProgressStyle::with_template("{prefix:.bold} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}")
            .expect("static template")
            .progress_chars("=> "),
    );
    progress.set_prefix(exp.name());
    progress.enable_steady_tick(Duration::from_millis(250));
    let mut ctx = Context { mode, out_dir: out_dir.clone(), net, host_memory, progress };
    let started = Instant::now();
    let report = exp.run(&mut ctx).with_context(|| format!("experiment {} failed", exp.name()))?;
    ctx.progress.finish_and_clear();
    let elapsed = started.elapsed();

    let header = format!(
        "{}{}{} — mode {:?}, {:.1} s on {}",
        exp.description(),
        net.map(|p| format!(", network profile {}", p.name)).unwrap_or_default(),
        if host_memory == HostMemory::Backed {
            ", runs started from backed host memory (--host-memory backed)"
        } else {
            ""
        },
        mode,
        elapsed.as_secs_f64(),
        pagewise_kernel::probe::probe().kernel_release
    );
    let markdown = report.markdown(exp.name(), &header);
    let result = json!({
        "name": exp.name(),
        "description": exp.description(),
        "mode": mode,
        "net": net,
        "host_memory": host_memory.name(),
        "duration_s": elapsed.as_secs_f64(),
        "finished_at": crate::figures::utc_text(
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
        ),
        "machine": machine_facts(),
        "summary": report.summary,
        "tables": report.tables.iter().map(|(t, tab)| json!({"title": t, "table": tab})).collect::<Vec<_>>(),
        "plots": report.plots,
        "data": report.data,
        "notes": report.notes,
    });
    let write = |name: &str, text: &str| {
        let p = out_dir.join(name);
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))
    };
    write("result.json", &serde_json::to_string_pretty(&result)?)?;
    write("table.md", &markdown)?;
    write_svg(&out_dir.join("plot.svg"), &report.plots)?;
    Ok(markdown)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Plot, Summary, Table};

    /// A real, tiny experiment: copying 1 MiB vs 4 MiB, to check what the harness writes.
    struct CopyTiny;

    impl Experiment for CopyTiny {
        fn name(&self) -> &'static str {
            "copy-tiny"
        }
        fn description(&self) -> &'static str {
            "memcpy of 1 MiB vs 4 MiB"
        }
        fn run(&self, ctx: &mut Context) -> anyhow::Result<Report> {
            let sizes = [1usize << 20, 4 << 20];
            ctx.start_progress(6, "copy");
            let times = interleave(ctx, &sizes, 3, |&n, _| {
                let src = vec![1u8; n];
                let mut dst = vec![0u8; n];
                let t = Instant::now();
                dst.copy_from_slice(&src);
                std::hint::black_box(&dst);
                Ok(t.elapsed().as_secs_f64() * 1e6)
            })?;
            let mut report = Report::default();
            let mut table = Table::new(["size", "µs"]);
            let mut plot = Plot::new("copy", "MiB", "µs");
            let mut pts = Vec::new();
            for (i, &n) in sizes.iter().enumerate() {
                let s = Summary::of(&times[i]);
                table.row([format!("{}", n >> 20), s.display(1)]);
                pts.push(((n >> 20) as f64, s.median));
            }
            plot.series("memcpy", pts);
            report.figure("small_vs_large", Summary::of(&times[0]).median / Summary::of(&times[1]).median);
            report.table("", table);
            report.plots.push(plot);
            Ok(report)
        }
    }

    #[test]
    fn writes_result_json_table_and_svg() {
        let scratch = pagewise_kernel::private_dir::PrivateDir::new("harness-test").unwrap();
        let dir = scratch.path().to_path_buf();
        let md = run_experiment(&CopyTiny, Mode::Quick, &dir, true).unwrap();
        assert!(md.contains("| size |"));
        let out = dir.join("copy-tiny");
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("result.json")).unwrap()).unwrap();
        assert!(json["summary"]["small_vs_large"].as_f64().unwrap() > 0.0);
        assert_eq!(json["mode"], "quick");
        assert!(std::fs::read_to_string(out.join("table.md")).unwrap().contains("small_vs_large"));
        assert!(std::fs::read_to_string(out.join("plot.svg")).unwrap().contains("<svg"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn host_memory_states_parse_by_their_names() {
        for state in [HostMemory::TakenBack, HostMemory::Backed] {
            assert_eq!(state.name().parse::<HostMemory>().unwrap(), state);
        }
        assert_eq!(HostMemory::default(), HostMemory::TakenBack);
        let err = "warm".parse::<HostMemory>().unwrap_err().to_string();
        assert!(err.contains("taken-back") && err.contains("backed"), "{err}");
    }

    #[test]
    fn interleaves_configurations() {
        let scratch = pagewise_kernel::private_dir::PrivateDir::new("interleave-test").unwrap();
        let ctx = Context {
            mode: Mode::Quick,
            out_dir: scratch.path().to_path_buf(),
            net: None,
            host_memory: HostMemory::default(),
            progress: ProgressBar::hidden(),
        };
        let mut order = Vec::new();
        let out = interleave(&ctx, &['a', 'b'], 3, |c, rep| {
            order.push((*c, rep));
            Ok(rep)
        })
        .unwrap();
        assert_eq!(order, vec![('a', 0), ('b', 0), ('b', 1), ('a', 1), ('a', 2), ('b', 2)]);
        assert_eq!(out, vec![vec![0, 1, 2], vec![0, 1, 2]]);
        // Three configurations: each takes each place in the order once in three repetitions.
        let mut firsts = Vec::new();
        interleave(&ctx, &['a', 'b', 'c'], 3, |c, rep| {
            if firsts.len() == rep {
                firsts.push(*c);
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(firsts, vec!['a', 'b', 'c']);
    }
}
