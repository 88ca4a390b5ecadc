//! `pagewise mpi`: DLM launched as a parallel job, the way clusters launch work.
//!
//! `mpirun -np N pagewise mpi -- PROGRAM ARGS` (or `srun -n N --mpi=pmix …`): rank 0 runs
//! PROGRAM under the `pagewise run` machinery (run.rs: the preload shim puts its large
//! allocations in DLM memory); ranks 1..N-1 each run a memory server (`pagewise dlm-server`).
//! Nothing is configured by hand: the ranks exchange what they need through the launcher.
//!
//! Why PMIx and not MPI: the exchange is a few strings once (rank 0's secret and host; each
//! server's addresses, ports and capacity), which is exactly PMIx's put/fence/get — the
//! interface through which both Open MPI's mpirun and Slurm's srun (--mpi=pmix) hand
//! processes their job's data, and on which MPI_Init itself is built. Calling it directly
//! needs no MPI_Init (no transport set-up between ranks, no MPI progress rules), no bindgen
//! (rsmpi), and no MPI library in the pagewise binary: pmix/pmix_exchange.c is loaded only by
//! this subcommand.
//!
//! The sequence: (1) rank 0 publishes its identity, host and a fresh per-job secret; fence.
//! (2) Each server rank starts its memory server with the secret (PAGEWISE_DLM_SECRET), on
//! loopback when it shares rank 0's network, else on its host's addresses (or the one in
//! `--network`), and publishes addresses, ports and capacity; fence. (3) Rank 0 opens a
//! control connection to each server rank (control.rs), which both sides watch for the
//! other's death, and runs the program with the servers' addresses and the secret. (4) When
//! the program ends, rank 0 says `end` on each control connection; each server rank stops its
//! server and answers with its statistics, and every rank exits. A rank that dies ends the
//! job with a message: rank 0 ends the program when a server rank is gone (its pages are lost
//! until units are stored with redundancy, issue 24 item 3), and server ranks stop when rank 0
//! is gone.

mod control;
mod plan;
mod pmix;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use pagewise_dlm::parse_size;
use pagewise_dlm::process::ServerProcess;
use pagewise_dlm::server::ServerStats;
use pagewise_kernel::netns;

use crate::run::{DlmOptions, DlmProgram};
use control::{FromRank0, Liveness, Order, ToServer};
use plan::{ServerInfo, Start, KEY_SERVER, KEY_START};
use pmix::Pmix;

/// Run PROGRAM on the memory of the other ranks of a parallel job: rank 0 runs it, ranks
/// 1..N-1 serve memory.
///
/// Start it with the cluster's launcher; addresses, capacities and a per-job secret are
/// exchanged through the launcher's PMIx. Every rank ends when the program ends, with its exit
/// status on rank 0.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  mpirun -np 4 pagewise mpi -- ./solver input.dat
  srun -n 4 --mpi=pmix --kill-on-bad-exit=1 pagewise mpi -- ./solver input.dat
  mpirun -np 3 --host a,b,c pagewise mpi --local-mem 8G --network 10.1.0.0/16 -- ./solver")]
pub struct Args {
    #[command(flatten)]
    dlm: DlmOptions,
    /// Capacity of each memory server rank: a size, or `auto`: 90% of the memory its host has
    /// available (MemAvailable) when it starts, shared among the job's processes on that host.
    #[arg(long, default_value = "auto")]
    server_capacity: String,
    /// Reach memory servers on other hosts on this network (ADDRESS/PREFIX, e.g.
    /// 10.1.0.0/16); default: every IPv4 address of their host, in order.
    #[arg(long, value_name = "CIDR")]
    network: Option<String>,
    /// The program (run by rank 0) and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    program: Vec<String>,
}

/// What every rank knows about itself.
struct Me {
    pmix: Pmix,
    launcher: plan::Launcher,
    /// Machine and network namespace ([`plan::same_network`]).
    identity: String,
    host: String,
}

/// How often the ranks look at their program, server and control connections.
const STEP: Duration = Duration::from_millis(50);

pub fn run(a: Args) -> Result<ExitCode> {
    let env: BTreeMap<String, String> = std::env::vars().collect();
    let launcher = plan::detect_launcher(&env)?;
    // Every rank checks every option, so a bad flag fails the whole job alike.
    a.dlm.check()?;
    crate::run::ensure_kernel_faults_served()?;
    let capacity = CapacityFlag::parse(&a.server_capacity)?;
    let network = a.network.as_deref().map(plan::parse_network).transpose()?;
    let pmix = Pmix::init()?;
    plan::check_rank(&launcher, pmix.rank, pmix.size)?;
    let capacity = match capacity {
        CapacityFlag::Bytes(n) => n,
        CapacityFlag::Auto(avail) => avail / 10 * 9 / u64::from(pmix.local_size()?),
    };
    let identity = format!(
        "{}/{}",
        pagewise_kernel::error::read_trimmed("/proc/sys/kernel/random/boot_id")?,
        netns::current_netns_id()?
    );
    let me = Me { pmix, launcher, identity, host: netns::hostname()? };
    if me.pmix.rank == 0 {
        rank0(me, &a)
    } else {
        server_rank(me, capacity, network)
    }
}

/// `--server-capacity`.
enum CapacityFlag {
    Bytes(u64),
    /// `auto`, with MemAvailable.
    Auto(u64),
}

impl CapacityFlag {
    fn parse(s: &str) -> Result<Self> {
        if s == "auto" {
            let m = pagewise_kernel::procfs::read_meminfo()?;
            let avail = m.mem_available.ok_or_else(|| anyhow!("/proc/meminfo has no MemAvailable (Linux 3.14+)"))?;
            return Ok(CapacityFlag::Auto(avail));
        }
        let n = parse_size(s)? as u64;
        if n == 0 {
            bail!("--server-capacity 0 holds nothing");
        }
        Ok(CapacityFlag::Bytes(n))
    }
}

/// `program` as rank 0 would start it: a path, or a name found in PATH.
fn find_program(program: &str) -> Result<()> {
    let found = if program.contains('/') {
        Path::new(program).is_file()
    } else {
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file())).unwrap_or(false)
    };
    if !found {
        let cwd = std::env::current_dir().map(|d| d.display().to_string()).unwrap_or_default();
        bail!("{program}: no such program (rank 0 runs in {cwd})");
    }
    Ok(())
}

/// A fresh per-job secret from the kernel's random source.
fn new_secret() -> Result<String> {
    let mut bytes = [0u8; 32];
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("reading /dev/urandom for the job's secret")?;
    Ok(plan::secret_from(&bytes))
}

fn publish<T: serde::Serialize>(pmix: &Pmix, key: &str, value: &std::result::Result<T, String>) -> Result<()> {
    pmix.put(key, &serde_json::to_string(value)?)
}

fn fetch<T: serde::de::DeserializeOwned>(pmix: &Pmix, rank: u32, key: &str) -> Result<std::result::Result<T, String>> {
    let text = pmix.get(rank, key)?.ok_or_else(|| anyhow!("rank {rank} published no {key}"))?;
    serde_json::from_str(&text).with_context(|| format!("rank {rank}'s {key}: {text:?}"))
}

fn rank0(me: Me, a: &Args) -> Result<ExitCode> {
    let start = find_program(&a.program[0])
        .and_then(|()| Ok(Start { identity: me.identity.clone(), host: me.host.clone(), secret: new_secret()? }));
    publish(&me.pmix, KEY_START, &start.as_ref().map_err(|e| format!("{e:#}")))?;
    me.pmix.fence("start")?;
    let start = start?;
    me.pmix.fence("servers")?;

    // Every server rank's address, then a control connection to each.
    let dead_peer = (a.dlm.fault_timeout() > 0).then(|| Duration::from_secs(a.dlm.fault_timeout()));
    let mut problems = Vec::new();
    let mut servers: Vec<(ServerInfo, SocketAddr, ToServer)> = Vec::new();
    for r in 1..me.pmix.size {
        match fetch::<ServerInfo>(&me.pmix, r, KEY_SERVER)? {
            Err(e) => problems.push(format!("rank {r} could not start its memory server: {e}")),
            Ok(info) => match connect(&info, r, &start.secret, dead_peer) {
                Ok((addr, link)) => servers.push((info, addr, link)),
                Err(e) => problems.push(format!("{e:#}")),
            },
        }
    }
    if !problems.is_empty() {
        end_servers(servers);
        bail!("the job cannot start:\n  {}", problems.join("\n  "));
    }
    let total: u64 = servers.iter().map(|(i, ..)| i.capacity).sum();
    eprintln!(
        "pagewise mpi: {} ranks under {}; rank 0 on {} runs {}; {} memory server(s), {} in all:",
        me.pmix.size,
        me.launcher.name,
        me.host,
        a.program[0],
        servers.len(),
        pagewise_eval::human_bytes(total)
    );
    for (i, (info, addr, _)) in servers.iter().enumerate() {
        eprintln!("  rank {} on {}: {addr} ({})", i + 1, info.host, pagewise_eval::human_bytes(info.capacity));
    }

    let addrs: Vec<String> = servers.iter().map(|(_, addr, _)| addr.to_string()).collect();
    let mut program = DlmProgram::prepare(&a.dlm, &addrs, &a.program)?;
    let cmd = program.command();
    for (k, _) in std::env::vars_os() {
        if plan::is_launcher_variable(&k.to_string_lossy()) {
            cmd.env_remove(&k);
        }
    }
    // The memory servers take only clients that know the job's secret.
    cmd.env("PAGEWISE_DLM_SECRET", &start.secret);
    // SAFETY: the closure only calls prctl, which is async-signal-safe. The program ends with
    // rank 0 when the launcher ends the job.
    unsafe {
        cmd.pre_exec(|| {
            pagewise_kernel::net::set_parent_death_signal(libc::SIGTERM)
                .map_err(|e| std::io::Error::from_raw_os_error(e.errno().unwrap_or(libc::EINVAL)))
        })
    };
    // The launcher's SIGTERM ends the program (which then ends its rank); a terminal's
    // Ctrl-C reaches the program itself (`foreground`).
    let (mut child, foreground) = program.spawn()?;
    let redundancy = a.dlm.redundancy()?;
    let mut gone: Vec<u32> = Vec::new();
    let status = loop {
        if pagewise_kernel::signal::child_ended(child.id(), false)? {
            drop(foreground);
            break child.wait()?;
        }
        for (info, addr, link) in servers.iter_mut() {
            if gone.contains(&link.rank) {
                continue;
            }
            if let Liveness::Gone(why) = link.check() {
                gone.push(link.rank);
                // With redundancy the program's runtime reads the lost pieces from the other
                // servers and ends the program itself if too many are lost at once.
                if gone.len() <= redundancy.tolerated() {
                    eprintln!(
                        "pagewise mpi: memory server rank {} on {} ({addr}) is gone: {why}. Its pieces are read \
                         from the others ({redundancy}); {} goes on.",
                        link.rank, info.host, a.program[0]
                    );
                    continue;
                }
                eprintln!(
                    "pagewise mpi: memory server rank {} on {} ({addr}) is gone: {why}. Its pages are lost: \
                     ending {} and the job.",
                    link.rank, info.host, a.program[0]
                );
                drop(foreground);
                end_program(&mut child);
                return Ok(ExitCode::from(1));
            }
        }
        std::thread::sleep(STEP);
    };

    let mut stats = ServerStats::default();
    for (info, _, link) in servers {
        let rank = link.rank;
        if gone.contains(&rank) {
            continue;
        }
        match link.end(Duration::from_secs(30)).and_then(|s| Ok(serde_json::from_str::<ServerStats>(&s)?)) {
            Ok(s) => {
                stats.requests += s.requests;
                stats.errors += s.errors;
                stats.bytes_in += s.bytes_in;
                stats.bytes_out += s.bytes_out;
            }
            Err(e) => eprintln!("pagewise mpi: rank {rank} on {}: no statistics at the end: {e:#}", info.host),
        }
    }
    eprintln!(
        "pagewise mpi: the memory servers served {} requests ({} errors), {} in, {} out",
        stats.requests,
        stats.errors,
        pagewise_eval::human_bytes(stats.bytes_in),
        pagewise_eval::human_bytes(stats.bytes_out)
    );
    me.pmix.finalize()?;
    Ok(program.finish(status, "pagewise mpi"))
}

/// Open the control connection to server rank `rank` at the first of its addresses that
/// answers; the memory server is at the same address.
fn connect(info: &ServerInfo, rank: u32, secret: &str, dead_peer: Option<Duration>) -> Result<(SocketAddr, ToServer)> {
    let mut tried = Vec::new();
    for ip in &info.addresses {
        let control = SocketAddr::from((*ip, info.control_port));
        match ToServer::connect(control, rank, secret, dead_peer) {
            Ok(link) => return Ok((SocketAddr::from((*ip, info.port)), link)),
            Err(e) => tried.push(format!("{control}: {e:#}")),
        }
    }
    bail!(
        "rank {rank} on {} cannot be reached from rank 0 ({}); give --network ADDRESS/PREFIX to pick the network",
        info.host,
        if tried.is_empty() { "it has no address".to_string() } else { tried.join("; ") }
    )
}

/// End the server ranks that did start, when the job cannot.
fn end_servers(servers: Vec<(ServerInfo, SocketAddr, ToServer)>) {
    for (_, _, link) in servers {
        let _ = link.end(Duration::from_secs(10));
    }
}

/// SIGTERM, then SIGKILL after 3 s.
fn end_program(child: &mut std::process::Child) {
    let _ = pagewise_kernel::net::kill(child.id() as i32, libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(STEP);
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn server_rank(me: Me, capacity: u64, network: Option<(Ipv4Addr, u8)>) -> Result<ExitCode> {
    let rank = me.pmix.rank;
    me.pmix.fence("start")?;
    let start = match fetch::<Start>(&me.pmix, 0, KEY_START)? {
        Ok(s) => s,
        // Rank 0 says why; the job ends.
        Err(_) => return Ok(ExitCode::from(1)),
    };
    let started = start_server(&me, &start, capacity, network);
    let published = started.as_ref().map(|(info, ..)| info.clone()).map_err(|e| format!("{e:#}"));
    publish(&me.pmix, KEY_SERVER, &published)?;
    me.pmix.fence("servers")?;
    let (_, mut server, listen) = started?;

    // Wait for rank 0's control connection, then for its `end`; watch the server meanwhile.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut link = loop {
        if let Some(l) = listen.accept(STEP)? {
            break l;
        }
        if let Some(st) = server.try_wait()? {
            bail!("rank {rank} on {}: the memory server exited ({st}) before rank 0 connected", me.host);
        }
        if Instant::now() > deadline {
            bail!("rank {rank} on {}: rank 0 did not connect within 120 s", me.host);
        }
    };
    drop(listen);
    loop {
        match link.poll(STEP) {
            Order::None => {}
            Order::End => break,
            Order::Gone(why) => {
                eprintln!(
                    "pagewise mpi: rank {rank} on {}: rank 0 is gone ({why}); stopping the memory server",
                    me.host
                );
                let _ = server.stop();
                return Ok(ExitCode::from(1));
            }
        }
        if let Some(st) = server.try_wait()? {
            eprintln!(
                "pagewise mpi: rank {rank} on {}: the memory server exited ({st}) while the program ran; ending the job",
                me.host
            );
            return Ok(ExitCode::from(1));
        }
    }
    let stats = server.stop().context("stopping the memory server")?;
    link.finish(&stats)?;
    me.pmix.finalize()?;
    Ok(ExitCode::SUCCESS)
}

/// Start this rank's memory server and its control listener, where rank 0 can reach them.
fn start_server(
    me: &Me,
    start: &Start,
    capacity: u64,
    network: Option<(Ipv4Addr, u8)>,
) -> Result<(ServerInfo, ServerProcess, FromRank0)> {
    let local: Vec<(Ipv4Addr, u8)> = netns::ipv4_addresses()?.into_iter().map(|a| (a.address, a.prefix_len)).collect();
    let same = plan::same_network(&start.identity, &me.identity);
    let bind = plan::listen_address(same, &local, network)?;
    let cmd = Command::new(std::env::current_exe().context("locating the pagewise executable")?);
    let secret = pagewise_dlm::auth::Secret::new(&start.secret)?;
    let server = ServerProcess::spawn_cmd(cmd, &format!("{bind}:0"), &capacity.to_string(), &secret)
        .with_context(|| format!("starting a memory server on {bind}"))?;
    let port: u16 = server
        .addr
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| anyhow!("the memory server printed no port: {}", server.addr))?;
    let listen = FromRank0::listen(bind, me.pmix.rank, &start.secret)?;
    let info = ServerInfo {
        host: me.host.clone(),
        addresses: plan::advertised(bind, &local),
        port,
        control_port: listen.port()?,
        capacity,
    };
    Ok((info, server, listen))
}
