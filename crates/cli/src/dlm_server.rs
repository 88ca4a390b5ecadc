//! `pagewise dlm-server`: a DLM memory server (crates/dlm/PROTOCOL.md).

use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context as _;
use pagewise_dlm::server::{Server, ServerConfig};

/// Serve DLM pages: hold the master copy of the pages homed here, for any number of clients.
///
/// Stops cleanly on SIGTERM/SIGINT, printing its statistics (one JSON object on stdout with
/// --json). Logs to stderr; the first line names the address it listens on.
#[derive(clap::Args)]
#[command(after_help = "Example:\n  pagewise dlm-server --listen 0.0.0.0:7001 --capacity 8G --json")]
pub struct Args {
    /// ADDR:PORT to listen on (port 0 picks a free port).
    #[arg(long, value_name = "ADDR:PORT")]
    listen: String,
    /// Most bytes of client pages to hold (K/M/G suffixes).
    #[arg(long, value_name = "SIZE")]
    capacity: String,
    /// Print statistics as JSON on stdout at exit.
    #[arg(long)]
    json: bool,
    /// Log each client connecting and leaving.
    #[arg(long, short)]
    verbose: bool,
    /// Most clients at once; more are refused.
    #[arg(long, default_value_t = 256)]
    max_clients: usize,
    /// End a client's connection, freeing its pages, after this many seconds without a
    /// request (0: never).
    #[arg(long, default_value_t = 0)]
    idle_timeout: u64,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let capacity = pagewise_dlm::parse_size(&a.capacity)? as u64;
    if a.max_clients == 0 {
        anyhow::bail!("--max-clients must be at least 1");
    }
    let cfg = ServerConfig {
        verbose: a.verbose,
        max_clients: a.max_clients,
        idle_timeout: (a.idle_timeout > 0).then(|| std::time::Duration::from_secs(a.idle_timeout)),
        ..ServerConfig::new(a.listen.clone(), capacity)
    };
    let server = Server::bind(&cfg).with_context(|| format!("listening on {}", a.listen))?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, Arc::clone(&stop)).context("installing the SIGTERM handler")?;
    }
    eprintln!("dlm-server: listening on {} (capacity {} bytes)", server.local_addr()?, capacity);
    let stats = server.run(&stop)?;
    if a.json {
        println!("{}", serde_json::to_string(&stats)?);
    }
    eprintln!(
        "dlm-server: stopped after {} requests ({} errors), {} bytes in, {} bytes out",
        stats.requests, stats.errors, stats.bytes_in, stats.bytes_out
    );
    Ok(ExitCode::SUCCESS)
}
