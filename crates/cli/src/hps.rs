//! `pagewise hps`: inspect HPS in a running process.
//!
//! `report --pid PID` prints the seed's `/proc/PID/page_acs` layout: each VMA's maps line, then
//! `start-end : 0xCOUNT` runs of per-page access counts. The counts live in the tracked
//! process (its tracker is a thread there), which publishes them every 500 ms to
//! `/run/pagewise/hps/PID.acs` (HpsConfig::publish, on by default); this command joins that
//! file with the live /proc/PID/maps.
//!
//! `run -- PROG ARGS…` runs an unmodified program with HPS underneath, promote-only: the
//! LD_PRELOAD shim (`preload/`, its HPS arena) puts allocations of at least --min-alloc bytes
//! into tracked memfd arenas, and 2 MiB regions found hot are collapsed into hugepages
//! (MADV_COLLAPSE). The program's other memory stays in libc. At the end the shim prints how
//! many allocations it routed and how many regions were promoted.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Subcommand;
use pagewise_track::report;

/// HPS: hot pages get hugepages, cold pages don't.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  pagewise hps report --pid 1234\n  pagewise hps run --min-alloc 1M -- memcached -m 1024 -p 11211"
)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Per-page access counts of a process using HPS, in the seed's page_acs layout.
    Report {
        /// The process (it must use HPS with publishing on).
        #[arg(long)]
        pid: i32,
        /// Print only runs with a non-zero count.
        #[arg(long)]
        active_only: bool,
    },
    /// Run an unmodified program with HPS (promote-only) on its large allocations.
    Run {
        /// Allocations of at least this many bytes go to HPS-tracked memory; smaller ones stay
        /// in libc. Each routed allocation takes whole 2 MiB regions of address space.
        #[arg(long, default_value = "1M")]
        min_alloc: String,
        /// Promote a 2 MiB region when at least this fraction of its observed pages is hot.
        #[arg(long, default_value_t = 0.25)]
        promote_fraction: f64,
        /// Promote a region only once the program's data fills at least this fraction of its
        /// pages. A collapse gives the region every page it lacks, zeroed: memory the program
        /// never asked for, which is THP's bloat (THP always fills from the first touch). 1,
        /// the default: only full regions, so HPS adds no memory; a region still filling (the
        /// end of a growing heap) is promoted once full.
        #[arg(long, value_name = "FRACTION", default_value_t = 1.0)]
        min_filled: f64,
        /// Most CPU time promotion may take, as a share of the program's run so far: a
        /// collapse costs 0.6–5 ms here, and a program that ends soon after gets nothing back
        /// for it. 1 promotes as soon as a region is found hot (after the ramp). Tracking (the
        /// faults of observed pages) is held to the same share, separately. See docs/hps.md.
        #[arg(long, value_name = "SHARE", default_value_t = 0.2)]
        pace: f64,
        /// Seconds over which that share grows from none, as the program runs: with the
        /// defaults, a program that ends after 1 s has given promotion at most 1% of a CPU
        /// (and the collapse then running), and tracking as much. 0: the whole share from the
        /// start. A program that listens for connections (a server) gets the whole share from
        /// its first listen(2) on, whatever its age.
        #[arg(long, value_name = "SECONDS", default_value_t = 10.0)]
        pace_ramp: f64,
        /// Tracking period while there is work, in milliseconds.
        #[arg(long, default_value_t = 20)]
        interval_ms: u32,
        /// Let the program's thread and the tracker's fault handler run where the scheduler puts
        /// them. By default, while the program has one thread, the handler pins that thread and
        /// itself to one CPU, and gives the masks back when the program starts more threads: each
        /// tracking fault's two wake-ups then stay on one CPU.
        #[arg(long)]
        no_colocate: bool,
        /// Hugepages at first touch ahead of a dense fill (memory the program writes front to
        /// back, 2 MiB after 2 MiB): such a region gets its hugepage when the program first
        /// touches it, instead of 4 KiB pages collapsed later. `auto` gives them while a
        /// hugepage costs less than the 4 KiB pages it replaces (measured on the fill's first
        /// region: on a VM whose host takes free memory back it often does not), `always`
        /// whatever they cost, `never` (the default) not at all: a region the program fills
        /// sparsely still gets a whole hugepage, as a server's slabs do. A region that got small
        /// pages after all is tracked and collapsed if hot. Needs a tmpfs of HPS's own (root);
        /// without one HPS goes without. See docs/hps.md.
        #[arg(long, value_name = "WHEN", default_value = "never", value_parser = ["auto", "always", "never"])]
        first_touch: String,
        /// The same as `--first-touch never`.
        #[arg(long, conflicts_with = "first_touch")]
        no_first_touch: bool,
        /// What a child made by fork(2) without exec gets of the program's routed memory: `copy`,
        /// its own copy as fork gives (the forking thread waits while every routed byte is copied
        /// to the child: a fork + exec of a process with 200 MiB routed takes 0.15–0.25 s here
        /// against 8 ms plain), or `none`: nothing, and fork returns at once — for programs that
        /// fork only to exec; a child that reads its parent's routed memory then faults (SIGSEGV),
        /// its allocator's own fork handler too when the allocator keeps its state there (jemalloc in
        /// a program with threads: rustc).
        #[arg(long, value_name = "WHAT", default_value = "copy", value_parser = ["copy", "none"])]
        on_fork: String,
        /// Also track memory the program places itself: a reservation it commits (a JVM's
        /// heap), a MAP_FIXED mapping, a mapping at its hint, each an arena exactly where it
        /// is. Off by default: a JVM (768 MiB heap, serial GC) ran 1.06–1.08× slower with its
        /// heap tracked and promoted, and 1.35× slower under THP always — hugepages did not pay
        /// for it here. See docs/hps.md.
        #[arg(long)]
        track_placed: bool,
        /// How long routed memory stays the program's own private memory before it moves into
        /// tracked memory, a 2 MiB region at a time as the pace allows (a copy of what the
        /// program wrote, off its thread): a program that ends sooner never pays for tracked
        /// memory, whose first touch and release cost more than private memory's (GNU sort of
        /// 64 MiB ran 1.07–1.14× plain for that alone). `off`: tracked memory from the start. A
        /// program that listens for connections gets tracked memory at once from then on.
        /// See docs/hps.md.
        #[arg(long, value_name = "SECONDS", default_value = "1")]
        late_routing: String,
        /// The program and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        program: Vec<String>,
    },
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    match args.command {
        Command::Run {
            min_alloc,
            promote_fraction,
            min_filled,
            pace,
            pace_ramp,
            interval_ms,
            no_colocate,
            first_touch,
            no_first_touch,
            on_fork,
            track_placed,
            late_routing,
            program,
        } => {
            let first_touch = if no_first_touch { "never".to_string() } else { first_touch };
            let late_routing = parse_late_routing(&late_routing)?;
            let placement = Placement { colocate: !no_colocate, first_touch, on_fork, track_placed, late_routing };
            let rule = (promote_fraction, min_filled);
            run_program(&min_alloc, rule, (pace, pace_ramp), interval_ms, placement, &program)
        }
        Command::Report { pid, active_only } => {
            anyhow::ensure!(pid > 0, "--pid must be a positive process id");
            anyhow::ensure!(pagewise_kernel::signal::process_alive(pid), "process {pid} does not exist");
            let path = report::published_path(pid);
            let text = std::fs::read_to_string(&path).with_context(|| {
                format!(
                    "reading {}: process {pid} publishes no HPS counts (does it use HPS with publish on?)",
                    path.display()
                )
            })?;
            let mut ranges = report::decode(&text)?;
            // The tracking state (a comment line of the published file) goes to stderr, so
            // stdout stays the seed's page_acs layout.
            if let Some(state) =
                text.lines().take_while(|l| l.starts_with('#')).find_map(|l| l.strip_prefix("# tracking "))
            {
                eprintln!("pagewise: hps: process {pid}: tracking {state}");
            }
            if active_only {
                for r in &mut ranges {
                    r.runs.retain(|run| run.2 > 0);
                }
            }
            let maps = pagewise_kernel::error::read_file(format!("/proc/{pid}/maps"))?;
            print!("{}", report::render(&maps, &ranges));
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Where `pagewise hps run` puts things: the handler beside the program (`--no-colocate`),
/// hugepages at first touch ahead of dense fills (`--first-touch`: auto, always, never), a
/// forked child's copy of the routed memory (`--on-fork`: copy, none), memory the program
/// places itself (`--track-placed`).
struct Placement {
    colocate: bool,
    first_touch: String,
    /// What a forked child gets (`--on-fork`: copy, none).
    on_fork: String,
    track_placed: bool,
    /// `--late-routing` in seconds; None: off.
    late_routing: Option<f64>,
}

/// `--late-routing`: seconds, or `off`.
fn parse_late_routing(s: &str) -> anyhow::Result<Option<f64>> {
    if s == "off" {
        return Ok(None);
    }
    let secs: f64 = s.parse().map_err(|_| anyhow::anyhow!("--late-routing {s:?} is neither seconds nor `off`"))?;
    anyhow::ensure!((0.0..=86_400.0).contains(&secs), "--late-routing {s} must be 0 to 86400 seconds, or `off`");
    Ok(Some(secs))
}

/// `pagewise hps run`: the program under the shim with the HPS arena.
fn run_program(
    min_alloc: &str,
    (promote_fraction, min_filled): (f64, f64),
    (pace, pace_ramp): (f64, f64),
    interval_ms: u32,
    placement: Placement,
    program: &[String],
) -> anyhow::Result<ExitCode> {
    let min = pagewise_dlm::parse_size(min_alloc)?;
    anyhow::ensure!(min >= 4096, "--min-alloc {min_alloc} is below one page (4K)");
    anyhow::ensure!(
        promote_fraction > 0.0 && promote_fraction <= 1.0,
        "--promote-fraction {promote_fraction} must be in (0, 1]"
    );
    anyhow::ensure!((0.0..=1.0).contains(&min_filled), "--min-filled {min_filled} must be in [0, 1]");
    anyhow::ensure!(interval_ms > 0, "--interval-ms must be positive");
    anyhow::ensure!(pace > 0.0 && pace <= 1.0, "--pace {pace} must be in (0, 1]");
    anyhow::ensure!((0.0..=86_400.0).contains(&pace_ramp), "--pace-ramp {pace_ramp} must be 0 to 86400 seconds");
    crate::elf::ensure_preloadable(&program[0])?;
    // Tracking faults are served the same way (the kernel reading a tracked page of a buffer).
    crate::run::ensure_kernel_faults_served()?;
    let lib = crate::run::libpagewise()?;
    let shim = crate::run::EmbeddedFile::write(crate::run::SHIM, "libpagewise_preload.so")?;
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(v) if !v.is_empty() => format!("{}:{v}", shim.path.display()),
        _ => shim.path.display().to_string(),
    };
    let mut cmd = std::process::Command::new(&program[0]);
    // What a process the pinned program starts gets back (`pagewise_kernel::colocate`).
    if let Some((key, cpus)) = pagewise_kernel::colocate::program_cpus_env() {
        cmd.env(key, cpus);
    }
    cmd.args(&program[1..])
        .env("LD_PRELOAD", preload)
        .env("PAGEWISE_PRELOAD_ARENA", "hps")
        .env("PAGEWISE_PRELOAD_LIB", &lib)
        .env("PAGEWISE_PRELOAD_MIN_ALLOC", min.to_string())
        .env("PAGEWISE_PRELOAD_FORK", &placement.on_fork)
        .env("PAGEWISE_PRELOAD_REPORT", "program")
        .env("PAGEWISE_PRELOAD_EXITED", shim.exit_marker())
        .env("PAGEWISE_PRELOAD_OTHERS", shim.others_dir()?)
        .env("PAGEWISE_HPS_PROMOTE_FRACTION", promote_fraction.to_string())
        .env("PAGEWISE_HPS_MIN_FILLED", min_filled.to_string())
        .env("PAGEWISE_HPS_INTERVAL_MS", interval_ms.to_string())
        .env("PAGEWISE_HPS_PACE", pace.to_string())
        .env("PAGEWISE_HPS_PACE_RAMP_S", pace_ramp.to_string())
        .env("PAGEWISE_HPS_LOG", "1")
        .env("PAGEWISE_HPS_COLOCATE", if placement.colocate { "1" } else { "0" })
        .env("PAGEWISE_HPS_FIRST_TOUCH", &placement.first_touch)
        .env("PAGEWISE_HPS_TRACK_PLACED", if placement.track_placed { "1" } else { "0" })
        .env("PAGEWISE_HPS_LATE_ROUTING_S", placement.late_routing.map_or("off".to_string(), |s| s.to_string()));
    let (child, foreground) = crate::foreground::spawn(&mut cmd, &program[0])?;
    let pid = child.id() as i32;
    let status = crate::foreground::wait(child, foreground, &program[0])?;
    // A program killed before its tracker stopped leaves its published counts behind.
    report::unpublish(pid);
    shim.tell_if_exit_handlers_skipped(status, "pagewise hps run", &program[0]);
    shim.tell_what_others_did();
    Ok(crate::foreground::exit_code(status, "pagewise hps run", &program[0]))
}
