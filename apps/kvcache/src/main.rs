//! `pagewise-kvcache`: the server binary. Flags follow memcached where the meaning is the same.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use pagewise_hugepage::HpsConfig;
use pagewise_kernel::cpu;
use pagewise_kvcache::cache::{Backing, Cache, CacheConfig};
use pagewise_kvcache::hpsrun::{self, ControlConfig, HpsControl};
use pagewise_kvcache::idle;
use pagewise_kvcache::server::{Server, Settings, Shared};

#[derive(Parser, Debug)]
#[command(name = "pagewise-kvcache", version, about = "A memcached-protocol cache with HPS hugepage placement")]
struct Args {
    /// Item memory in megabytes (memcached -m).
    #[arg(short = 'm', long = "memory-limit", default_value_t = 64)]
    memory: usize,
    /// TCP port (memcached -p; 0 picks a free port, printed on stdout).
    #[arg(short = 'p', long = "port", default_value_t = 11211)]
    port: u16,
    /// Interface to listen on (memcached -l).
    #[arg(short = 'l', long = "listen", default_value = "127.0.0.1")]
    listen: String,
    /// Worker threads (memcached -t).
    #[arg(short = 't', long = "threads", default_value_t = 4)]
    threads: usize,
    /// Microseconds an idle worker may poll for requests before it sleeps: the most its
    /// adaptive window grows to, used when the server is confined to some of the CPUs
    /// (taskset, a cpuset); unconfined, or 0, workers sleep at once, as memcached's.
    #[arg(long = "poll-us", default_value_t = pagewise_kvcache::idle::DEFAULT_MAX_US)]
    poll_us: u64,
    /// Maximum simultaneous connections (memcached -c).
    #[arg(short = 'c', long = "conn-limit", default_value_t = 1024)]
    conns: usize,
    /// Verbosity (memcached -v; accepted, the server logs errors only).
    #[arg(short = 'v', action = clap::ArgAction::Count)]
    verbose: u8,
    /// Slab memory: default (4 KiB pages), thp (MADV_HUGEPAGE on all of it) or hps.
    #[arg(long = "memory-mode", default_value = "default")]
    mode: Backing,
    /// Preallocate the whole slab area on hugepages at start (memcached -L): implies
    /// `--memory-mode thp`.
    #[arg(short = 'L', long = "enable-largepages")]
    largepages: bool,
    /// HPS: a page is active once seen in this many tracking periods.
    #[arg(long = "hps-threshold", default_value_t = 1)]
    hps_threshold: u32,
    /// HPS: an item read within this many ms counts as hot (moved to / kept on hugepages).
    #[arg(long = "hot-window-ms", default_value_t = 2000)]
    hot_window_ms: u32,
    /// HPS: quiet decision steps (100 ms each) before tracking stops.
    #[arg(long = "converge-ticks", default_value_t = 30)]
    converge_ticks: u32,
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(args) {
        eprintln!("pagewise-kvcache: {e:#}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    if args.memory == 0 || args.threads == 0 || args.conns == 0 {
        anyhow::bail!("-m, -t and -c must be at least 1");
    }
    if args.largepages && args.mode == Backing::Hps {
        anyhow::bail!("-L (the whole cache preallocated on hugepages) and --memory-mode hps exclude each other");
    }
    let mode = if args.largepages { Backing::Thp } else { args.mode };
    let hps = match mode {
        Backing::Hps => {
            Some(hpsrun::start_hps(HpsConfig { active_threshold: args.hps_threshold, ..Default::default() })?)
        }
        _ => None,
    };
    let cfg = CacheConfig {
        limit: args.memory << 20,
        backing: mode,
        hot_window_ds: (args.hot_window_ms / 100).max(1),
        prealloc: args.largepages,
    };
    let cache = Arc::new(Mutex::new(Cache::new(cfg, hps.clone())?));
    let control = match hps {
        Some(h) => Some(HpsControl::attach(
            h,
            &cache,
            ControlConfig { converge_ticks: args.converge_ticks, ..Default::default() },
        )?),
        None => None,
    };
    // Polling spends the core it runs on: only where the server was given cores.
    let poll = match (cpu::affinity(0), cpu::online_cpus()) {
        (Ok(allowed), Ok(online)) => idle::max_window(Duration::from_micros(args.poll_us), &allowed, &online),
        _ => Duration::ZERO,
    };
    let shared = Arc::new(Shared {
        cache,
        settings: Settings { port: args.port, listen: args.listen, threads: args.threads, max_conns: args.conns, poll },
        stats: Default::default(),
        curr_conns: Default::default(),
        total_conns: Default::default(),
        rejected_conns: Default::default(),
        stop: Default::default(),
        verbosity: (args.verbose as u32).into(),
        hps: control.clone(),
    });
    let stop = shared.clone();
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])?;
    std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            stop.stop.store(true, Ordering::Release);
        }
    });
    let server = Server::start(shared)?;
    println!("listening on {}", server.addr);
    server.wait();
    if let Some(c) = control {
        c.stop();
    }
    Ok(())
}
