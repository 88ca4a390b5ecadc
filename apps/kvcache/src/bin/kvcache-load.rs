//! `kvcache-load`: a pipelined memcached load generator with YCSB's key distribution. Prints
//! one line of `key=value` results.

use std::time::Duration;

use clap::Parser;
use pagewise_kvcache::load::{self, Choice};

#[derive(Parser, Debug)]
#[command(name = "kvcache-load", about = "Pipelined memcached load (scrambled zipfian 0.99, YCSB keys)")]
struct Args {
    /// Server address.
    #[arg(long, default_value = "127.0.0.1:11211")]
    server: String,
    /// Records in the key space.
    #[arg(long, default_value_t = 800_000)]
    records: u64,
    /// Value bytes.
    #[arg(long, default_value_t = 512)]
    value_size: usize,
    /// Connections (one thread each).
    #[arg(long, default_value_t = 2)]
    conns: usize,
    /// Requests in flight per connection.
    #[arg(long, default_value_t = 32)]
    depth: usize,
    /// Store the records first.
    #[arg(long)]
    load: bool,
    /// Reads to issue (0: none).
    #[arg(long, default_value_t = 800_000)]
    ops: u64,
    /// Stop reading after this many seconds.
    #[arg(long, default_value_t = 600)]
    seconds: u64,
    /// Read uniformly from records [window_start, window_start + window) instead of zipfian.
    #[arg(long)]
    window: Option<u64>,
    #[arg(long, default_value_t = 0)]
    window_start: u64,
    /// Read uniformly from the records n with n % stride == phase instead of zipfian.
    #[arg(long)]
    stride: Option<u64>,
    #[arg(long, default_value_t = 0)]
    phase: u64,
    /// Check every value read.
    #[arg(long)]
    verify: bool,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn main() {
    let a = Args::parse();
    if a.conns == 0 || a.depth == 0 || a.records == 0 {
        eprintln!("kvcache-load: --conns, --depth and --records must be at least 1");
        std::process::exit(2);
    }
    if a.load {
        match load::load(&a.server, 0, a.records, a.value_size, a.conns, a.depth) {
            Ok(r) => {
                println!("phase=load ops={} secs={:.3} ops_per_sec={:.0} bad={}", r.ops, r.secs, r.ops_per_sec(), r.bad)
            }
            Err(e) => {
                eprintln!("kvcache-load: load {}: {e}", a.server);
                std::process::exit(1);
            }
        }
    }
    if a.ops > 0 {
        let choice = match (a.window, a.stride) {
            (Some(len), _) => Choice::Window { start: a.window_start, len },
            (None, Some(stride)) => Choice::Strided { stride, phase: a.phase },
            (None, None) => Choice::Zipfian,
        };
        let d = Duration::from_secs(a.seconds);
        match load::run(&a.server, a.records, choice, a.value_size, a.conns, a.depth, a.ops, d, a.verify, a.seed) {
            Ok(r) => println!(
                "phase=run ops={} secs={:.3} ops_per_sec={:.0} hits={} misses={} bad={}",
                r.ops,
                r.secs,
                r.ops_per_sec(),
                r.hits,
                r.misses,
                r.bad
            ),
            Err(e) => {
                eprintln!("kvcache-load: run {}: {e}", a.server);
                std::process::exit(1);
            }
        }
    }
}
