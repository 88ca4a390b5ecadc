//! `pagewise hps`: inspect HPS in a running process.
//!
//! `report --pid PID` prints the seed's `/proc/PID/page_acs` layout: each VMA's maps line, then
//! `start-end : 0xCOUNT` runs of per-page access counts. The counts live in the tracked
//! process (its tracker is a thread there), which publishes them every 500 ms to
//! `/run/pagewise/hps/PID.acs` (HpsConfig::publish, on by default); this command joins that
//! file with the live /proc/PID/maps.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Subcommand;
use pagewise_track::report;

/// HPS: hot pages get hugepages, cold pages don't.
#[derive(clap::Args)]
#[command(after_help = "Example:\n  pagewise hps report --pid 1234")]
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
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    match args.command {
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
