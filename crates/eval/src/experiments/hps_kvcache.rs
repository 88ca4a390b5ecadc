//! HPS in a real cache (seed 000, section 6.4): memcached-protocol servers under a YCSB-like
//! read-only zipfian load (512 B values), throughput and memory, for pagewise-kvcache Default /
//! THP / HPS and real memcached default and `-L` as peers, all started as real processes and
//! measured in one run with the repetitions interleaved. Then kvcache against memcached as the
//! clients people use see them ([`clients`]): YCSB's own client on workloads C and B (the
//! headline), memcslap, and the project's generator waiting for each reply, on a fresh pair
//! sized to hold all those clients store ([`clients::waiting_memory_mb`]). Last, a drifting
//! hot set on kvcache with HPS: after three hot sets, how large is the hot arena against one
//! hot set?
//!
//! Load of the first part: the built-in pipelined generator ([`pagewise_kvcache::load`]): YCSB's
//! key names and ScrambledZipfianGenerator (0.99), two connections with 64 gets in flight
//! each, every value checked, the same number of reads on every server. Deep pipelining is
//! where kvcache's reply batching pays most (memcached 1.6 sends about one `sendmsg` per two
//! replies there), so the kvcache/memcached ratio of this load is reported as such
//! (`kvcache_vs_memcached_pipelined_*`) and never as what a client that waits for each reply
//! gets (`kvcache_vs_memcached_{reqresp,ycsb_c,ycsb_b,memcslap}_*`). Placement: every server
//! runs on the last CPU with one worker thread, the clients on the first, so the ratios compare
//! the servers, not the scheduler's mixing of client and server on shared cores (runs of
//! 200,000 reads on shared cores spread 0.68–1.23 around their median ratio). The server's
//! core is not always the one that sets the pace: wall-clock throughput below the CPU-second
//! figure shows the server waiting on the client's core.
//!
//! Throughput is gets per second of the server process's own CPU time (its per-process CPU
//! clock, which leaves out time the hypervisor stole), and per wall-clock second as the `_wall`
//! keys. A second THP server, identical to the first, shows how far a paired ratio strays by
//! chance. In three quick runs of 7 pairs THP / THP again was 1.031, 1.011 and 0.899 per
//! CPU-second (per-pair spreads 0.94–1.16, 0.91–1.17, 0.81–1.06) and 1.098, 0.903 and 0.840
//! per wall-clock second (0.87–2.58, 0.83–1.50, 0.71–0.99), and in one of 21 shorter pairs
//! 1.028 (0.84–1.18) and 1.073 (0.85–1.83): wall-clock throughput also follows how fast the
//! host runs the load generator's core from one second to the next. So the CPU-second ratios
//! are the headline of the HPS comparisons, every ratio comes with its spread and the 95%
//! interval of its median (order statistics, no assumption on the distribution:
//! [`median_ci95`]), and a quick run resolves a few percent at best, not the 1% of the paper's
//! 99.4%.
//!
//! Memory: one definition for every server, [`pagewise_kvcache::memory`]: RSS, with every
//! memfd counted by the pages it holds. RSS alone misses the pages of HPS's tracked arena
//! whose mappings the tracker dropped, in kvcache as in memcached under `pagewise hps run`.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pagewise_kernel::procfs::{read_cpu_steal, Pid};
use pagewise_kvcache::load::{self, Choice};
use serde_json::json;

use crate::harness::{placement, PinnedThread};
use crate::report::{Plot, Report, Table};
use crate::stats::{median_ci95, Summary};
use crate::{Context, Experiment};

mod clients;
mod drift;

pub struct HpsKvcache;

const VALUE: usize = 512;
const MEM_MB: usize = 1024;
/// Load generator connections (one thread each) and gets in flight on each.
const CONNS: usize = 2;
const DEPTH: usize = 64;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Config {
    Default,
    Thp,
    /// A second, identical THP server: THP / THP again is the noise floor of a paired ratio.
    ThpAgain,
    /// The whole cache preallocated on hugepages (`-L`, as memcached's): the paper's THP
    /// memory point. Measured for memory only.
    ThpL,
    Hps,
    Memcached,
    MemcachedL,
    /// memcached under `pagewise hps run` (promote-only HPS through the LD_PRELOAD shim).
    MemcachedHps,
}

impl Config {
    fn name(self) -> &'static str {
        match self {
            Config::Default => "kvcache Default",
            Config::Thp => "kvcache THP",
            Config::ThpAgain => "kvcache THP (again)",
            Config::ThpL => "kvcache THP -L",
            Config::Hps => "kvcache HPS",
            Config::Memcached => "memcached",
            Config::MemcachedL => "memcached -L",
            Config::MemcachedHps => "memcached, pagewise hps run",
        }
    }
    fn is_kvcache(self) -> bool {
        matches!(self, Config::Default | Config::Thp | Config::ThpAgain | Config::ThpL | Config::Hps)
    }
}

struct Running {
    child: Child,
    addr: String,
    config: Config,
    /// The server process: the child, or memcached under the `pagewise hps run` child.
    server_pid: i32,
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.server_pid != self.child.id() as i32 {
            // `pagewise hps run` reaps memcached and exits; killed below if it does not.
            let _ = pagewise_kernel::net::kill(self.server_pid, libc::SIGKILL);
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(5) && matches!(self.child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sibling_binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let p = exe.parent().map(|d| d.join(name)).unwrap_or_default();
    if p.exists() {
        Ok(p)
    } else {
        anyhow::bail!("{} not found: build it with `cargo build --release -p pagewise-kvcache`", p.display())
    }
}

fn find_in_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| PathBuf::from(d).join(name)).find(|p| p.exists())
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn wait_ready(addr: &str) -> anyhow::Result<()> {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10) {
        if TcpStream::connect(addr).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    anyhow::bail!("server at {addr} did not come up")
}

/// Start `config`'s server with a memory limit of `mem_mb` MiB.
fn start(config: Config, mem_mb: usize, extra: &[&str]) -> anyhow::Result<Running> {
    let port = free_port()?;
    let addr = format!("127.0.0.1:{port}");
    let m = mem_mb.to_string();
    let p = port.to_string();
    let place = placement();
    // One worker thread on one core; two when the server shares the cores with the generator.
    let threads = if place.is_some() { "1" } else { "2" };
    let mut cmd = if config.is_kvcache() {
        let mut c = Command::new(sibling_binary("pagewise-kvcache")?);
        let mode = match config {
            Config::Thp | Config::ThpAgain | Config::ThpL => "thp",
            Config::Hps => "hps",
            _ => "default",
        };
        c.args(["-m", &m, "-p", &p, "-l", "127.0.0.1", "-t", threads, "--memory-mode", mode]);
        if config == Config::ThpL {
            c.arg("-L");
        }
        c
    } else {
        let bin = find_in_path("memcached").ok_or_else(|| anyhow::anyhow!("memcached not installed"))?;
        let mut c = if config == Config::MemcachedHps {
            let mut c = Command::new(sibling_binary("pagewise")?);
            c.args(["hps", "run", "--min-alloc", "1M", "--"]).arg(bin);
            c
        } else {
            Command::new(bin)
        };
        c.args(["-m", &m, "-p", &p, "-l", "127.0.0.1", "-U", "0", "-t", threads, "-u", "root"]);
        if config == Config::MemcachedL {
            c.arg("-L");
        }
        c
    };
    cmd.args(extra).stdout(Stdio::null()).stderr(Stdio::null());
    if let Some(place) = place {
        let cpu = place.server;
        // SAFETY: pin_before_exec is async-signal-safe (one syscall, no allocation).
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || pagewise_kernel::cpu::pin_before_exec(cpu))
        };
    }
    let child = cmd.spawn().map_err(|e| anyhow::anyhow!("starting {}: {e}", config.name()))?;
    let server_pid = child.id() as i32;
    let mut r = Running { child, addr, config, server_pid };
    wait_ready(&r.addr)?;
    if config == Config::MemcachedHps {
        let id = r.child.id();
        let children = pagewise_kernel::error::read_file(format!("/proc/{id}/task/{id}/children"))?;
        r.server_pid = children
            .split_whitespace()
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("pagewise hps run (pid {id}) has no memcached child"))?;
    }
    Ok(r)
}

fn stat(addr: &str, name: &str) -> anyhow::Result<u64> {
    let s = load::stats(addr)?;
    s.into_iter()
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| v.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("{addr}: no numeric stat {name}"))
}

/// Memory of the server process, bytes: the same definition for every server
/// ([`pagewise_kvcache::memory`]), which kvcache's own `memory_bytes` stat uses too.
fn memory(r: &Running) -> anyhow::Result<u64> {
    pagewise_kvcache::memory::process_memory_bytes(Pid::Id(r.server_pid))
        .map_err(|e| anyhow::anyhow!("memory of {} (pid {}): {e:#}", r.config.name(), r.server_pid))
}

/// Whether HPS's tracking has stopped (placement converged): kvcache's `tracking` stat, or for
/// memcached under `pagewise hps run` the state its tracker publishes for `pagewise hps report`.
fn converged(r: &Running) -> anyhow::Result<bool> {
    if r.config.is_kvcache() {
        return Ok(stat(&r.addr, "tracking")? == 0);
    }
    let path = pagewise_track::report::published_path(r.server_pid);
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    Ok(text.lines().take_while(|l| l.starts_with('#')).any(|l| l == "# tracking converged"))
}

fn median(v: &[f64]) -> f64 {
    Summary::of(v).median
}

impl Experiment for HpsKvcache {
    fn name(&self) -> &'static str {
        "hps-kvcache"
    }

    fn description(&self) -> &'static str {
        "HPS in a memcached-protocol cache under YCSB zipfian reads: kvcache Default / THP / HPS vs memcached and memcached -L; drifting hot set"
    }

    fn run(&self, ctx: &mut Context) -> anyhow::Result<Report> {
        let records: u64 = ctx.mode.pick(400_000, 800_000);
        // The same reads on every server (memcached pipelined is about five times slower per
        // run than kvcache, so its runs take longer). Quick: many short pairs rather than a few
        // long ones: the median of a paired ratio narrows with the number of pairs, and two
        // identical servers' 7-pair medians strayed by up to 10%. Its 95% interval is reported.
        let reads: u64 = ctx.mode.pick(200_000, 2_000_000);
        let reps: usize = ctx.mode.pick(25, 10);
        // The clients that wait for each reply (YCSB: records, operations per run, threads).
        let ycsb = clients::Ycsb::find();
        let memcslap_bin = find_in_path("memcslap");
        let waiting = clients::Waiting {
            // 12 rounds: 24 pooled YCSB pairs (workloads C and B) for the headline's interval.
            rounds: ctx.mode.pick(12, 21),
            records,
            gets: ctx.mode.pick(40_000, 200_000),
            conns: 4,
            ycsb: ycsb.as_ref().ok().map(|y| (y, ctx.mode.pick(50_000, 200_000), ctx.mode.pick(20_000, 100_000), 4)),
            memcslap: memcslap_bin.as_deref().map(|b| (b, 2, ctx.mode.pick(10_000, 50_000))),
        };
        let waiting_mem = clients::waiting_memory_mb(&waiting);
        let place = placement();
        let _pinned = place.map(|p| PinnedThread::to(p.client)).transpose()?;
        // A timed run of zipfian gets (every value checked when `verify`).
        let read_zipfian = |addr: &str, ops: u64, verify: bool, seed: u64| {
            load::run(addr, records, Choice::Zipfian, VALUE, CONNS, DEPTH, ops, Duration::from_secs(120), verify, seed)
        };
        let have_memcached = find_in_path("memcached").is_some();
        let mut configs = vec![Config::Default, Config::Thp, Config::Hps, Config::ThpAgain];
        if have_memcached {
            configs.extend([Config::Memcached, Config::MemcachedL, Config::MemcachedHps]);
        }
        let peer_ticks = if have_memcached { clients::waiting_ticks(&waiting) } else { 0 };
        ctx.start_progress((configs.len() * (reps + 2) + peer_ticks) as u64 + 4, "loading");
        let t0 = Instant::now();
        // The paper's THP memory point: the whole cache on hugepages from the start (memcached
        // -L does the same; kvcache's own THP mode only advises its slab area, which is filled
        // densely in order, so it adds little). Memory only, measured alone before the others.
        let thp_l_mem = {
            let r = start(Config::ThpL, MEM_MB, &[])?;
            let l = load::load(&r.addr, 0, records, VALUE, 2, 64)?;
            anyhow::ensure!(l.bad == 0, "{}: {} stores not STORED", Config::ThpL.name(), l.bad);
            read_zipfian(&r.addr, reads, false, 99)?;
            let m = memory(&r)? as f64;
            ctx.tick();
            m
        };
        let mut servers = Vec::new();
        let mut mem_series: Vec<Vec<(f64, f64)>> = vec![Vec::new(); configs.len()];
        let mut base_mem = Vec::new();
        for (i, &c) in configs.iter().enumerate() {
            let r = start(c, MEM_MB, &[])?;
            base_mem.push(memory(&r)? as f64);
            let l = load::load(&r.addr, 0, records, VALUE, 2, 64)?;
            anyhow::ensure!(l.bad == 0, "{}: {} stores not STORED", c.name(), l.bad);
            mem_series[i].push((t0.elapsed().as_secs_f64(), memory(&r)? as f64 / (1 << 20) as f64));
            ctx.tick();
            servers.push(r);
        }
        // Warm-up: one untimed read run each; HPS additionally until its placement converged
        // (tracking off), as the paper measured HPS after its promotions.
        let mut hps_warm_runs = 0;
        // Per HPS server: seconds of extra warm-up and whether its tracking had stopped.
        let mut warm: Vec<(Config, f64, bool)> = Vec::new();
        let warm_limit = Duration::from_secs(ctx.mode.pick(45, 90));
        for (i, r) in servers.iter().enumerate() {
            ctx.message(format!("warming {}", r.config.name()));
            read_zipfian(&r.addr, reads, false, 99)?;
            if matches!(r.config, Config::Hps | Config::MemcachedHps) {
                let t = Instant::now();
                while !converged(r)? && t.elapsed() < warm_limit {
                    read_zipfian(&r.addr, reads / 4, false, 98)?;
                    hps_warm_runs += 1;
                }
                warm.push((r.config, t.elapsed().as_secs_f64(), converged(r)?));
            }
            mem_series[i].push((t0.elapsed().as_secs_f64(), memory(r)? as f64 / (1 << 20) as f64));
            ctx.tick();
        }
        ctx.message("measuring (pipelined)");
        let mut runs: Vec<Vec<clients::Run>> = vec![Vec::new(); configs.len()];
        // The share of each run the hypervisor stole from the server's CPU.
        let mut steal: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
        let mut mem: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
        let server_cpu = place.map_or(0, |p| p.server);
        for rep in 0..reps {
            // A B C … then … C B A: no configuration always runs right after the same one.
            let order: Vec<usize> =
                if rep % 2 == 0 { (0..servers.len()).collect() } else { (0..servers.len()).rev().collect() };
            for i in order {
                let r = &servers[i];
                let steal0 = read_cpu_steal(server_cpu)?;
                let mut res = Default::default();
                let run = clients::measured(r.server_pid, || {
                    res = read_zipfian(&r.addr, reads, true, rep as u64)?;
                    Ok((res.ops as f64, res.secs))
                })?;
                let steal1 = read_cpu_steal(server_cpu)?;
                anyhow::ensure!(
                    res.bad == 0 && res.misses == 0,
                    "{}: {} wrong values, {} misses",
                    r.config.name(),
                    res.bad,
                    res.misses
                );
                runs[i].push(run);
                steal[i].push((steal1 - steal0).as_secs_f64() / res.secs.max(1e-9));
                let m = memory(r)? as f64;
                mem[i].push(m);
                mem_series[i].push((t0.elapsed().as_secs_f64(), m / (1 << 20) as f64));
                ctx.tick();
            }
        }
        let tput: Vec<Vec<f64>> = runs.iter().map(|v| v.iter().map(clients::Run::throughput).collect()).collect();
        let per_core: Vec<Vec<f64>> =
            runs.iter().map(|v| v.iter().map(clients::Run::per_server_cpu).collect()).collect();
        let hps_stats: Vec<(String, String)> = servers
            .iter()
            .find(|r| r.config == Config::Hps)
            .map(|r| load::stats(&r.addr))
            .transpose()?
            .unwrap_or_default();
        let idx = |c: Config| configs.iter().position(|&x| x == c);

        // kvcache against memcached: the pipelined load above, then the clients that wait for
        // each reply on a fresh pair of servers (no other server's threads on their core).
        let mut peers: Vec<clients::Paired> = Vec::new();
        // How long kvcache's idle workers poll before they sleep (`stats settings`).
        let mut kv_poll_us = None;
        if let (Some(kv), Some(mc)) = (idx(Config::Default), idx(Config::Memcached)) {
            let mut pipelined = clients::Paired::new(
                "pipelined",
                format!("project generator, {CONNS} connections × {DEPTH} gets in flight, every value checked"),
            );
            pipelined.kv = runs[kv].clone();
            pipelined.mc = runs[mc].clone();
            peers.push(pipelined);
        }
        drop(servers);
        if have_memcached {
            ctx.message("clients that wait for each reply");
            let (kv, mc) = (start(Config::Default, waiting_mem, &[])?, start(Config::Memcached, waiting_mem, &[])?);
            kv_poll_us = load::settings(&kv.addr)?
                .into_iter()
                .find(|(k, _)| k == "poll_us")
                .and_then(|(_, v)| v.parse::<u64>().ok());
            peers.extend(clients::waiting(ctx, &kv, &mc, &waiting)?);
        }

        // Drift: three hot sets in turn, each one record in 64 (sparse: compacted, not promoted).
        ctx.message("drifting hot set");
        let drift = drift::drift_phase()?;
        ctx.tick();

        // Paired ratios per repetition (the configurations of a repetition ran back to back),
        // of gets per second of the server's CPU time (the headline) or per wall-clock second.
        let paired = |series: &[Vec<f64>], a: Config, b: Config| -> Option<Vec<f64>> {
            let (a, b) = (idx(a)?, idx(b)?);
            Some((0..reps).map(|k| series[a][k] / series[b][k]).collect())
        };
        let paired_all = |series: &[Vec<f64>], a: Config, b: Config| paired(series, a, b).map(|r| Summary::of(&r));
        let paired_ci = |series: &[Vec<f64>], a: Config, b: Config| paired(series, a, b).and_then(|r| median_ci95(&r));
        let med_mem = |c: Config| idx(c).map(|i| median(&mem[i]));
        let (d, t, h) = (
            med_mem(Config::Default).unwrap_or(0.0),
            med_mem(Config::Thp).unwrap_or(0.0),
            med_mem(Config::Hps).unwrap_or(0.0),
        );
        let thp_inc = t - d;
        let thp_l_inc = thp_l_mem - d;
        let hps_inc = h - d;
        // The paper's definition (spec §6.4): memory increase over the 4 KiB configuration, HPS's
        // against THP's, where THP had the whole cache on hugepages from the start (+96.2%):
        // here kvcache -L. Against kvcache's THP mode (MADV_HUGEPAGE on a densely filled slab
        // area, which bloats by little more than a partly filled last hugepage) the ratio is
        // reported too.
        let rss_inc_ratio = if thp_l_inc > 0.0 { hps_inc.max(0.0) / thp_l_inc } else { f64::NAN };
        let rss_inc_ratio_madvise = if thp_inc > 0.0 { hps_inc.max(0.0) / thp_inc } else { f64::NAN };

        let mut report = Report::default();
        let mut table = Table::new([
            "server",
            "kgets per server CPU-s (median)",
            "min–max",
            "vs kvcache Default",
            "kgets/s wall clock (median)",
            "min–max",
            "steal of the server's CPU",
            "memory MiB (median)",
            "memory increase over kvcache Default MiB",
        ]);
        let def_core = median(&per_core[0]);
        for (i, &c) in configs.iter().enumerate() {
            let (core, wall) = (Summary::of(&per_core[i]), Summary::of(&tput[i]));
            table.row([
                c.name().to_string(),
                format!("{:.0}", core.median / 1e3),
                format!("{:.0}–{:.0}", core.min / 1e3, core.max / 1e3),
                format!("{:.3}", core.median / def_core),
                format!("{:.0}", wall.median / 1e3),
                format!("{:.0}–{:.0}", wall.min / 1e3, wall.max / 1e3),
                format!("{:.0}%", median(&steal[i]) * 100.0),
                format!("{:.0}", median(&mem[i]) / (1 << 20) as f64),
                format!("{:+.1}", (median(&mem[i]) - d) / (1 << 20) as f64),
            ]);
        }
        // Each throughput key per second of the server's CPU time and, `_wall`, per wall-clock
        // second, each with the spread of the paired runs. THP / THP again: how far two
        // identical servers' paired ratio strays, the resolution of the others.
        for (key, a, b) in [
            ("hps_vs_thp_throughput", Config::Hps, Config::Thp),
            ("thp_vs_thp_again_throughput", Config::Thp, Config::ThpAgain),
            ("memcached_hps_vs_largepages", Config::MemcachedHps, Config::MemcachedL),
            ("memcached_largepages_vs_default", Config::MemcachedL, Config::Memcached),
        ] {
            for (suffix, series) in [("", &per_core), ("_wall", &tput)] {
                if let Some(sm) = paired_all(series, a, b) {
                    report.figure(&format!("{key}{suffix}"), sm.median);
                    report.figure(&format!("{key}{suffix}_min"), sm.min);
                    report.figure(&format!("{key}{suffix}_max"), sm.max);
                    if let Some((low, high)) = paired_ci(series, a, b) {
                        report.figure(&format!("{key}{suffix}_ci95_low"), low);
                        report.figure(&format!("{key}{suffix}_ci95_high"), high);
                    }
                } else {
                    report.figure(&format!("{key}{suffix}"), serde_json::Value::Null);
                }
            }
        }
        // kvcache / memcached, load by load: `kvcache_vs_memcached_{load}_throughput` (per
        // wall-clock second: what the client gets) and `…_per_server_cpu`.
        let mut peer_table = clients::table();
        for p in &peers {
            p.figures(&mut report);
            p.row(&mut peer_table);
        }
        // The headlines (crate::headlines): YCSB's workloads C and B pooled, and memcslap.
        let of = |names: &[&str]| peers.iter().filter(|p| names.contains(&p.load)).collect::<Vec<_>>();
        clients::pooled_headline(&mut report, "ycsb_kvcache_vs_memcached", &of(&["ycsb_c", "ycsb_b"]));
        clients::pooled_headline(&mut report, "memcslap_kvcache_vs_memcached", &of(&["memcslap"]));
        let all_steal: Vec<f64> = steal.iter().flatten().copied().collect();
        report.figure("server_cpu_steal_share_median", median(&all_steal));
        report.figure(
            "hps_vs_thp_rss_increase",
            if rss_inc_ratio.is_nan() { serde_json::Value::Null } else { json!(rss_inc_ratio) },
        );
        report.figure(
            "hps_vs_thp_madvise_rss_increase",
            if rss_inc_ratio_madvise.is_nan() { serde_json::Value::Null } else { json!(rss_inc_ratio_madvise) },
        );
        report.figure("hot_arena_vs_hot_set_after_drift", drift.ratio);
        // Memory increase over memcached default: under `pagewise hps run` against `-L`.
        let mc_inc = |c: Config| Some(med_mem(c)? - med_mem(Config::Memcached)?);
        report.figure(
            "memcached_hps_rss_increase_vs_largepages",
            match (mc_inc(Config::MemcachedHps), mc_inc(Config::MemcachedL)) {
                (Some(h), Some(l)) if l > 0.0 => json!(h.max(0.0) / l),
                _ => serde_json::Value::Null,
            },
        );
        report.figure("thp_rss_increase_mib", thp_inc / (1 << 20) as f64);
        report.figure("thp_largepages_rss_increase_mib", thp_l_inc / (1 << 20) as f64);
        report.figure("hps_rss_increase_mib", hps_inc / (1 << 20) as f64);
        table.row([
            format!("{} (memory only)", Config::ThpL.name()),
            "–".into(),
            "–".into(),
            "–".into(),
            "–".into(),
            "–".into(),
            "–".into(),
            format!("{:.0}", thp_l_mem / (1 << 20) as f64),
            format!("{:+.1}", thp_l_inc / (1 << 20) as f64),
        ]);
        report.table(
            format!(
                "{records} records of {VALUE} B, {reads} zipfian reads per run on every server, {CONNS} connections × \
                 {DEPTH} pipelined gets, {reps} interleaved runs"
            ),
            table,
        );
        let mut rt = Table::new([
            "paired ratio (per run)",
            "per server CPU-s: median",
            "95% interval of the median",
            "min",
            "max",
            "wall clock: median",
            "min",
            "max",
            "runs",
        ]);
        for (a, b) in [
            (Config::Hps, Config::Thp),
            (Config::Thp, Config::ThpAgain),
            (Config::Thp, Config::Default),
            (Config::Hps, Config::Default),
            (Config::Default, Config::Memcached),
            (Config::MemcachedHps, Config::MemcachedL),
            (Config::MemcachedL, Config::Memcached),
        ] {
            if let (Some(core), Some(wall)) = (paired_all(&per_core, a, b), paired_all(&tput, a, b)) {
                let ci = paired_ci(&per_core, a, b).map_or("–".into(), |(l, h)| format!("{l:.3}–{h:.3}"));
                rt.row([
                    format!("{} / {}", a.name(), b.name()),
                    format!("{:.3}", core.median),
                    ci,
                    format!("{:.3}", core.min),
                    format!("{:.3}", core.max),
                    format!("{:.3}", wall.median),
                    format!("{:.3}", wall.min),
                    format!("{:.3}", wall.max),
                    core.n.to_string(),
                ]);
            }
        }
        report.table("throughput ratios of the pipelined runs above, each pair measured back to back", rt);
        if !peers.is_empty() {
            report.table(
                "kvcache Default / memcached by client: the same operations on both, pairs back to back in \
                 alternating order; YCSB is the headline",
                peer_table,
            );
        }
        let mut dt = Table::new([
            "phase",
            "hot items",
            "hot set MiB",
            "hot arena MiB",
            "compacted",
            "demoted",
            "promoted regions",
            "wrong values",
        ]);
        for p in &drift.phases {
            dt.row([
                p.phase.to_string(),
                p.hot_items.to_string(),
                format!("{:.2}", p.hot_set as f64 / (1 << 20) as f64),
                format!("{:.2}", p.arena as f64 / (1 << 20) as f64),
                p.compacted.to_string(),
                p.demoted.to_string(),
                p.promoted.to_string(),
                p.bad.to_string(),
            ]);
        }
        report.table(
            "drifting hot set on kvcache HPS (200,000 records; hot set = 1 record in 64, shifted each phase)",
            dt,
        );
        let mut tp_plot = Plot::new("throughput per run", "run", "kgets/s");
        let mut mem_plot = Plot::new("server memory over time", "s", "MiB");
        for (i, &c) in configs.iter().enumerate() {
            tp_plot.series(c.name(), tput[i].iter().enumerate().map(|(k, &v)| ((k + 1) as f64, v / 1e3)).collect());
            mem_plot.series(c.name(), mem_series[i].clone());
        }
        report.plots.push(tp_plot);
        report.plots.push(mem_plot);
        report.data = json!({
            "records": records, "reads": reads, "reps": reps, "value_bytes": VALUE, "memory_limit_mb": MEM_MB,
            "waiting_memory_limit_mb": have_memcached.then_some(waiting_mem),
            "configs": configs.iter().map(|c| c.name()).collect::<Vec<_>>(),
            "throughput_ops_s": tput, "gets_per_server_cpu_s": per_core, "server_cpu_steal_share": steal, "memory_bytes": mem, "memory_before_load_bytes": base_mem,
            "thp_largepages_memory_bytes": thp_l_mem,
            "memory_series_mib": mem_series, "hps_warmup_runs": hps_warm_runs,
            "hps_warmup": warm.iter().map(|(c, secs, conv)| json!({"server": c.name(), "seconds": secs, "converged": conv})).collect::<Vec<_>>(),
            "hps_stats": hps_stats.into_iter().map(|(k, v)| (k, json!(v))).collect::<serde_json::Map<_, _>>(),
            "kvcache_vs_memcached_by_client": peers.iter().map(clients::Paired::data).collect::<Vec<_>>(),
            "ycsb": waiting.ycsb.map(|(_, records, ops, threads)| json!({"records": records, "operations": ops, "threads": threads})),
            "drift": drift.phases.iter().map(|p| json!({"phase": p.phase, "hot_items": p.hot_items, "hot_set_bytes": p.hot_set, "hot_arena_bytes": p.arena, "compacted": p.compacted, "demoted": p.demoted, "promoted_regions": p.promoted})).collect::<Vec<_>>(),
        });
        if !have_memcached {
            report.note("memcached is not installed (`make deps`): the peer rows and every kvcache_vs_memcached figure are missing.");
        } else {
            if let Err(why) = &ycsb {
                report.note(format!("No YCSB figures (the headline): {why}."));
            }
            if memcslap_bin.is_none() {
                report.note("memcslap (libmemcached-tools, `make deps`) missing: no memcslap figures.");
            }
        }
        let busy: Vec<String> = peers
            .iter()
            .filter_map(|p| {
                let r: Vec<f64> = p.kv.iter().chain(&p.mc).filter_map(|r| r.client_busy).collect();
                (!r.is_empty()).then(|| format!("{} {:.0}%", p.load, Summary::of(&r).median * 100.0))
            })
            .collect();
        if !busy.is_empty() {
            report.note(format!(
                "How busy each client kept its one core (its CPU time over its wall-clock time, start-up included; \
                 `*_client_core_busy`): {}. A client near 100% sets the pace: its throughput follows what an \
                 operation costs on its own core, and waking a server's worker that sleeps on an idle vCPU is \
                 part of that cost (the client's send pays for the wake-up). {}",
                busy.join(", "),
                match kv_poll_us {
                    Some(us) if us > 0 => format!(
                        "kvcache's idle workers polled up to {us} µs before they slept (`--poll-us`, used as it runs \
                         confined to one CPU; adapted to the gaps between requests), memcached's sleep at once: \
                         kvcache spends server CPU, counted in `_per_server_cpu`, so that the client does not spend \
                         its own on wake-ups."
                    ),
                    _ => "kvcache's idle workers slept at once, as memcached's (no polling: it may run on every CPU)."
                        .to_string(),
                }
            ));
        }
        report.note(
            "kvcache / memcached is reported per load, each run with the same operations on both servers: \
             `kvcache_vs_memcached_{ycsb_c,ycsb_b}_*` (YCSB's own client, the headline: what a user of the \
             standard benchmark gets), `…_memcslap_*`, `…_reqresp_*` (the project's generator, one get in \
             flight per connection) and `…_pipelined_*` (the project's generator, 64 gets in flight per \
             connection: deep pipelining, where kvcache's reply batching saves most and no client that waits \
             for each reply sees that figure). `_throughput` is operations per wall-clock second of the client, \
             `_per_server_cpu` operations per second of the server process's CPU time. The headlines \
             `ycsb_kvcache_vs_memcached` (workloads C and B pooled) and `memcslap_kvcache_vs_memcached` are the \
             medians of the paired throughput ratios, with `_per_server_cpu` beside them.",
        );
        report.note(format!(
            "Throughput is gets per second of the server process's own CPU time (its per-process CPU clock, all threads, \
             without time the hypervisor stole: median steal on the server's CPU {:.0}%, up to {:.0}% in a run), so a \
             server's throughput on a core of its own; the `_wall` keys are gets per wall-clock second. Ratios are medians \
             of per-run paired ratios. `kvcache THP / kvcache THP (again)` pairs two identical servers: how far a ratio \
             strays by chance, per CPU-second and per wall-clock second — wall-clock throughput also follows how fast the \
             host runs the load generator's core, second by second. Memory is the median over runs of the value after each run, \
             the same definition for every server: RSS, with every memfd counted by the pages it holds (RSS misses the \
             pages of HPS's tracked arena whose mappings the tracker dropped). HPS was warmed until its tracking stopped \
             (kvcache: its `tracking` stat; memcached under `pagewise hps run`: the state its tracker publishes), at most \
             {} s each: {} — the paper too measured HPS after its promotions. Runs alternate A…Z, Z…A. {} \
             Memory increase over kvcache Default: THP -L (the whole cache on hugepages from the start, the paper's THP point: \
             +96.2% there) {:.1} MiB, THP (MADV_HUGEPAGE on the slab area, filled densely in order) {:.1} MiB, HPS {:.1} MiB; \
             `hps_vs_thp_rss_increase` is HPS's over THP -L's, `hps_vs_thp_madvise_rss_increase` over THP's.",
            median(&all_steal) * 100.0,
            all_steal.iter().copied().fold(0.0, f64::max) * 100.0,
            warm_limit.as_secs(),
            warm.iter()
                .map(|(c, secs, conv)| format!(
                    "{} {:.0} s, {}",
                    c.name(),
                    secs,
                    if *conv { "converged" } else { "still tracking" }
                ))
                .collect::<Vec<_>>()
                .join("; "),
            match place {
                Some(p) => format!(
                    "Clients on CPU {} (the generator: {CONNS} connections × {DEPTH} pipelined gets); every server on \
                     CPU {} with one worker thread.",
                    p.client, p.server
                ),
                None => format!("Load generator: {CONNS} connections × {DEPTH} pipelined gets on the server's one CPU."),
            },
            thp_l_inc / (1 << 20) as f64,
            thp_inc / (1 << 20) as f64,
            hps_inc / (1 << 20) as f64
        ));
        Ok(report)
    }
}
