//! `spark-hugepages`: Spark's Storage Memory on hugepages (seed 001), on a real standalone
//! cluster.
//!
//! The cluster is the paper's shape sized to this machine: a standalone master and 2 workers,
//! each running 2 one-core executors, from the Spark distribution inside the `pyspark` PyPI
//! package (installed into `target/spark-dist` on first use). The workloads are
//! `dev.pagewise.spark.bench.StorageBench` from java/: the microbenchmark (cache a dataset in
//! Storage Memory as MEMORY_ONLY_SER, then read it repeatedly) and MLlib k-means over a cached
//! dataset. Configurations, interleaved per repetition:
//! - **off**: no hugepages for the executors (THP `madvise`: the JVM does not advise its heap);
//! - **entire**: `-XX:+UseTransparentHugePages`, THP for the whole executor JVM;
//! - **part**: the Pagewise agent: serialized cached blocks in the hp_alloc arena;
//! - **part-old**: the paper's first prototype: the same blocks on normal memory, advised
//!   MADV_HUGEPAGE after the fact by a scanner thread, promoted by khugepaged at its pace.
//!
//! Hugepage bytes over time are sampled from the executors' smaps_rollup (AnonHugePages summed
//! over the 4 executor JVMs). Chunk size (`spark.storage.unrollMemoryThreshold`) is 4 MiB in
//! every configuration, a multiple of 2 MiB so the arena's regions are fully used and so that
//! part-old's malloc'd chunks hold a whole aligned 2 MiB region to advise.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use pagewise_kernel::procfs::{pids_with_cmdline, read_mem_usage, Pid};
use serde_json::json;

use crate::{human_bytes, interleave, ratio, Context, Experiment, Plot, Report, Summary, Table};

pub struct SparkHugepages;

/// The Spark version of java/pom.xml; the pyspark distribution must match it.
const SPARK_VERSION: &str = "3.5.3";
const JAR: &str = "java/target/pagewise-spark-0.1.0.jar";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Config {
    Off,
    Entire,
    Part,
    PartOld,
}

impl Config {
    fn name(self) -> &'static str {
        match self {
            Config::Off => "off",
            Config::Entire => "entire",
            Config::Part => "part",
            Config::PartOld => "part-old",
        }
    }

    fn executor_java_options(self, jar: &Path) -> String {
        match self {
            Config::Off => String::new(),
            Config::Entire => "-XX:+UseTransparentHugePages".into(),
            Config::Part => format!("-javaagent:{}", jar.display()),
            Config::PartOld => format!("-javaagent:{} -Dpagewise.storage=old", jar.display()),
        }
    }
}

fn repo_root() -> PathBuf {
    std::env::var_os("PAGEWISE_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
}

/// The Spark distribution of the pyspark package, installed with pip on first use.
fn spark_home(root: &Path, ctx: &Context) -> anyhow::Result<PathBuf> {
    let target = root.join("target/spark-dist");
    let home = target.join("pyspark");
    if !home.join("bin/spark-submit").exists() {
        ctx.log(format!("installing pyspark=={SPARK_VERSION} into {}", target.display()));
        let st = Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", "--target"])
            .arg(&target)
            .arg(format!("pyspark=={SPARK_VERSION}"))
            .status()
            .context("running python3 -m pip")?;
        if !st.success() || !home.join("bin/spark-submit").exists() {
            bail!("pip install pyspark=={SPARK_VERSION} into {} failed", target.display());
        }
    }
    Ok(home)
}

/// A child process killed (and reaped) on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid; it has not been reaped yet (wait below).
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Cluster {
    // Workers first, so they stop (and stop their executors) before the master.
    _workers: Vec<Proc>,
    _master: Proc,
    url: String,
}

/// SIGTERM the child when this process ends, also when it is killed (Drop does not run then):
/// the Spark daemons' own shutdown hooks stop their executors.
fn die_with_us(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs between fork and exec and makes one async-signal-safe syscall.
    unsafe { cmd.pre_exec(|| pagewise_kernel::signal::set_parent_death_signal(libc::SIGTERM)) };
}

fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("binding a port")?;
    Ok(l.local_addr()?.port())
}

fn spark_class(home: &Path, logs: &Path, args: &[String], what: &'static str) -> anyhow::Result<Proc> {
    let log = std::fs::File::create(logs.join(format!("{what}.log")))?;
    let mut cmd = Command::new(home.join("bin/spark-class"));
    die_with_us(&mut cmd);
    let child = cmd
        .args(args)
        .env("SPARK_HOME", home)
        .env("SPARK_LOCAL_IP", "127.0.0.1")
        .env("SPARK_LOG_DIR", logs)
        .env("SPARK_WORKER_DIR", logs.join("work"))
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting the Spark {what}"))?;
    Ok(Proc(child))
}

impl Cluster {
    fn start(home: &Path, logs: &Path, worker_mem_mb: u64) -> anyhow::Result<Self> {
        std::fs::create_dir_all(logs.join("work"))?;
        let port = free_port()?;
        let master = spark_class(
            home,
            logs,
            &[
                "org.apache.spark.deploy.master.Master".into(),
                "--host".into(),
                "127.0.0.1".into(),
                "--port".into(),
                port.to_string(),
                "--webui-port".into(),
                "0".into(),
            ],
            "master",
        )?;
        let t = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if t.elapsed() > Duration::from_secs(90) {
                bail!("the Spark master did not listen on port {port} within 90 s (see {}/master.log)", logs.display());
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        let url = format!("spark://127.0.0.1:{port}");
        let mut workers = Vec::new();
        for (i, what) in ["worker1", "worker2"].into_iter().enumerate() {
            workers.push(spark_class(
                home,
                logs,
                &[
                    "org.apache.spark.deploy.worker.Worker".into(),
                    "--host".into(),
                    "127.0.0.1".into(),
                    "--cores".into(),
                    "2".into(),
                    "--memory".into(),
                    format!("{worker_mem_mb}m"),
                    "--webui-port".into(),
                    "0".into(),
                    "--work-dir".into(),
                    logs.join(format!("work/{i}")).display().to_string(),
                    url.clone(),
                ],
                what,
            )?);
        }
        // Workers register within seconds; spark-submit waits for executors anyway.
        std::thread::sleep(Duration::from_secs(5));
        Ok(Cluster { _workers: workers, _master: master, url })
    }
}

/// One run's figures.
#[derive(Clone, Debug, Default)]
struct Run {
    total_s: f64,
    cache_s: f64,
    access_s: f64,
    cached_bytes: u64,
    checksum: String,
    /// (t_s, hugepage bytes, rss) summed over the executors.
    series: Vec<(f64, u64, u64)>,
    /// First time the hugepage bytes reached 90% of the cached bytes.
    t_reach_s: Option<f64>,
    /// When the access phase ended, relative to the first sample.
    access_end_s: f64,
    peak_huge: u64,
    peak_rss: u64,
}

/// Sum AnonHugePages and Rss over the executor JVMs every 500 ms.
fn sample_executors(stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Vec<(f64, u64, u64)>> {
    std::thread::spawn(move || {
        let t0 = Instant::now();
        let mut out = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let (mut huge, mut rss) = (0, 0);
            for pid in pids_with_cmdline("CoarseGrainedExecutorBackend").unwrap_or_default() {
                if let Ok(u) = read_mem_usage(Pid::Id(pid)) {
                    huge += u.anon_huge;
                    rss += u.rss;
                }
            }
            out.push((t0.elapsed().as_secs_f64(), huge, rss));
            std::thread::sleep(Duration::from_millis(500));
        }
        out
    })
}

struct Setup {
    home: PathBuf,
    jar: PathBuf,
    url: String,
    logs: PathBuf,
    executor_mem_mb: u64,
}

fn run_once(s: &Setup, cfg: Config, workload: &str, bytes: u64, passes: u32) -> anyhow::Result<Run> {
    let opts = cfg.executor_java_options(&s.jar);
    let mut cmd = Command::new(s.home.join("bin/spark-submit"));
    die_with_us(&mut cmd);
    cmd.env("SPARK_HOME", &s.home)
        .env("SPARK_LOCAL_IP", "127.0.0.1")
        .args(["--master", &s.url, "--deploy-mode", "client", "--driver-memory", "1g"])
        .args(["--class", "dev.pagewise.spark.bench.StorageBench"])
        .args(["--conf", "spark.executor.cores=1", "--conf", "spark.cores.max=4"])
        .args(["--conf", &format!("spark.executor.memory={}m", s.executor_mem_mb)])
        .args(["--conf", "spark.storage.unrollMemoryThreshold=4194304"])
        .args(["--conf", "spark.serializer=org.apache.spark.serializer.KryoSerializer"])
        .args(["--conf", "spark.ui.enabled=false", "--conf", "spark.driver.host=127.0.0.1"])
        .args(["--conf", "spark.locality.wait=0"]);
    if !opts.is_empty() {
        cmd.args(["--conf", &format!("spark.executor.extraJavaOptions={opts}")]);
    }
    let log = std::fs::File::create(s.logs.join(format!("submit-{}-{workload}-{bytes}.log", cfg.name())))?;
    let mut child = cmd
        .arg(&s.jar)
        .args([workload, &bytes.to_string(), &format!("{passes},8")])
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .context("starting spark-submit")?;
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample_executors(stop.clone());
    let t0 = Instant::now();
    let mut result = None;
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line?;
        if let Some(j) = line.strip_prefix("PAGEWISE-RESULT ") {
            result = Some((serde_json::from_str::<serde_json::Value>(j)?, t0.elapsed().as_secs_f64()));
        }
    }
    let st = child.wait()?;
    stop.store(true, Ordering::Relaxed);
    let series = sampler.join().unwrap_or_default();
    let Some((r, end_s)) = result else {
        bail!("spark-submit ({} {workload}) gave no result (exit {st}); see {}", cfg.name(), s.logs.display());
    };
    let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
    let passes: Vec<f64> =
        r["pass_s"].as_array().map(|a| a.iter().filter_map(|v| v.as_f64()).collect()).unwrap_or_default();
    let cached = r["cached_bytes"].as_u64().unwrap_or(0);
    // The result line is printed just after the access phase; the JVM start-up before the
    // first sample is the same for every configuration.
    let access_end_s = end_s;
    let t_reach_s = series.iter().find(|p| cached > 0 && p.1 as f64 >= 0.9 * cached as f64).map(|p| p.0);
    Ok(Run {
        total_s: f("total_s"),
        cache_s: f("cache_s"),
        access_s: passes.iter().sum(),
        cached_bytes: cached,
        checksum: r["checksum"].as_str().unwrap_or_default().to_string(),
        peak_huge: series.iter().map(|p| p.1).max().unwrap_or(0),
        peak_rss: series.iter().map(|p| p.2).max().unwrap_or(0),
        t_reach_s,
        access_end_s,
        series,
    })
}

impl Experiment for SparkHugepages {
    fn name(&self) -> &'static str {
        "spark-hugepages"
    }

    fn description(&self) -> &'static str {
        "Spark Storage Memory on hugepages: off / entire JVM THP / part (hp_alloc agent) / part-old (madvise + khugepaged), micro + MLlib k-means, standalone cluster 2 workers x 2 executors"
    }

    fn run(&self, ctx: &mut Context) -> anyhow::Result<Report> {
        let root = repo_root();
        let jar = root.join(JAR).canonicalize().with_context(|| format!("{JAR} missing: run `make java`"))?;
        let home = spark_home(&root, ctx)?;
        let mem_total = pagewise_kernel::procfs::read_meminfo().map(|m| m.mem_total).unwrap_or(0);
        let mut sizes: Vec<u64> = ctx.mode.pick(vec![1 << 30, 2 << 30], vec![2 << 30, 4 << 30, 12 << 30]);
        // PAGEWISE_SPARK_SIZES_MB=256,512 replaces the sizes (a smoke run, or a smaller machine).
        if let Ok(v) = std::env::var("PAGEWISE_SPARK_SIZES_MB") {
            sizes = v
                .split(',')
                .map(|x| x.trim().parse::<u64>().map(|mb| mb << 20))
                .collect::<Result<_, _>>()
                .with_context(|| format!("PAGEWISE_SPARK_SIZES_MB={v:?} is not a list of MiB"))?;
        }
        // The cached data lives in 4 executors; each needs room for its share in storage
        // memory plus working space. Sizes the machine cannot hold are skipped and named.
        let fits = |b: u64| b * 3 < mem_total;
        let (sizes, skipped): (Vec<u64>, Vec<u64>) = sizes.into_iter().partition(|&b| fits(b));
        let max = *sizes.iter().max().context("no data size fits this machine's memory")?;
        let executor_mem_mb = (((max / 4) * 5 / 2) >> 20).max(1536);
        let reps = ctx.mode.pick(1, 3);
        let passes = ctx.mode.pick(5, 10);
        let configs = [Config::Off, Config::Entire, Config::Part, Config::PartOld];
        // PAGEWISE_SPARK_WORKLOADS=micro runs one workload (a smoke run on a busy machine).
        let workloads: Vec<&str> = match std::env::var("PAGEWISE_SPARK_WORKLOADS") {
            Ok(v) if v == "micro" => vec!["micro"],
            Ok(v) if v == "kmeans" => vec!["kmeans"],
            Ok(v) if v != "micro,kmeans" => bail!("PAGEWISE_SPARK_WORKLOADS={v:?}: micro, kmeans or micro,kmeans"),
            _ => vec!["micro", "kmeans"],
        };
        let logs = ctx.out_dir.join("logs");
        std::fs::create_dir_all(&logs)?;
        ctx.message("starting the standalone cluster");
        let cluster = Cluster::start(&home, &logs, executor_mem_mb * 2 + 512)?;
        let setup = Setup { home, jar, url: cluster.url.clone(), logs, executor_mem_mb };
        ctx.start_progress((sizes.len() * workloads.len() * configs.len() * reps) as u64, "spark runs");

        let mut report = Report::default();
        let mut table = Table::new([
            "workload",
            "data",
            "config",
            "run time s",
            "access s",
            "vs off",
            "hugepage bytes / cached",
            "90% reached (s)",
            "peak RSS",
        ]);
        let mut plot = Plot::new("Executors' hugepage bytes over time (micro, largest size)", "s", "GiB");
        let mut data = Vec::new();
        for &workload in &workloads {
            for &bytes in &sizes {
                ctx.message(format!("{workload} {}", human_bytes(bytes)));
                let runs = interleave(ctx, &configs, reps, |&c, _| run_once(&setup, c, workload, bytes, passes))?;
                let med = |i: usize, f: fn(&Run) -> f64| Summary::of(&runs[i].iter().map(f).collect::<Vec<_>>()).median;
                let off_t = med(0, |r| r.total_s);
                let checks: Vec<&str> = runs.iter().flat_map(|rs| rs.iter().map(|r| r.checksum.as_str())).collect();
                if checks.windows(2).any(|w| w[0] != w[1]) {
                    bail!("{workload} {}: configurations disagree on the result: {checks:?}", human_bytes(bytes));
                }
                for (i, c) in configs.iter().enumerate() {
                    let last = runs[i].last().expect("reps >= 1");
                    let cached = last.cached_bytes.max(1);
                    table.row([
                        workload.to_string(),
                        human_bytes(bytes),
                        c.name().to_string(),
                        format!("{:.2}", med(i, |r| r.total_s)),
                        format!("{:.2}", med(i, |r| r.access_s)),
                        format!("{:.3}", ratio(med(i, |r| r.total_s), off_t)),
                        format!("{:.2}", last.peak_huge as f64 / cached as f64),
                        last.t_reach_s.map_or("never".into(), |t| format!("{t:.1} (end {:.1})", last.access_end_s)),
                        human_bytes(last.peak_rss),
                    ]);
                    if workload == "micro" && bytes == max {
                        plot.series(
                            c.name(),
                            last.series.iter().map(|p| (p.0, p.1 as f64 / (1u64 << 30) as f64)).collect(),
                        );
                    }
                    data.push(json!({
                        "workload": workload, "bytes": bytes, "config": c.name(),
                        "total_s": runs[i].iter().map(|r| r.total_s).collect::<Vec<_>>(),
                        "cache_s": runs[i].iter().map(|r| r.cache_s).collect::<Vec<_>>(),
                        "access_s": runs[i].iter().map(|r| r.access_s).collect::<Vec<_>>(),
                        "cached_bytes": last.cached_bytes, "peak_hugepage_bytes": last.peak_huge,
                        "peak_rss": last.peak_rss, "t_reach_90pct_s": last.t_reach_s, "access_end_s": last.access_end_s,
                        "series": last.series,
                    }));
                }
                if bytes == max && workload == "micro" {
                    let t = |i: usize| med(i, |r| r.total_s);
                    let huge = |i: usize| {
                        let l = runs[i].last().expect("reps >= 1");
                        l.peak_huge as f64 / l.cached_bytes.max(1) as f64
                    };
                    report.figure("part_vs_entire_time", ratio(t(2), t(1)));
                    report.figure("part_vs_off_time", ratio(t(2), t(0)));
                    report.figure("part_old_vs_off_time", ratio(t(3), t(0)));
                    report.figure("entire_vs_off_time", ratio(t(1), t(0)));
                    report.figure("part_hugepage_bytes_vs_cached", huge(2));
                    report.figure("entire_hugepage_bytes_vs_cached", huge(1));
                    report.figure("part_old_hugepage_bytes_vs_cached", huge(3));
                }
                if bytes == max && workload == "kmeans" {
                    let t = |i: usize| med(i, |r| r.total_s);
                    report.figure("kmeans_part_vs_off_time", ratio(t(2), t(0)));
                    report.figure("kmeans_part_vs_entire_time", ratio(t(2), t(1)));
                }
            }
        }
        drop(cluster);
        report.table("", table);
        report.plots.push(plot);
        report.data = json!({ "reps": reps, "passes": passes, "executor_memory_mb": executor_mem_mb, "runs": data });
        report.note(format!(
            "Standalone cluster (Spark {SPARK_VERSION} from the pyspark package): master + 2 workers x 2 executors (1 core, {executor_mem_mb} MiB each); \
             {reps} repetition(s) interleaved off/entire/part/part-old; MEMORY_ONLY_SER, Kryo, 4 MiB chunks; {passes} access passes (micro) / k-means iterations. \
             Hugepage bytes: AnonHugePages summed over the executors' smaps_rollup, peak over the run, against Spark's own cached bytes."
        ));
        if !skipped.is_empty() {
            report.note(format!(
                "skipped sizes (more than a third of this machine's memory): {}",
                skipped.iter().map(|&b| human_bytes(b)).collect::<Vec<_>>().join(", ")
            ));
        }
        Ok(report)
    }
}
