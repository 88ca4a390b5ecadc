//! `pagewise dlm-server`: a DLM memory server (crates/dlm/PROTOCOL.md).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context as _;
use pagewise_dlm::auth::{Secret, SECRET_ENV};
use pagewise_dlm::server::{Server, ServerConfig};

/// Serve DLM pages: hold the master copy of the pages homed here, for the clients that know
/// the shared secret.
///
/// The secret comes from --secret-file or the PAGEWISE_DLM_SECRET environment variable (never
/// from the command line, which every user of the host can read). Listens on loopback unless
/// told otherwise. Stops cleanly on SIGTERM/SIGINT, printing its statistics (one JSON object
/// on stdout with --json). Logs to stderr; the first line names the address it listens on.
#[derive(clap::Args)]
#[command(after_help = "Example (a server other hosts can reach, on this host's address 10.0.0.5):\n  \
    umask 077; head -c 32 /dev/urandom | base64 > ~/.pagewise-dlm-secret\n  \
    pagewise dlm-server --listen 10.0.0.5:7001 --secret-file ~/.pagewise-dlm-secret --capacity 8G --json\n\
    Clients get the same secret in PAGEWISE_DLM_SECRET.")]
pub struct Args {
    /// ADDR:PORT to listen on (port 0 picks a free port). The default accepts clients of this
    /// host only.
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:7001")]
    listen: String,
    /// Most bytes of client pages to hold (K/M/G suffixes).
    #[arg(long, value_name = "SIZE")]
    capacity: String,
    /// A file holding the shared secret clients must prove (at least 16 bytes; readable by its
    /// owner only). Without it, the secret is taken from PAGEWISE_DLM_SECRET.
    #[arg(long, value_name = "FILE")]
    secret_file: Option<PathBuf>,
    /// Print statistics as JSON on stdout at exit.
    #[arg(long)]
    json: bool,
    /// Log each client connecting and leaving.
    #[arg(long, short)]
    verbose: bool,
    /// Most clients at once; more are refused.
    #[arg(long, default_value_t = 256)]
    max_clients: usize,
    /// End a client's connection, freeing its pages, once the client's host has not answered
    /// for this many seconds (TCP keepalive; at least 3; 0: 60). A live client keeps its pages
    /// however long it goes without a request.
    #[arg(long, default_value_t = 0)]
    idle_timeout: u64,
    /// After each answer, watch the client's connection this many microseconds for its next
    /// request before sleeping (0: sleep at once). A program paging at full speed asks again
    /// within tens of microseconds; a sleeping server thread costs it a wake-up each time.
    #[arg(long, value_name = "MICROSECONDS", default_value_t = 50)]
    spin_us: u64,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let capacity = pagewise_dlm::parse_size(&a.capacity)? as u64;
    if a.max_clients == 0 {
        anyhow::bail!("--max-clients must be at least 1");
    }
    let secret = match &a.secret_file {
        Some(path) => Secret::from_file(path)?,
        None => Secret::from_env()?.with_context(|| {
            format!(
                "dlm-server needs a shared secret: --secret-file FILE or {SECRET_ENV} \
                 (make one: umask 077; head -c 32 /dev/urandom | base64 > FILE)"
            )
        })?,
    };
    let cfg = ServerConfig {
        verbose: a.verbose,
        max_clients: a.max_clients,
        dead_peer_timeout: (a.idle_timeout > 0).then(|| std::time::Duration::from_secs(a.idle_timeout.max(3))),
        spin: std::time::Duration::from_micros(a.spin_us),
        ..ServerConfig::new(a.listen.clone(), capacity, secret)
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
        "dlm-server: stopped after {} requests ({} errors, {} failed handshakes), {} bytes in, {} bytes out",
        stats.requests, stats.errors, stats.auth_failures, stats.bytes_in, stats.bytes_out
    );
    Ok(ExitCode::SUCCESS)
}
