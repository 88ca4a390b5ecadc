//! `pagewise eval`: run the experiments that reproduce each paper's evaluation.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use pagewise_eval::{experiments, figures, find, run_experiment_on, Mode};
use pagewise_kernel::features::{Capability, Feature};
use pagewise_kernel::testbed::{profile, NetProfile, PROFILES};

/// The kernel capabilities each experiment uses (`pagewise doctor`); a test checks that every
/// experiment of `pagewise eval list` has exactly one entry here.
pub const FEATURES: &[Feature] = &[
    Feature { name: "pagewise eval thp-baseline", needs: &[Capability::ThpEnabled] },
    Feature {
        name: "pagewise eval hps-micro",
        needs: &[Capability::ThpEnabled, Capability::Userfaultfd, Capability::MadvCollapseShmem],
    },
    Feature { name: "pagewise eval hps-tracker-cost", needs: &[Capability::Userfaultfd, Capability::PagemapScan] },
    Feature {
        name: "pagewise eval hps-kvcache",
        needs: &[Capability::ThpEnabled, Capability::Userfaultfd, Capability::MadvCollapseShmem],
    },
    // Sets THP to `always` for some runs (guarded); `pagewise hps run` tracks and collapses.
    // Brings the host's memory to one state before each batch run (harness::prepare_host_memory).
    Feature {
        name: "pagewise eval hps-programs",
        needs: &[
            Capability::ThpEnabled,
            Capability::Userfaultfd,
            Capability::MadvCollapseShmem,
            Capability::FreePageReporting,
        ],
    },
    Feature { name: "pagewise eval dlm-fault", needs: &[Capability::Userfaultfd] },
    Feature { name: "pagewise eval dlm-pagesize", needs: &[Capability::Userfaultfd] },
    Feature { name: "pagewise eval dlm-autotune", needs: &[Capability::Userfaultfd] },
    // Makes its own swap file and sets up /dev/zram0 as swap (swapon(2), root): needs no swap
    // configured, only the memory cgroup its swap runs are limited in.
    Feature { name: "pagewise eval dlm-vs-swap", needs: &[Capability::Userfaultfd, Capability::CgroupV1Memory] },
    // zram swap and its own swap file (swapon(2), root), in a memory cgroup.
    Feature { name: "pagewise eval dlm-programs", needs: &[Capability::Userfaultfd, Capability::CgroupV1Memory] },
    // Memory servers killed with SIGKILL; userfaultfd under `pagewise run`.
    Feature { name: "pagewise eval dlm-failover", needs: &[Capability::Userfaultfd] },
    Feature { name: "pagewise eval spark-hugepages", needs: &[Capability::ThpEnabled, Capability::MadvCollapse] },
    Feature {
        name: "pagewise eval reclaim-percore",
        needs: &[
            Capability::CgroupV1Memory,
            Capability::TracefsVmscan,
            Capability::Psi,
            Capability::OnlineCpus,
            Capability::MlockLimitKb,
            Capability::Swap,
        ],
    },
    Feature {
        name: "pagewise eval reclaim-split",
        needs: &[Capability::CgroupV1Memory, Capability::TracefsVmscan, Capability::Swap],
    },
];

/// Run experiments comparing Pagewise with the baselines its papers used, side by side in one
/// run. Results go to DIR/NAME/ (quick mode) or DIR/NAME-full/ (full mode): result.json (with a
/// `summary` of named figures), table.md and plot.svg; the table is printed.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  pagewise eval list
  pagewise eval thp-baseline --quick
  pagewise eval all --quick --out /tmp/results
  pagewise eval report                                 # the figures document on stdout
  pagewise eval report --figures docs/FIGURES.md --html   # and results/report.html, plots inline")]
pub struct Args {
    /// An experiment name, `list` to show them, `all` to run every one, or `report` to render
    /// the results already written (DIR/NAME/ and DIR/NAME-full/) as the figures document:
    /// the headlines with their goals first, then every experiment.
    name: String,
    /// With `report`: write the Markdown to FILE (docs/FIGURES.md) instead of printing it.
    #[arg(long, value_name = "FILE")]
    figures: Option<PathBuf>,
    /// With `report`: also write the same as one self-contained HTML page with the plots inline
    /// (default FILE: DIR/report.html).
    #[arg(long, value_name = "FILE", num_args = 0..=1)]
    html: Option<Option<PathBuf>>,
    /// Small sizes that finish in minutes on 2 cores (the default).
    #[arg(long, conflicts_with = "full")]
    quick: bool,
    /// The paper's sizes where this machine allows.
    #[arg(long)]
    full: bool,
    /// Where to write results (and, with `report`, where to read them).
    #[arg(long, value_name = "DIR", default_value = "results")]
    out: PathBuf,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// Run the memory servers on hosts of a testbed behind links of this network profile
    /// (`pagewise testbed profiles`), one run per profile: PROFILE[,PROFILE…] or `all`.
    /// Results go to DIR/NAME/net-PROFILE/. For the experiments that place memory servers
    /// (dlm-fault, dlm-autotune, dlm-programs, dlm-failover); needs root.
    #[arg(long, value_name = "PROFILE")]
    net: Option<String>,
    /// For the experiments that time third-party programs (hps-programs, dlm-programs): the
    /// state of the host's memory each measured run starts from, on a VM whose balloon reports
    /// free pages. `taken-back`: the host must back what the program allocates again, a fault
    /// at a time, as on a VM that has been idle. `backed`: backed already, as on bare metal
    /// (the harness faults in and frees the program's footprint before each run). Elsewhere
    /// the two are one.
    #[arg(long, value_name = "STATE", default_value = "taken-back")]
    host_memory: pagewise_eval::HostMemory,
}

/// The profiles `--net` names (None: no testbed).
fn net_profiles(arg: Option<&str>) -> anyhow::Result<Vec<Option<&'static NetProfile>>> {
    let Some(arg) = arg else { return Ok(vec![None]) };
    if arg == "all" {
        return Ok(PROFILES.iter().map(Some).collect());
    }
    arg.split(',').map(|p| Ok(Some(profile(p.trim())?))).collect()
}

fn write(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

fn report(args: &Args) -> anyhow::Result<ExitCode> {
    let names: Vec<&str> = experiments().iter().map(|e| e.name()).collect();
    let mut results = figures::Results::load(&args.out, &names)?;
    // The figures document keeps what it showed beside it, and takes from there what this
    // machine has not run.
    let archive = args.figures.as_deref().map(figures::archive_beside);
    let kept = match &archive {
        Some(a) => results.fill_from(a, &names)?,
        None => 0,
    };
    let doc = figures::document(&results, &names, |n| find(n).is_some());
    match (&args.figures, &archive) {
        (Some(path), Some(archive)) => {
            write(path, &doc.markdown())?;
            results.keep(archive)?;
            println!(
                "{}: figures from {} rendered ({kept} result(s) from {}, where all of them are kept now)",
                path.display(),
                args.out.display(),
                archive.display()
            );
        }
        (None, _) if args.html.is_none() => print!("{}", doc.markdown()),
        _ => {}
    }
    if let Some(path) = &args.html {
        let path = path.clone().unwrap_or_else(|| args.out.join("report.html"));
        write(&path, &doc.html())?;
        println!("{}: figures from {} rendered with their plots", path.display(), args.out.display());
    }
    Ok(ExitCode::SUCCESS)
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mode = if args.full { Mode::Full } else { Mode::Quick };
    if args.name != "report" && (args.figures.is_some() || args.html.is_some()) {
        anyhow::bail!("--figures and --html go with `pagewise eval report`");
    }
    let selected = match args.name.as_str() {
        "list" => {
            for e in experiments() {
                println!("{:<24} {}", e.name(), e.description());
            }
            return Ok(ExitCode::SUCCESS);
        }
        "report" => return report(&args),
        "all" if args.net.is_some() => experiments().into_iter().filter(|e| e.runs_across_hosts()).collect(),
        "all" => experiments(),
        name => match find(name) {
            Some(e) => vec![e],
            None => {
                let names: Vec<&str> = experiments().iter().map(|e| e.name()).collect();
                anyhow::bail!("no experiment named {name:?}; known: {}", names.join(", "));
            }
        },
    };
    let nets = net_profiles(args.net.as_deref())?;
    if nets[0].is_some() {
        if let Some(e) = selected.iter().find(|e| !e.runs_across_hosts()) {
            let able: Vec<&str> = experiments().iter().filter(|e| e.runs_across_hosts()).map(|e| e.name()).collect();
            anyhow::bail!("{} does not run across the testbed (--net); these do: {}", e.name(), able.join(", "));
        }
    }
    let mut failed = Vec::new();
    for exp in selected {
        for &net in &nets {
            let dir = pagewise_eval::harness::result_dir_on(&args.out, exp.name(), mode, net);
            match run_experiment_on(exp, mode, net, args.host_memory, &args.out, args.quiet) {
                Ok(markdown) => {
                    println!("{markdown}");
                    println!("(results in {})\n", dir.display());
                }
                Err(e) => {
                    eprintln!("pagewise: {e:#}");
                    failed.push(net.map_or(exp.name().to_string(), |p| format!("{} --net {}", exp.name(), p.name)));
                }
            }
        }
    }
    if !failed.is_empty() {
        anyhow::bail!("experiments failed: {}", failed.join(", "));
    }
    Ok(ExitCode::SUCCESS)
}
