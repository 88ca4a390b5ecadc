//! `pagewise eval`: run the experiments that reproduce each paper's evaluation.

use std::path::PathBuf;
use std::process::ExitCode;

use pagewise_eval::{experiments, find, run_experiment, Mode};
use pagewise_kernel::features::{Capability, Feature};

/// The kernel capabilities each experiment uses (`pagewise doctor`); a test checks that every
/// experiment of `pagewise eval list` has exactly one entry here.
pub const FEATURES: &[Feature] = &[
    Feature { name: "pagewise eval thp-baseline", needs: &[Capability::ThpEnabled] },
    Feature {
        name: "pagewise eval hps-micro",
        needs: &[Capability::ThpEnabled, Capability::Userfaultfd, Capability::MadvCollapseShmem],
    },
    Feature { name: "pagewise eval hps-tracker-cost", needs: &[Capability::Userfaultfd, Capability::PagemapScan] },
    Feature { name: "pagewise eval dlm-fault", needs: &[Capability::Userfaultfd] },
    Feature { name: "pagewise eval dlm-pagesize", needs: &[Capability::Userfaultfd] },
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
    after_help = "Examples:\n  pagewise eval list\n  pagewise eval thp-baseline --quick\n  pagewise eval all --quick --out /tmp/results"
)]
pub struct Args {
    /// An experiment name, `list` to show them, or `all` to run every one.
    name: String,
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
        "all" => experiments(),
        name => match find(name) {
            Some(e) => vec![e],
            None => {
                let names: Vec<&str> = experiments().iter().map(|e| e.name()).collect();
                anyhow::bail!("no experiment named {name:?}; known: {}", names.join(", "));
            }
        },
    };
    let mut failed = Vec::new();
    for exp in selected {
        match run_experiment(exp, mode, &args.out, args.quiet) {
            Ok(markdown) => {
                println!("{markdown}");
                println!("(results in {})\n", args.out.join(exp.name()).display());
            }
            Err(e) => {
                eprintln!("pagewise: {e:#}");
                failed.push(exp.name());
            }
        }
    }
    if !failed.is_empty() {
        anyhow::bail!("experiments failed: {}", failed.join(", "));
    }
    Ok(ExitCode::SUCCESS)
}
