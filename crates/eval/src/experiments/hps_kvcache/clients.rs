//! kvcache Default against memcached as clients see them, load by load: the project's generator
//! pipelining gets or waiting for each reply, YCSB's own client (workloads C and B) and
//! memcslap. Every load runs the same operations on both servers, in pairs run back to back
//! with the order alternating (kvcache first, then memcached first), and is reported twice:
//! operations per wall-clock second (what the client gets) and operations per second of the
//! server process's CPU time (what the server spends; the only figure a busy machine does not
//! blur much, since the server has its own core).

use std::path::{Path, PathBuf};
use std::process::Command;

use std::time::Instant;

use pagewise_kernel::cpu::{process_cpu_time, waited_children_cpu_time};
use pagewise_kvcache::load::{self, Choice};
use serde_json::json;

use super::{find_in_path, Running, VALUE};
use crate::report::{Report, Table};
use crate::stats::{median_ci95, Summary};
use crate::Context;

/// One run of a load on one server.
#[derive(Clone, Copy, Debug)]
pub(super) struct Run {
    /// Operations the client timed, and the seconds they took.
    pub ops: f64,
    pub secs: f64,
    /// Operations the server served while its CPU time was measured (more than `ops` when the
    /// client also did untimed work on it, as memcslap's sets).
    pub server_ops: f64,
    /// CPU time of the server process (all its threads) during the run.
    pub cpu_secs: f64,
    /// For a client run as a command (YCSB, memcslap): its CPU time over its wall-clock time,
    /// start-up included: how busy it kept the one core it runs on. Near 1, the client sets
    /// the pace and the server's speed barely shows in the throughput.
    pub client_busy: Option<f64>,
}

impl Run {
    pub fn throughput(&self) -> f64 {
        self.ops / self.secs.max(1e-9)
    }
    pub fn per_server_cpu(&self) -> f64 {
        self.server_ops / self.cpu_secs.max(1e-9)
    }
    fn ops(&self) -> f64 {
        self.ops
    }
}

/// Run `f` (which returns the operations it timed and the seconds they took) and measure the
/// server's CPU time meanwhile.
pub(super) fn measured(server_pid: i32, f: impl FnOnce() -> anyhow::Result<(f64, f64)>) -> anyhow::Result<Run> {
    let cpu0 = process_cpu_time(server_pid)?;
    let (ops, secs) = f()?;
    let cpu1 = process_cpu_time(server_pid)?;
    Ok(Run { ops, secs, server_ops: ops, cpu_secs: (cpu1 - cpu0).as_secs_f64(), client_busy: None })
}

/// Run a client command to its end (`Command::output`) and say how busy it kept its core:
/// its CPU time (all its threads, from getrusage RUSAGE_CHILDREN) over its wall-clock time.
fn client_output(cmd: &mut Command, what: &str) -> anyhow::Result<(std::process::Output, f64)> {
    let cpu0 = waited_children_cpu_time()?;
    let t = Instant::now();
    let out = cmd.output().map_err(|e| anyhow::anyhow!("starting {what}: {e}"))?;
    let wall = t.elapsed().as_secs_f64();
    let cpu = (waited_children_cpu_time()? - cpu0).as_secs_f64();
    Ok((out, cpu / wall.max(1e-9)))
}

/// One load's runs on kvcache and on memcached; `kv[k]` and `mc[k]` ran back to back.
pub(super) struct Paired {
    /// The load's name in the summary keys.
    pub load: &'static str,
    /// What the client was, for the table.
    pub client: String,
    pub kv: Vec<Run>,
    pub mc: Vec<Run>,
}

impl Paired {
    pub fn new(load: &'static str, client: impl Into<String>) -> Self {
        Paired { load, client: client.into(), kv: Vec::new(), mc: Vec::new() }
    }

    /// Pair number `k` (its number sets the order: kvcache first when even, memcached first
    /// when odd): `one` on both servers, back to back.
    pub fn pair(
        &mut self,
        ctx: &Context,
        k: usize,
        kv: &Running,
        mc: &Running,
        one: &mut impl FnMut(&Running, usize) -> anyhow::Result<Run>,
    ) -> anyhow::Result<()> {
        let mut run = |r: &Running| {
            let res = one(r, k).map_err(|e| anyhow::anyhow!("{} on {}: {e:#}", self.load, r.config.name()));
            ctx.tick();
            res
        };
        let (kv_run, mc_run) = if k.is_multiple_of(2) {
            let a = run(kv)?;
            (a, run(mc)?)
        } else {
            let b = run(mc)?;
            (run(kv)?, b)
        };
        self.kv.push(kv_run);
        self.mc.push(mc_run);
        Ok(())
    }

    fn ratios(&self, per: fn(&Run) -> f64) -> Vec<f64> {
        self.kv.iter().zip(&self.mc).map(|(k, m)| per(k) / per(m)).collect()
    }

    /// Median share of its core the client kept busy, over every run on both servers.
    fn client_busy(&self) -> Option<f64> {
        let v: Vec<f64> = self.kv.iter().chain(&self.mc).filter_map(|r| r.client_busy).collect();
        (!v.is_empty()).then(|| Summary::of(&v).median)
    }

    /// `kvcache_vs_memcached_{load}_throughput` and `…_per_server_cpu`, each the median of the
    /// paired ratios with its min, max and 95% interval; and each server's medians.
    pub fn figures(&self, report: &mut Report) {
        for (metric, per) in
            [("throughput", Run::throughput as fn(&Run) -> f64), ("per_server_cpu", Run::per_server_cpu)]
        {
            let key = format!("kvcache_vs_memcached_{}_{metric}", self.load);
            let r = self.ratios(per);
            let s = Summary::of(&r);
            report.figure(&key, s.median);
            report.figure(&format!("{key}_min"), s.min);
            report.figure(&format!("{key}_max"), s.max);
            if let Some((low, high)) = median_ci95(&r) {
                report.figure(&format!("{key}_ci95_low"), low);
                report.figure(&format!("{key}_ci95_high"), high);
            }
        }
        for (server, runs) in [("kvcache", &self.kv), ("memcached", &self.mc)] {
            let med = |f: fn(&Run) -> f64| Summary::of(&runs.iter().map(f).collect::<Vec<_>>()).median;
            report.figure(&format!("{}_{server}_ops_s", self.load), med(Run::throughput));
            report.figure(&format!("{}_{server}_server_cpu_us_per_op", self.load), 1e6 / med(Run::per_server_cpu));
        }
        if let Some(busy) = self.client_busy() {
            report.figure(&format!("{}_client_core_busy", self.load), busy);
        }
    }

    pub fn row(&self, table: &mut Table) {
        let med = |runs: &[Run], f: fn(&Run) -> f64| Summary::of(&runs.iter().map(f).collect::<Vec<_>>()).median;
        let ratio = |per: fn(&Run) -> f64| {
            let r = self.ratios(per);
            let ci = median_ci95(&r).map_or("–".into(), |(l, h)| format!("{l:.3}–{h:.3}"));
            (format!("{:.3}", Summary::of(&r).median), ci)
        };
        let (tp, tp_ci) = ratio(Run::throughput);
        let (cpu, cpu_ci) = ratio(Run::per_server_cpu);
        table.row([
            self.load.to_string(),
            self.client.clone(),
            self.kv.len().to_string(),
            format!("{:.0}", med(&self.kv, Run::ops)),
            format!("{:.0}", med(&self.kv, Run::throughput)),
            format!("{:.0}", med(&self.mc, Run::throughput)),
            tp,
            tp_ci,
            format!("{:.1}", 1e6 / med(&self.kv, Run::per_server_cpu)),
            format!("{:.1}", 1e6 / med(&self.mc, Run::per_server_cpu)),
            cpu,
            cpu_ci,
            self.client_busy().map_or("–".into(), |b| format!("{:.0}%", b * 100.0)),
        ]);
    }

    pub fn data(&self) -> serde_json::Value {
        let runs = |v: &[Run]| {
            v.iter()
                .map(|r| {
                    json!({"ops": r.ops, "secs": r.secs, "server_ops": r.server_ops, "server_cpu_secs": r.cpu_secs,
                           "client_core_busy": r.client_busy})
                })
                .collect::<Vec<_>>()
        };
        json!({"load": self.load, "client": self.client, "kvcache": runs(&self.kv), "memcached": runs(&self.mc)})
    }
}

/// The table the [`Paired`] rows go into.
pub(super) fn table() -> Table {
    Table::new([
        "load",
        "client",
        "pairs",
        "operations per run",
        "kvcache ops/s",
        "memcached ops/s",
        "throughput kvcache / memcached",
        "95% interval",
        "kvcache server CPU µs/op",
        "memcached server CPU µs/op",
        "per server CPU-s kvcache / memcached",
        "95% interval",
        "client's core busy",
    ])
}

/// A headline over several loads' pairs pooled (YCSB's workloads C and B): `KEY` the median of
/// the paired throughput ratios with `KEY_min`, `KEY_max` and `KEY_ci95_low`/`_high`, and the
/// same of the server-CPU ratios as `KEY_per_server_cpu…`.
pub(super) fn pooled_headline(report: &mut Report, key: &str, loads: &[&Paired]) {
    for (suffix, per) in [("", Run::throughput as fn(&Run) -> f64), ("_per_server_cpu", Run::per_server_cpu)] {
        let r: Vec<f64> = loads.iter().flat_map(|p| p.ratios(per)).collect();
        if r.is_empty() {
            report.figure(&format!("{key}{suffix}"), serde_json::Value::Null);
            continue;
        }
        let s = Summary::of(&r);
        report.figure(&format!("{key}{suffix}"), s.median);
        report.figure(&format!("{key}{suffix}_min"), s.min);
        report.figure(&format!("{key}{suffix}_max"), s.max);
        if let Some((low, high)) = median_ci95(&r) {
            report.figure(&format!("{key}{suffix}_ci95_low"), low);
            report.figure(&format!("{key}{suffix}_ci95_high"), high);
        }
    }
}

/// YCSB's own client (bench/ycsb: YCSB core and the project's memcached binding on
/// spymemcached), run as `java … site.ycsb.Client`.
pub(super) struct Ycsb {
    java: PathBuf,
    classpath: String,
    workloads: PathBuf,
}

impl Ycsb {
    /// The built binding next to the source tree of this binary, or why there is none.
    pub fn find() -> Result<Ycsb, String> {
        let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let root = exe.ancestors().nth(3).map(|p| p.join("bench/ycsb")).ok_or("no source tree above the binary")?;
        let jar = root.join("target/pagewise-ycsb-0.1.0.jar");
        if !jar.exists() {
            return Err(format!("{} not built: run `make ycsb`", jar.display()));
        }
        let java = find_in_path("java").ok_or("java not installed (`make deps`)")?;
        Ok(Ycsb {
            java,
            classpath: format!("{}:{}/target/lib/*", jar.display(), root.display()),
            workloads: root.join("workloads"),
        })
    }

    /// One YCSB phase (`-load` or `-t`) of `workload` (a file of bench/ycsb/workloads) against
    /// `addr`: the operations done and the seconds YCSB measured them in. Fails unless every
    /// operation returned OK.
    pub fn run(
        &self,
        addr: &str,
        load: bool,
        workload: &str,
        records: u64,
        ops: u64,
        threads: usize,
    ) -> anyhow::Result<(f64, f64, f64)> {
        let (out, busy) = client_output(
            Command::new(&self.java)
                .args(["-cp", &self.classpath, "site.ycsb.Client", if load { "-load" } else { "-t" }])
                .args(["-db", "dev.pagewise.ycsb.MemcachedClient", "-P"])
                .arg(self.workloads.join(workload))
                .args(["-p", &format!("recordcount={records}"), "-p", &format!("operationcount={ops}")])
                .args(["-p", &format!("memcached.hosts={addr}"), "-p", "maxexecutiontime=600"])
                .args(["-threads", &threads.to_string()]),
            "java (YCSB)",
        )?;
        let text = String::from_utf8_lossy(&out.stdout);
        let (done, secs) = parse_ycsb(&text).map_err(|why| {
            anyhow::anyhow!("YCSB {workload}: {why} (status {}): {}", out.status, String::from_utf8_lossy(&out.stderr))
        })?;
        let want = if load { records } else { ops };
        anyhow::ensure!(
            out.status.success() && done == want,
            "YCSB {workload}: {done} of {want} operations returned OK (status {}):\n{text}",
            out.status
        );
        Ok((done as f64, secs, busy))
    }
}

/// From YCSB's report: the operations that returned OK (all kinds) and the run time in seconds.
/// Fails without an `[OVERALL], RunTime(ms)` line, or naming the operations that returned
/// something else (`[READ], Return=NOT_FOUND, 12`).
fn parse_ycsb(text: &str) -> Result<(u64, f64), String> {
    let mut ok = 0;
    let mut runtime_ms = None;
    let mut failed = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(", ").collect();
        match fields.as_slice() {
            ["[OVERALL]", "RunTime(ms)", v] => runtime_ms = v.trim().parse::<f64>().ok(),
            [op, status, n] if status.starts_with("Return=") => {
                let n: u64 = n.trim().parse().map_err(|_| format!("bad count in `{line}`"))?;
                if *status == "Return=OK" {
                    ok += n;
                } else if n > 0 {
                    failed.push(format!("{op} {n} × {}", &status["Return=".len()..]));
                }
            }
            _ => {}
        }
    }
    if !failed.is_empty() {
        return Err(format!("operations that did not return OK: {}", failed.join(", ")));
    }
    let ms = runtime_ms.ok_or("no `[OVERALL], RunTime(ms)` line in its report")?;
    Ok((ok, ms / 1e3))
}

/// What the clients that wait for each reply run, and how often.
pub(super) struct Waiting<'a> {
    /// Rounds; each runs one pair of every load, so that drift hits all loads alike.
    pub rounds: usize,
    /// The project's generator: records stored, gets per run, connections (one get in flight
    /// on each).
    pub records: u64,
    pub gets: u64,
    pub conns: usize,
    /// YCSB, if built: records, operations per run, client threads.
    pub ycsb: Option<(&'a Ycsb, u64, u64, usize)>,
    /// memcslap, if installed: threads and gets per thread.
    pub memcslap: Option<(&'a Path, usize, u64)>,
}

/// kvcache and memcached (fresh servers) under the clients that wait for each reply: the
/// project's generator with one get in flight per connection, YCSB workloads C and B, memcslap.
pub(super) fn waiting(ctx: &Context, kv: &Running, mc: &Running, w: &Waiting) -> anyhow::Result<Vec<Paired>> {
    for r in [kv, mc] {
        let l = load::load(&r.addr, 0, w.records, VALUE, 2, 64)?;
        anyhow::ensure!(l.bad == 0, "{}: {} stores not STORED", r.config.name(), l.bad);
        if let Some((y, records, _, threads)) = w.ycsb {
            y.run(&r.addr, true, "workloadc", records, records, threads)
                .map_err(|e| anyhow::anyhow!("YCSB load of {}: {e:#}", r.config.name()))?;
        }
    }
    let mut reqresp = Paired::new(
        "reqresp",
        format!("project generator, {} connections × 1 get in flight, every value checked", w.conns),
    );
    let ycsb_client = |name: &str| {
        let threads = w.ycsb.map_or(0, |y| y.3);
        format!("YCSB 0.17 {name}, {threads} threads (spymemcached, a connection each)")
    };
    let mut ycsb_c = Paired::new("ycsb_c", ycsb_client("workload C"));
    let mut ycsb_b = Paired::new("ycsb_b", ycsb_client("workload B"));
    let mut slap = Paired::new(
        "memcslap",
        w.memcslap.map_or(String::new(), |(_, c, n)| {
            format!("memcslap --test=get, {c} threads × {n} gets, its own sets first")
        }),
    );
    for k in 0..w.rounds {
        reqresp.pair(ctx, k, kv, mc, &mut |r, k| {
            measured(r.server_pid, || {
                let res = load::run(
                    &r.addr,
                    w.records,
                    Choice::Zipfian,
                    VALUE,
                    w.conns,
                    1,
                    w.gets,
                    std::time::Duration::from_secs(300),
                    true,
                    1000 + k as u64,
                )?;
                anyhow::ensure!(res.bad == 0 && res.misses == 0, "{} wrong values, {} misses", res.bad, res.misses);
                Ok((res.ops as f64, res.secs))
            })
        })?;
        if let Some((y, records, ops, threads)) = w.ycsb {
            for (p, workload) in [(&mut ycsb_c, "workloadc"), (&mut ycsb_b, "workloadb")] {
                p.pair(ctx, k, kv, mc, &mut |r, _| {
                    let mut busy = 0.0;
                    let mut run = measured(r.server_pid, || {
                        let (ops, secs, b) = y.run(&r.addr, false, workload, records, ops, threads)?;
                        busy = b;
                        Ok((ops, secs))
                    })?;
                    run.client_busy = Some(busy);
                    Ok(run)
                })?;
            }
        }
        if let Some((bin, concurrency, execute)) = w.memcslap {
            slap.pair(ctx, k, kv, mc, &mut |r, _| memcslap_run(bin, r, concurrency, execute))?;
        }
    }
    let mut out = vec![reqresp];
    if w.ycsb.is_some() {
        out.extend([ycsb_c, ycsb_b]);
    }
    if w.memcslap.is_some() {
        out.push(slap);
    }
    Ok(out)
}

/// The memory limit (MiB) of the servers [`waiting`] runs on: room for all it stores, since a
/// miss fails the generator's check and YCSB's. memcslap stores `execute` new random keys each
/// run (values up to 5.7 KB; measured: 2,000 items a run, classes to 5,680 B) that nothing
/// reads again, so over the rounds its sets outgrow a cache sized for the records (at full
/// size, 21 runs × 50,000 items ≈ 2.8 GB) and evict the records the other clients read.
/// Per item at most: the generator's 1 KiB, YCSB's 2 KiB (ten 100-byte fields as JSON),
/// memcslap's 6 KiB; a quarter more for the slab classes' rounding.
pub(super) fn waiting_memory_mb(w: &Waiting) -> usize {
    let ycsb = w.ycsb.map_or(0, |(_, records, ..)| records as usize);
    let slap = w.memcslap.map_or(0, |(_, _, execute)| w.rounds * execute as usize);
    let bytes = w.records as usize * 1024 + ycsb * 2048 + slap * 6144;
    (bytes + bytes / 4).div_ceil(1 << 20).max(super::MEM_MB)
}

/// Ticks [`waiting`] makes.
pub(super) fn waiting_ticks(w: &Waiting) -> usize {
    2 * w.rounds * (1 + if w.ycsb.is_some() { 2 } else { 0 } + usize::from(w.memcslap.is_some()))
}

/// One memcslap run: gets per second of its get phase; for the server's CPU per operation,
/// every operation it sent (its own sets that store the keys, then the gets).
fn memcslap_run(bin: &Path, r: &Running, concurrency: usize, execute: u64) -> anyhow::Result<Run> {
    let mut server_ops = 0.0;
    let mut busy = 0.0;
    let mut run = measured(r.server_pid, || {
        let (out, b) = client_output(
            Command::new(bin).args([
                format!("--servers={}", r.addr),
                format!("--concurrency={concurrency}"),
                format!("--execute-number={execute}"),
                "--test=get".into(),
            ]),
            "memcslap",
        )?;
        busy = b;
        let text = String::from_utf8_lossy(&out.stdout);
        let (sets, gets, get_secs) = parse_memcslap(&text)
            .ok_or_else(|| anyhow::anyhow!("memcslap gave no timings (status {}):\n{text}", out.status))?;
        anyhow::ensure!(out.status.success(), "memcslap exited with {}:\n{text}", out.status);
        server_ops = sets + gets;
        Ok((gets, get_secs))
    })?;
    run.server_ops = server_ops;
    run.client_busy = Some(busy);
    Ok(run)
}

/// memcslap's report: keys set, keys got and the seconds of the get phase.
/// "Time to set           20000 keys:                     1.868 seconds."
/// "Time to get           40000 keys by    2 threads:     1.463 seconds."
fn parse_memcslap(text: &str) -> Option<(f64, f64, f64)> {
    let numbers = |prefix: &str| -> Option<Vec<f64>> {
        let line = text.lines().find(|l| l.starts_with(prefix))?;
        Some(line.split(|c: char| c.is_whitespace() || c == ':').filter_map(|w| w.parse().ok()).collect())
    };
    let set = numbers("Time to set")?;
    let get = numbers("Time to get")?;
    match (set.as_slice(), get.as_slice()) {
        ([sets, _], [gets, _threads, secs]) if *gets > 0.0 && *secs > 0.0 => Some((*sets, *gets, *secs)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The full run's waiting phase holds what it stores without evicting: the records, and
    /// memcslap's 21 runs of 50,000 new items even if all were in its largest class (5,680 B).
    #[test]
    fn the_waiting_servers_hold_everything_the_clients_store() {
        let ycsb = Ycsb { java: PathBuf::new(), classpath: String::new(), workloads: PathBuf::new() };
        let slap = Path::new("memcslap");
        let full = Waiting {
            rounds: 21,
            records: 800_000,
            gets: 200_000,
            conns: 4,
            ycsb: Some((&ycsb, 200_000, 100_000, 4)),
            memcslap: Some((slap, 2, 50_000)),
        };
        let stored_mib = (800_000 * 1024 + 200_000 * 2048 + 21 * 50_000 * 5680) >> 20;
        assert!(waiting_memory_mb(&full) > stored_mib, "{} MiB", waiting_memory_mb(&full));
        // Without YCSB and memcslap, the records' limit.
        let records_only = Waiting { ycsb: None, memcslap: None, records: 1000, ..full };
        assert_eq!(waiting_memory_mb(&records_only), super::super::MEM_MB);
    }

    #[test]
    fn ycsb_reports_parse_and_errors_fail() {
        let ok = "[OVERALL], RunTime(ms), 2500\n[OVERALL], Throughput(ops/sec), 8000.0\n\
                  [READ], Operations, 19000\n[READ], Return=OK, 19000\n[UPDATE], Return=OK, 1000\n";
        assert_eq!(parse_ycsb(ok), Ok((20000, 2.5)));
        let missed = parse_ycsb(&format!("{ok}[READ], Return=NOT_FOUND, 3\n[UPDATE], Return=ERROR, 1\n"));
        assert_eq!(missed, Err("operations that did not return OK: [READ] 3 × NOT_FOUND, [UPDATE] 1 × ERROR".into()));
        assert!(parse_ycsb("[READ], Return=OK, 5\n").unwrap_err().contains("RunTime"));
        assert!(parse_ycsb(&format!("{ok}[READ], Return=ERROR, x\n")).is_err());
    }

    #[test]
    fn memcslap_reports_parse() {
        let text = "Time to generate      20000 test keys:                0.111 seconds.\n\
                    Time to set           20000 keys:                     1.868 seconds.\n\
                    Time to start             2 threads:                  0.000 seconds.\n\
                    Time to get           40000 keys by    2 threads:     1.463 seconds.\n";
        assert_eq!(parse_memcslap(text), Some((20000.0, 40000.0, 1.463)));
        assert_eq!(parse_memcslap("Time to get 1 keys by 2 threads: 0.5 seconds.\n"), None);
    }
}
