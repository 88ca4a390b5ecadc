//! `pagewise eval`: run the experiments that reproduce each paper's evaluation.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use pagewise_eval::{experiments, find, run_experiment_on, Mode};
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
    Feature { name: "pagewise eval dlm-fault", needs: &[Capability::Userfaultfd] },
    Feature { name: "pagewise eval dlm-pagesize", needs: &[Capability::Userfaultfd] },
    Feature { name: "pagewise eval dlm-autotune", needs: &[Capability::Userfaultfd] },
    // Makes its own swap file (swapon(2), root): needs no swap configured, only the memory
    // cgroup its swap runs are limited in.
    Feature { name: "pagewise eval dlm-vs-swap", needs: &[Capability::Userfaultfd, Capability::CgroupV1Memory] },
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
/// run. Results go to DIR/NAME/: result.json (with a `summary` of named figures), table.md and
/// plot.svg; the table is printed.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  pagewise eval list\n  pagewise eval thp-baseline --quick\n  pagewise eval all --quick --out /tmp/results\n  pagewise eval report --readme README.md   # render results/*/result.json into the README"
)]
pub struct Args {
    /// An experiment name, `list` to show them, `all` to run every one, or `report` to render
    /// the results already written (DIR/*/result.json) as Markdown.
    name: String,
    /// With `report`: replace the generated part of this README (between its
    /// `pagewise eval report` markers) instead of printing.
    #[arg(long, value_name = "FILE")]
    readme: Option<PathBuf>,
    /// Small sizes that finish in minutes on 2 cores (the default).
    #[arg(long, conflicts_with = "full")]
    quick: bool,
    /// The paper's sizes where this machine allows.
    #[arg(long)]
    full: bool,
    /// Where to write results.
    #[arg(long, value_name = "DIR", default_value = "results")]
    out: PathBuf,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// Run the memory servers on hosts of a testbed behind links of this network profile
    /// (`pagewise testbed profiles`), one run per profile: PROFILE[,PROFILE…] or `all`.
    /// Results go to DIR/NAME/net-PROFILE/. For the experiments that place memory servers
    /// (dlm-fault, dlm-autotune); needs root.
    #[arg(long, value_name = "PROFILE")]
    net: Option<String>,
}

/// The profiles `--net` names (None: no testbed).
fn net_profiles(arg: Option<&str>) -> anyhow::Result<Vec<Option<&'static NetProfile>>> {
    let Some(arg) = arg else { return Ok(vec![None]) };
    if arg == "all" {
        return Ok(PROFILES.iter().map(Some).collect());
    }
    arg.split(',').map(|p| Ok(Some(profile(p.trim())?))).collect()
}

fn report(args: &Args) -> anyhow::Result<ExitCode> {
    let names: Vec<&str> = experiments().iter().map(|e| e.name()).collect();
    let section = pagewise_eval::readme::render_dir(&args.out, &names)?;
    match &args.readme {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            let spliced =
                pagewise_eval::readme::splice(&text, &section).with_context(|| format!("in {}", path.display()))?;
            std::fs::write(path, spliced).with_context(|| format!("writing {}", path.display()))?;
            println!("{}: figures from {} rendered", path.display(), args.out.display());
        }
        None => print!("{section}"),
    }
    Ok(ExitCode::SUCCESS)
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mode = if args.full { Mode::Full } else { Mode::Quick };
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
            let dir = match net {
                None => args.out.join(exp.name()),
                Some(p) => args.out.join(exp.name()).join(format!("net-{}", p.name)),
            };
            match run_experiment_on(exp, mode, net, &args.out, args.quiet) {
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
