//! `pagewise testbed`: a cluster of network-namespace hosts on this machine, their links
//! shaped to a network profile (crates/kernel/src/testbed.rs), reached the way a cluster's
//! hosts are: `pagewise testbed exec HOST -- CMD` is an rsh agent for Open MPI's mpirun.
//!
//! `up` starts a holder process that owns the testbed through a settings guard and removes it
//! when it ends (`down` sends it SIGTERM; after a SIGKILL, `down` or the next guard on the
//! machine replays its journal).

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use pagewise_kernel::guard::{apply_undo, recover_dead_journals, Undo};
use pagewise_kernel::netns;
use pagewise_kernel::testbed::{profile, Testbed, TestbedSpec, TestbedState, PROFILES};

/// A cluster on this machine: hosts are network namespaces on a switch, each link shaped to a
/// network profile.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  pagewise testbed up --hosts 4 --net 25gbe
  pagewise testbed exec pwtb-h0 -- mpirun --allow-run-as-root --oversubscribe -np 4 \\
      --host pwtb-h0,pwtb-h1,pwtb-h2,pwtb-h3 --mca plm_rsh_agent \"$(command -v pagewise) testbed exec\" \\
      $(command -v pagewise) mpi -- ./solver
  pagewise testbed down")]
pub struct Args {
    #[command(subcommand)]
    command: Sub,
}

#[derive(clap::Subcommand)]
enum Sub {
    /// Make the hosts and the switch, shape the links, and keep them until `down`.
    Up(UpArgs),
    /// Remove a testbed: its namespaces, links and qdiscs, and end what runs in it.
    Down(NameArg),
    /// Show the testbeds that are up (or one), their hosts, and each link's qdisc counters.
    Status(StatusArgs),
    /// Run a command on a host of a testbed, as ssh would: the words are joined with spaces
    /// and run by /bin/sh in the host's network namespace, with the host's name as host
    /// name. This is what mpirun's rsh agent runs (`--mca plm_rsh_agent "pagewise testbed exec"`).
    Exec(ExecArgs),
    /// List the network profiles.
    Profiles,
}

#[derive(clap::Args)]
struct UpArgs {
    /// The testbed's name (1..8 lowercase letters or digits); hosts are NAME-h0, NAME-h1, …
    #[arg(long, default_value = "pwtb")]
    name: String,
    /// Number of hosts.
    #[arg(long, default_value_t = 4)]
    hosts: usize,
    /// The links' network profile (`pagewise testbed profiles`).
    #[arg(long, default_value = "unshaped")]
    net: String,
    /// The first three octets of the testbed's private /24 (host i is A.B.C.(i+1)).
    #[arg(long, default_value = "10.77.0", value_name = "A.B.C")]
    subnet: String,
    /// Stay in the foreground holding the testbed until SIGINT/SIGTERM.
    #[arg(long)]
    foreground: bool,
}

#[derive(clap::Args)]
struct NameArg {
    /// The testbed's name.
    #[arg(long, default_value = "pwtb")]
    name: String,
}

#[derive(clap::Args)]
struct StatusArgs {
    /// Only this testbed.
    #[arg(long)]
    name: Option<String>,
}

#[derive(clap::Args)]
struct ExecArgs {
    /// A host of a testbed that is up (NAME-hI).
    host: String,
    /// The command, as ssh takes it.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

pub fn run(a: Args) -> Result<ExitCode> {
    match a.command {
        Sub::Up(u) if u.foreground => hold(u),
        Sub::Up(u) => up_detached(u),
        Sub::Down(n) => down(&n.name),
        Sub::Status(s) => status(s.name.as_deref()),
        Sub::Exec(e) => exec(e),
        Sub::Profiles => {
            for p in PROFILES {
                let rate =
                    p.rate_bytes_per_s.map_or("not shaped".to_string(), |r| format!("{:.3} GB/s", r as f64 / 1e9));
                println!("{:<16} {rate:<12} {}", p.name, p.source);
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn parse_subnet(s: &str) -> Result<[u8; 3]> {
    let parts: Vec<u8> = s.split('.').map(|p| p.parse::<u8>()).collect::<Result<_, _>>().ok().unwrap_or_default();
    match parts[..] {
        [a, b, c] => Ok([a, b, c]),
        _ => bail!("--subnet {s:?}: give the first three octets, e.g. 10.77.0"),
    }
}

/// The line a holder prints when its testbed is up.
const READY: &str = "pagewise testbed: ready";

/// Bring the testbed up and hold it until SIGINT/SIGTERM (the guard's signal handler removes
/// it and ends this process).
fn hold(u: UpArgs) -> Result<ExitCode> {
    let spec = TestbedSpec { subnet: parse_subnet(&u.subnet)?, ..TestbedSpec::new(u.name, u.hosts) };
    let bed = Testbed::up(spec, profile(&u.net)?)?;
    let p = bed.profile();
    println!("testbed {} ({} hosts, {}): {}", bed.spec().name, bed.spec().hosts, p.name, p.source);
    for i in 0..bed.spec().hosts {
        println!("  {} {}", bed.host(i), bed.address(i));
    }
    println!("{READY} (pid {})", std::process::id());
    // Nothing more is written to stdout: a detached holder's reader is gone.
    loop {
        std::thread::park();
    }
}

/// Start a holder in its own session, wait for it to say it is ready, and return.
fn up_detached(u: UpArgs) -> Result<ExitCode> {
    let exe = std::env::current_exe().context("locating the pagewise executable")?;
    // The holder outlives this process: its stderr goes to a log file, not to a pipe that
    // closes when we exit.
    std::fs::create_dir_all(pagewise_kernel::testbed::STATE_DIR)
        .with_context(|| format!("creating {}", pagewise_kernel::testbed::STATE_DIR))?;
    let log_path = std::path::Path::new(pagewise_kernel::testbed::STATE_DIR).join(format!("{}.log", u.name));
    let log = std::fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let mut cmd = Command::new(exe);
    cmd.args(["testbed", "up", "--foreground", "--name", &u.name, "--hosts", &u.hosts.to_string()])
        .args(["--net", &u.net, "--subnet", &u.subnet])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log);
    // SAFETY: setsid is async-signal-safe. Its own session: a terminal's Ctrl-C is not for it.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
    let mut child = cmd.spawn().context("starting the testbed holder")?;
    let out = BufReader::new(child.stdout.take().expect("piped"));
    for line in out.lines() {
        let line = line?;
        if line.starts_with(READY) {
            println!("{line}; `pagewise testbed down --name {}` removes it", u.name);
            return Ok(ExitCode::SUCCESS);
        }
        println!("{line}");
    }
    let status = child.wait()?;
    let err = std::fs::read_to_string(&log_path).unwrap_or_default();
    let _ = std::fs::remove_file(&log_path);
    bail!("the testbed holder ended ({status}): {}", err.trim())
}

fn alive(pid: u32) -> bool {
    pagewise_kernel::net::kill(pid as i32, 0).is_ok()
}

fn down(name: &str) -> Result<ExitCode> {
    let Some(state) = TestbedState::load(name)? else {
        // A holder killed by SIGKILL leaves its journal: replay it.
        let errors = recover_dead_journals();
        if netns::exists(&TestbedSpec::new(name, 1).switch()) {
            bail!("testbed {name} has no state file but its switch namespace exists: {errors:?}");
        }
        println!("testbed {name} is not up");
        return Ok(ExitCode::SUCCESS);
    };
    if alive(state.holder_pid) {
        pagewise_kernel::net::kill(state.holder_pid as i32, libc::SIGTERM)?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while alive(state.holder_pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if alive(state.holder_pid) {
            bail!("the holder of testbed {name} (pid {}) did not end within 20 s", state.holder_pid);
        }
    }
    let mut errors = recover_dead_journals();
    // Whatever is left (a holder that died before its journal was written): remove by name.
    let spec = &state.spec;
    let mut steps = vec![Undo::DeleteNetns { name: spec.switch() }];
    steps.extend((0..spec.hosts).map(|i| Undo::DeleteNetns { name: spec.host(i) }));
    steps.push(Undo::RemoveFile { path: format!("{}/{name}.json", pagewise_kernel::testbed::STATE_DIR).into() });
    errors.extend(apply_undo(steps));
    if !errors.is_empty() {
        bail!(
            "testbed {name}: could not remove everything: {}",
            errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; ")
        );
    }
    let _ = std::fs::remove_file(std::path::Path::new(pagewise_kernel::testbed::STATE_DIR).join(format!("{name}.log")));
    println!("testbed {name} is down");
    Ok(ExitCode::SUCCESS)
}

fn status(name: Option<&str>) -> Result<ExitCode> {
    let all = TestbedState::all()?;
    let shown: Vec<&TestbedState> = all.iter().filter(|s| name.is_none_or(|n| s.spec.name == n)).collect();
    if shown.is_empty() {
        println!("no testbed is up{}", name.map(|n| format!(" named {n}")).unwrap_or_default());
        return Ok(ExitCode::SUCCESS);
    }
    for s in shown {
        let p = profile(&s.profile)?;
        let holder = if alive(s.holder_pid) { "" } else { " (holder gone: `pagewise testbed down` removes it)" };
        println!("testbed {}: {} hosts, {}, held by pid {}{holder}", s.spec.name, s.hosts.len(), p.name, s.holder_pid);
        println!("  {}", p.source);
        for (i, (host, addr)) in s.hosts.iter().enumerate() {
            println!("  {host} {addr}");
            for (ns, dev) in [(host.clone(), "eth0".to_string()), (s.spec.switch(), format!("h{i}"))] {
                match netns::qdisc_show(&ns, &dev) {
                    Ok(q) => {
                        for l in q.lines().filter(|l| !l.trim().is_empty()) {
                            println!("    {ns}/{dev}: {}", l.trim());
                        }
                    }
                    Err(e) => println!("    {ns}/{dev}: {e}"),
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Enter the host (network namespace, then a UTS namespace with its name) and become
/// `/bin/sh -c "COMMAND"`.
fn exec(e: ExecArgs) -> Result<ExitCode> {
    if TestbedState::find_host(&e.host)?.is_none() {
        bail!("no testbed that is up has a host {:?} (`pagewise testbed status` lists them)", e.host);
    }
    netns::NetnsFile::open(&e.host)?.enter()?;
    netns::set_own_hostname(&e.host)?;
    let err = Command::new("/bin/sh").arg("-c").arg(e.command.join(" ")).exec();
    bail!("running /bin/sh on {}: {err}", e.host)
}
