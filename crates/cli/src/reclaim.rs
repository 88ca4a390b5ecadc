//! `pagewise reclaimd` and `pagewise reclaim set|show|stat`: per-core reclaim (seed 002) and
//! split reclaim (seed 004) in user space.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use pagewise_kernel::cpu::{format_cpulist, online_cpus, parse_cpulist};
use pagewise_kernel::procfs::{read_vm_sysctl, read_zoneinfo};
use pagewise_kernel::SettingsGuard;
use pagewise_reclaim::config::{Config, RawConfig, RawCore};
use pagewise_reclaim::daemon::{effective_zone_watermarks, Daemon, Options};
use pagewise_reclaim::policy::{CoreThresholds, PerCoreTable};
use pagewise_reclaim::stats::Collector;
use pagewise_reclaim::tree::{self, TREE_DIR};

/// Run the reclaim daemon: workers pinned to the reclaim cores keep free memory (of the system
/// or of one memory cgroup) above the reclaim core's thresholds, so the protected cores never
/// reclaim. Stops on SIGINT/SIGTERM and restores every setting it changed (also after SIGKILL,
/// through the settings guard's journal, at the next pagewise start).
#[derive(clap::Args)]
#[command(
    after_help = "Example config (TOML):\n  scope = \"cgroup\"\n  cgroup = \"/sys/fs/cgroup/memory/pagewise-app\"\n  [roles]\n  protect = \"1\"\n  reclaim = \"0\"\n  [cores.\"0\"]\n  min_free_kbytes = 16384\n  pages_low_ratio = 200\n  pages_high_ratio = 300"
)]
pub struct DaemonArgs {
    /// The TOML configuration.
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// Log what the daemon does.
    #[arg(long, short)]
    verbose: bool,
    /// Stop after this many seconds (default: run until SIGINT/SIGTERM).
    #[arg(long, value_name = "S")]
    seconds: Option<f64>,
}

/// Per-core thresholds and statistics.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Sub,
}

#[derive(clap::Subcommand)]
enum Sub {
    Set(SetArgs),
    Show(ShowArgs),
    Stat(StatArgs),
}

/// Set per-core thresholds: in the running daemon's tree (/run/pagewise/percpu_free_mem), or
/// in a config file with --config.
#[derive(clap::Args)]
struct SetArgs {
    /// The cores to set (cpulist, e.g. 1-15).
    #[arg(long, value_name = "LIST")]
    cpu: Option<String>,
    /// The cores' min_free_kbytes.
    #[arg(long)]
    min_free_kbytes: Option<u64>,
    /// pages_low as % of pages_min (≥ 100; default 125).
    #[arg(long)]
    low_ratio: Option<u32>,
    /// pages_high as % of pages_min (≥ low ratio; default 150).
    #[arg(long)]
    high_ratio: Option<u32>,
    /// Set the global min_free_kbytes: every core gets it with ratios 125/150.
    #[arg(long, conflicts_with_all = ["cpu", "min_free_kbytes", "low_ratio", "high_ratio"])]
    global: Option<u64>,
    /// Edit this config file instead of the running daemon's tree.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Also write the sum of the cores' mins to /proc/sys/vm/min_free_kbytes (running daemon
    /// only; its settings guard restores the old value when it stops).
    #[arg(long)]
    apply_global: bool,
}

/// Show per-core thresholds, in KiB and in pages (per zone, kernel rounding), next to the
/// kernel's own watermarks.
#[derive(clap::Args)]
struct ShowArgs {
    /// Show this config file's thresholds instead of the running daemon's.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    #[arg(long)]
    json: bool,
}

/// Per-core reclaim statistics from the vmscan trace events (kswapd wake-ups by allocating
/// CPU, pages scanned/reclaimed, direct and memcg reclaim latency, slab shrinking), in the
/// layout of seed 002's Table 2. With `-- CMD`, for the command's run.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  pagewise reclaim stat --seconds 10\n  pagewise reclaim stat --json -- dd if=/dev/zero of=/tmp/x bs=1M count=512"
)]
struct StatArgs {
    #[arg(long)]
    json: bool,
    /// Without a command: collect this long (default 10 s; SIGINT ends early).
    #[arg(long, value_name = "S")]
    seconds: Option<f64>,
    /// The command to run and observe.
    #[arg(last = true)]
    cmd: Vec<String>,
}

fn stop_flag() -> anyhow::Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, flag.clone()).context("installing a signal handler")?;
    }
    Ok(flag)
}

fn kernel_min_free() -> anyhow::Result<u64> {
    read_vm_sysctl("min_free_kbytes")?.parse().context("min_free_kbytes is not a number")
}

fn load_config(path: &Path) -> anyhow::Result<Config> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Config::parse(&text, &online_cpus()?, kernel_min_free()?).with_context(|| format!("in {}", path.display()))
}

pub fn run_daemon(args: DaemonArgs) -> anyhow::Result<ExitCode> {
    let cfg = load_config(&args.config)?;
    let stop = stop_flag()?;
    let guard = Arc::new(SettingsGuard::new_without_signal_handler());
    let opts = Options { tree_dir: cfg.raw.tree.then(|| PathBuf::from(TREE_DIR)), verbose: args.verbose };
    let daemon = Daemon::start(&cfg, guard.clone(), opts)?;
    eprintln!(
        "reclaimd: pid {}, workers on cpu {}, protecting {}, scope {:?}{}",
        std::process::id(),
        format_cpulist(&cfg.reclaim),
        if cfg.protect.is_empty() { "-".into() } else { format_cpulist(&cfg.protect) },
        cfg.scope,
        cfg.cgroup.as_ref().map(|p| format!(" {}", p.display())).unwrap_or_default()
    );
    let t0 = Instant::now();
    while !stop.load(Ordering::Relaxed) && !daemon.stopping() {
        if args.seconds.is_some_and(|s| t0.elapsed().as_secs_f64() >= s) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let report = daemon.stop();
    let errors = guard.restore();
    for e in &errors {
        eprintln!("reclaimd: could not restore: {e}");
    }
    println!("{}", serde_json::to_string_pretty(&report)?);
    if let Some(fatal) = &report.fatal {
        eprintln!("reclaimd: stopped: {fatal}");
    }
    Ok(if errors.is_empty() && report.fatal.is_none() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    match args.command {
        Sub::Set(a) => set(a),
        Sub::Show(a) => show(a),
        Sub::Stat(a) => stat(a),
    }
}

fn thresholds_from(a: &SetArgs, base: CoreThresholds) -> CoreThresholds {
    CoreThresholds {
        min_free_kbytes: a.min_free_kbytes.unwrap_or(base.min_free_kbytes),
        pages_low_ratio: a.low_ratio.unwrap_or(base.pages_low_ratio),
        pages_high_ratio: a.high_ratio.unwrap_or(base.pages_high_ratio),
    }
}

fn set(a: SetArgs) -> anyhow::Result<ExitCode> {
    if a.global.is_none() && a.cpu.is_none() && !a.apply_global {
        bail!("nothing to set: give --cpu LIST with --min-free-kbytes/--low-ratio/--high-ratio, or --global KB");
    }
    let online = online_cpus()?;
    if let Some(path) = &a.config {
        if a.apply_global {
            bail!("--apply-global needs a running reclaimd (put apply_global = true in the config instead)");
        }
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let cfg =
            Config::parse(&text, &online, kernel_min_free()?).with_context(|| format!("in {}", path.display()))?;
        let mut raw: RawConfig = cfg.raw.clone();
        let mut table = cfg.table.clone();
        if let Some(kb) = a.global {
            table.set_global(kb)?;
            raw.global_min_free_kbytes = Some(kb);
        } else {
            let cpus = parse_cpulist(a.cpu.as_deref().expect("checked"))?;
            let base = table.get(*cpus.iter().next().context("empty --cpu")?).context("cpu is not online")?;
            table.set_cores(&cpus, thresholds_from(&a, base))?;
        }
        raw.cores = group_cores(&table, raw.global_min_free_kbytes.unwrap_or(cfg.table.global_min_free_kbytes()));
        let out = Config::to_toml(&raw);
        Config::parse(&out, &online, kernel_min_free()?).context("the edited config does not validate")?;
        std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))?;
        println!("{}: min_free_kbytes would be {}", path.display(), table.global_min_free_kbytes());
        return Ok(ExitCode::SUCCESS);
    }
    let dir = Path::new(TREE_DIR);
    if tree::running_daemon(dir).is_none() {
        bail!("no running reclaimd owns {TREE_DIR}; start one, or edit a config file with --config FILE");
    }
    let (cores, _) = tree::read_tree(dir)?;
    let mut table = PerCoreTable::uniform(&cores.keys().copied().collect(), 0);
    for (&c, &t) in &cores {
        table.set_core(c, t)?;
    }
    if let Some(kb) = a.global {
        table.set_global(kb)?;
        tree::write_global(dir, kb)?;
    } else if let Some(list) = &a.cpu {
        let cpus = parse_cpulist(list)?;
        for &c in &cpus {
            let base = table.get(c).with_context(|| format!("cpu{c} is not in {TREE_DIR}"))?;
            let t = thresholds_from(&a, base);
            table.set_core(c, t)?;
        }
        for &c in &cpus {
            tree::write_core(dir, c, &table.get(c).expect("set above"))?;
        }
    }
    if a.apply_global {
        std::fs::write(dir.join("apply_global"), "1\n")?;
    }
    println!("written to {TREE_DIR}; min_free_kbytes = {}", table.global_min_free_kbytes());
    Ok(ExitCode::SUCCESS)
}

/// Group cores with equal thresholds into cpulist keys ("1-15"), leaving out the cores that
/// are at the global default.
fn group_cores(table: &PerCoreTable, global: u64) -> BTreeMap<String, RawCore> {
    let mut by: BTreeMap<(u64, u32, u32), BTreeSet<usize>> = BTreeMap::new();
    for (&c, t) in table.cores() {
        if *t != CoreThresholds::with_defaults(global) {
            by.entry((t.min_free_kbytes, t.pages_low_ratio, t.pages_high_ratio)).or_default().insert(c);
        }
    }
    by.into_iter()
        .map(|((m, l, h), cpus)| {
            (format_cpulist(&cpus), RawCore { min_free_kbytes: m, pages_low_ratio: l, pages_high_ratio: h })
        })
        .collect()
}

fn show(a: ShowArgs) -> anyhow::Result<ExitCode> {
    let dir = Path::new(TREE_DIR);
    let (source, table, roles) = if let Some(path) = &a.config {
        let cfg = load_config(path)?;
        let roles = (format_cpulist(&cfg.protect), format_cpulist(&cfg.reclaim));
        (path.display().to_string(), cfg.table, Some(roles))
    } else if let Some(pid) = tree::running_daemon(dir) {
        let (cores, global) = tree::read_tree(dir)?;
        let mut t = PerCoreTable::uniform(&cores.keys().copied().collect(), global);
        for (&c, &th) in &cores {
            t.set_core(c, th)?;
        }
        if cores.values().all(|c| *c == CoreThresholds::with_defaults(global)) {
            t.set_global(global)?;
        }
        (format!("{TREE_DIR} (reclaimd pid {pid})"), t, None)
    } else {
        let kb = kernel_min_free()?;
        (
            format!("kernel (min_free_kbytes {kb}, no reclaimd running)"),
            PerCoreTable::uniform(&online_cpus()?, kb),
            None,
        )
    };
    let zones = read_zoneinfo()?;
    let wsf: u64 = read_vm_sysctl("watermark_scale_factor")?.parse().unwrap_or(10);
    let kmin = kernel_min_free()?;
    if a.json {
        let cores: Vec<_> = table
            .cores()
            .iter()
            .map(|(c, t)| {
                let zones: Vec<_> = effective_zone_watermarks(t, &zones, kmin, wsf)
                    .into_iter()
                    .map(|(z, wm, raised)| serde_json::json!({"zone": z.name, "watermarks": wm, "raised_above_kernel": raised}))
                    .collect();
                serde_json::json!({"cpu": c, "thresholds": t, "cgroup_pages": t.watermarks(12), "zones": zones})
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "source": source, "min_free_kbytes": table.global_min_free_kbytes(), "cores": cores,
                "roles": roles.map(|(p, r)| serde_json::json!({"protect": p, "reclaim": r})),
            }))?
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!("source: {source}");
    if let Some((p, r)) = roles {
        println!("roles: protect {p}, reclaim {r}");
    }
    println!("min_free_kbytes (global): {}", table.global_min_free_kbytes());
    println!();
    println!("| cpu | min_free_kbytes | low % | high % | pages min/low/high (cgroup) | per zone min/low/high |");
    println!("|---|---:|---:|---:|---|---|");
    for (c, t) in table.cores() {
        let wm = t.watermarks(12);
        let per_zone: Vec<String> = effective_zone_watermarks(t, &zones, kmin, wsf)
            .into_iter()
            .map(|(z, w, raised)| format!("{} {}/{}/{}{}", z.name, w.min, w.low, w.high, if raised { "*" } else { "" }))
            .collect();
        println!(
            "| {c} | {} | {} | {} | {}/{}/{} | {} |",
            t.min_free_kbytes,
            t.pages_low_ratio,
            t.pages_high_ratio,
            wm.min,
            wm.low,
            wm.high,
            per_zone.join(", ")
        );
    }
    println!();
    println!("kernel watermarks now: {}", {
        let v: Vec<String> = zones
            .iter()
            .filter(|z| z.is_populated())
            .map(|z| format!("{} free {} min {} low {} high {}", z.name, z.free, z.min, z.low, z.high))
            .collect();
        v.join("; ")
    });
    println!("* = raised above the kernel's high watermark in system scope, so the worker starts before kswapd");
    Ok(ExitCode::SUCCESS)
}

fn stat(a: StatArgs) -> anyhow::Result<ExitCode> {
    let stop = stop_flag()?;
    let guard = SettingsGuard::new_without_signal_handler();
    let collector = Collector::start(&guard)?;
    let t0 = Instant::now();
    let mut code = ExitCode::SUCCESS;
    if let Some((prog, rest)) = a.cmd.split_first() {
        let mut child =
            std::process::Command::new(prog).args(rest).spawn().with_context(|| format!("running {prog}"))?;
        let status = child.wait()?;
        if !status.success() {
            eprintln!("pagewise: {prog} exited with {status}");
            code = ExitCode::from(status.code().unwrap_or(1).clamp(1, 255) as u8);
        }
    } else {
        let secs = a.seconds.unwrap_or(10.0);
        while !stop.load(Ordering::Relaxed) && t0.elapsed().as_secs_f64() < secs {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let elapsed = t0.elapsed();
    let agg = collector.finish()?;
    drop(guard);
    let mut cpus: BTreeSet<usize> = online_cpus()?;
    cpus.extend(agg.cores.keys());
    if a.json {
        let mut j = agg.to_json();
        j["seconds"] = serde_json::json!(elapsed.as_secs_f64());
        println!("{}", serde_json::to_string_pretty(&j)?);
    } else {
        println!(
            "per-core reclaim over {:.1} s (seed 002 Table 2 layout; latency of begin/end pairs):",
            elapsed.as_secs_f64()
        );
        println!();
        print!("{}", agg.table2(&cpus.into_iter().collect::<Vec<_>>()));
        let mut tasks: Vec<_> = agg.tasks.iter().filter(|(_, t)| t.reclaim.count > 0).collect();
        tasks.sort_by(|a, b| b.1.reclaim.max_us.total_cmp(&a.1.reclaim.max_us));
        if !tasks.is_empty() {
            println!();
            println!("tasks that reclaimed (worst first): ");
            for (pid, t) in tasks.iter().take(10) {
                println!(
                    "  {}-{pid}: {} reclaims, mean {:.1} µs, max {:.1} µs, {} pages; {} slab shrinks",
                    t.task, t.reclaim.count, t.reclaim.mean_us, t.reclaim.max_us, t.reclaim.freed, t.slab.count
                );
            }
        }
    }
    Ok(code)
}
