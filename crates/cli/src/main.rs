//! `pagewise`: user-space memory management for stock Linux.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod dlm_server;
mod doctor;
mod elf;
mod eval;
mod features;
mod foreground;
mod generate;
mod hps;
mod mpi;
mod others;
mod reclaim;
mod run;
mod testbed;

/// Pagewise: five research memory-management systems on the kernel you already run.
///
/// Start with `pagewise doctor` to see what this kernel offers each system.
#[derive(Parser)]
#[command(name = "pagewise", version, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Doctor(doctor::Args),
    DlmServer(dlm_server::Args),
    Eval(eval::Args),
    Hps(hps::Args),
    Mpi(mpi::Args),
    Reclaimd(reclaim::DaemonArgs),
    Reclaim(reclaim::Args),
    Run(run::Args),
    Testbed(testbed::Args),
    #[command(hide = true)]
    Generate(generate::Args),
}

fn main() -> ExitCode {
    // A dlm-fault measurement in a process of its own, started before any thread exists.
    if let Some(code) = pagewise_eval::experiments::dlm_fault::child_job_if_asked() {
        return code;
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Doctor(a) => doctor::run(a),
        Command::DlmServer(a) => dlm_server::run(a),
        Command::Eval(a) => eval::run(a),
        Command::Hps(a) => hps::run(a),
        Command::Mpi(a) => mpi::run(a),
        Command::Reclaimd(a) => reclaim::run_daemon(a),
        Command::Reclaim(a) => reclaim::run(a),
        Command::Run(a) => run::run(a),
        Command::Testbed(a) => testbed::run(a),
        Command::Generate(a) => generate::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("pagewise: error: {e:#}");
            ExitCode::from(1)
        }
    }
}
