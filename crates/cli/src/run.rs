//! `pagewise run`: an unmodified program on DLM memory. Starts (or checks) the memory servers,
//! then runs the program with the LD_PRELOAD shim (`preload/`), which routes its large
//! allocations into DLM areas; stops the servers it started when the program ends and prints
//! the page-size tuner's decisions.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use pagewise_dlm::auth::{Secret, SECRET_ENV};
use pagewise_dlm::process::ServerProcess;
use pagewise_dlm::transport::TcpTransport;
use pagewise_dlm::{parse_size, Redundancy};
use pagewise_kernel::private_dir::PrivateDir;

/// The shim, compiled from preload/*.c by build.rs.
pub(crate) static SHIM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libpagewise_preload.so"));

/// Run PROGRAM with its large allocations in DLM memory (memory of `pagewise dlm-server`s).
#[derive(clap::Args)]
#[command(
    after_help = "Example:\n  pagewise run --local-mem 64M --spawn-servers 2 --page-size auto -- ./solver input.dat"
)]
pub struct Args {
    /// Memory servers to use, HOST:PORT,HOST:PORT (default: spawn local ones). Their shared
    /// secret is taken from PAGEWISE_DLM_SECRET.
    #[arg(long, conflicts_with = "spawn_servers")]
    servers: Option<String>,
    /// Spawn this many local memory servers for the run (the default when --servers is not
    /// given: 1, or with --redundancy one more than a block's pieces, so lost pieces have a
    /// server to be rebuilt onto), with a secret of this run handed to them and the program in
    /// the environment; they are stopped when the program ends.
    #[arg(long)]
    spawn_servers: Option<usize>,
    /// Capacity of each spawned server.
    #[arg(long, default_value = "64G")]
    server_capacity: String,
    #[command(flatten)]
    dlm: DlmOptions,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    program: Vec<String>,
}

/// How a program runs on DLM memory: the options `pagewise run` and `pagewise mpi` share.
#[derive(clap::Args, Clone, Debug)]
pub struct DlmOptions {
    /// Most bytes of the program's DLM memory kept on this host.
    #[arg(long, default_value = "64M")]
    local_mem: String,
    /// The paging unit: a size (4K..64M, a power of two), or `auto`: the tuner tries sizes from
    /// 4 KiB to --max-page-size while the program runs, starting in the middle, and keeps the
    /// one it measures fastest (docs/dlm-run.md).
    #[arg(long, default_value = "auto")]
    page_size: String,
    /// Largest unit under `--page-size auto`.
    #[arg(long, default_value = "1M")]
    max_page_size: String,
    /// Allocations of at least this many bytes go to DLM memory; smaller ones stay in libc.
    #[arg(long, default_value = "1M")]
    min_alloc: String,
    /// Also put the program's zero-initialised static data (.bss) in DLM memory.
    #[arg(long)]
    bss: bool,
    /// Stop the program when a memory server does not answer a fault within this many
    /// seconds (0: wait forever).
    #[arg(long, default_value_t = 30)]
    fault_timeout: u64,
    /// Write the tuner's decisions (JSON) to this file.
    #[arg(long)]
    decisions: Option<PathBuf>,
    /// How the program's pages are stored across the memory servers: `none` (a lost server
    /// ends the program), `ec:K+M` (each page cut into K pieces plus M Reed-Solomon parity
    /// pieces, on K+M different servers: any M may be lost) or `copies:N` (N full copies).
    /// Lost pieces are rebuilt onto a server holding no piece of their block, when there is
    /// one (give more servers than pieces).
    #[arg(long, default_value = "none")]
    redundancy: String,
    /// Leave the program's CPUs alone. By default, while the program has one thread, the
    /// fault handler pins that thread and itself to one CPU, and gives the masks back when the
    /// program starts more threads: a fault's two wake-ups and its TLB flushes then stay on
    /// one CPU (docs/dlm-run.md, "The handler keeps the program company").
    #[arg(long)]
    no_colocate: bool,
    /// What a child made by fork(2) without exec gets of the program's routed memory: `copy`,
    /// its own copy as fork gives (the forking thread waits while every routed byte is copied
    /// to the child: a fork + exec of a process with 200 MiB routed takes 0.15–0.25 s here
    /// against 8 ms plain), or `none`: nothing, and fork returns at once — for programs that
    /// fork only to exec; a child that reads its parent's routed memory then faults (SIGSEGV),
    /// its allocator's own fork handler too when the allocator keeps its state there (jemalloc in
    /// a program with threads: rustc).
    #[arg(long, value_name = "WHAT", default_value = "copy", value_parser = ["copy", "none"])]
    on_fork: String,
}

/// [`DlmOptions`] parsed and checked.
struct Checked {
    local: usize,
    min_alloc: usize,
    base: usize,
    max_set: u32,
    set_count: u32,
    auto: bool,
    redundancy: Redundancy,
}

impl DlmOptions {
    /// Parse and check the sizes, before anything is started.
    fn checked(&self) -> Result<Checked> {
        let local = parse_size(&self.local_mem)?;
        let min_alloc = parse_size(&self.min_alloc)?;
        let (base, mut max_set, mut set_count, auto) = page_sizes(&self.page_size, &self.max_page_size)?;
        if auto {
            // Under auto the largest unit is a ceiling, not a demand: it shrinks to fit a small
            // local memory (two units at least).
            while max_set > 1 && local < 2 * base * max_set as usize {
                max_set /= 2;
            }
            set_count = max_set;
        }
        if local < 2 * base * max_set as usize {
            bail!(
                "--local-mem {} is below two of the largest units ({} bytes)",
                self.local_mem,
                2 * base * max_set as usize
            );
        }
        let redundancy = Redundancy::parse(&self.redundancy).map_err(|e| anyhow::anyhow!("--redundancy: {e}"))?;
        Ok(Checked { local, min_alloc, base, max_set, set_count, auto, redundancy })
    }

    /// The storage scheme asked for (`--redundancy`).
    pub(crate) fn redundancy(&self) -> Result<Redundancy> {
        self.checked().map(|c| c.redundancy)
    }

    /// Check the options without starting anything (a launcher's ranks all check them, so a
    /// bad flag fails every rank at once).
    pub(crate) fn check(&self) -> Result<()> {
        self.checked().map(drop)
    }

    /// Seconds a fault may wait for a server (0: forever).
    pub(crate) fn fault_timeout(&self) -> u64 {
        self.fault_timeout
    }
}

/// A program ready to start on the DLM memory of `servers`, under the preload shim.
pub(crate) struct DlmProgram {
    cmd: Command,
    name: String,
    decisions: Option<PathBuf>,
    /// The decisions file is ours (a temporary file), removed after it is printed.
    decisions_ours: bool,
    shim: EmbeddedFile,
}

impl DlmProgram {
    /// Set up `program` to run with its large allocations in the memory of `servers`.
    pub(crate) fn prepare(opts: &DlmOptions, servers: &[String], program: &[String]) -> Result<Self> {
        let c = opts.checked()?;
        c.redundancy.check(c.base, servers.len()).map_err(|e| anyhow::anyhow!("--redundancy: {e}"))?;
        crate::elf::ensure_preloadable(&program[0])?;
        let lib = libpagewise()?;
        let shim = EmbeddedFile::write(SHIM, "libpagewise_preload.so")?;
        let decisions = match &opts.decisions {
            Some(p) => Some(p.clone()),
            // In the run's private directory: no other user can plant or redirect it.
            None if c.auto => Some(shim.dir.join("decisions.json")),
            None => None,
        };
        let preload = match std::env::var("LD_PRELOAD") {
            Ok(v) if !v.is_empty() => format!("{}:{v}", shim.path.display()),
            _ => shim.path.display().to_string(),
        };
        let mut cmd = Command::new(&program[0]);
        cmd.args(&program[1..])
            .env("LD_PRELOAD", preload)
            .env("PAGEWISE_PRELOAD_ARENA", "dlm")
            .env("PAGEWISE_PRELOAD_LIB", &lib)
            .env("PAGEWISE_PRELOAD_MIN_ALLOC", c.min_alloc.to_string())
            .env("PAGEWISE_PRELOAD_FORK", &opts.on_fork)
            .env("PAGEWISE_PRELOAD_REPORT", "program")
            .env("PAGEWISE_PRELOAD_EXITED", shim.exit_marker())
            .env("PAGEWISE_PRELOAD_OTHERS", shim.others_dir()?)
            .env("PAGEWISE_DLM_SERVERS", servers.join(","))
            .env("PAGEWISE_DLM_LOCAL_MEM", c.local.to_string())
            .env("PAGEWISE_DLM_PAGE_SIZE", c.base.to_string())
            .env("PAGEWISE_DLM_MAX_SET", c.max_set.to_string())
            .env("PAGEWISE_DLM_SET_COUNT", c.set_count.to_string())
            .env("PAGEWISE_DLM_AUTO_TUNE", if c.auto { "1" } else { "0" })
            // The handler thread serves faults the kernel takes for the program (read(2) into a
            // malloc'd array); SIGBUS mode would return EFAULT there.
            .env("PAGEWISE_DLM_FAULT_MODE", "thread")
            .env("PAGEWISE_DLM_DONTFORK", "1")
            .env("PAGEWISE_DLM_REDUNDANCY", c.redundancy.to_string())
            .env("PAGEWISE_DLM_FAULT_TIMEOUT_MS", (opts.fault_timeout * 1000).to_string())
            .env("PAGEWISE_DLM_COLOCATE", if opts.no_colocate { "0" } else { "1" });
        // What a process the pinned program starts gets back (`runtime/colocate.rs`).
        if let Some((key, cpus)) = pagewise_kernel::colocate::program_cpus_env() {
            cmd.env(key, cpus);
        }
        if opts.bss {
            cmd.env("PAGEWISE_PRELOAD_BSS", "1");
        }
        if let Some(d) = &opts.decisions {
            // The caller's own file, named on the command line: a fresh one for this run.
            let _ = std::fs::remove_file(d);
        }
        if let Some(d) = &decisions {
            cmd.env("PAGEWISE_DLM_DECISIONS", d);
        }
        Ok(DlmProgram { cmd, name: program[0].clone(), decisions, decisions_ours: opts.decisions.is_none(), shim })
    }

    /// The command, to add to its environment or set-up before it starts.
    pub(crate) fn command(&mut self) -> &mut Command {
        &mut self.cmd
    }

    /// Start the program as the wrapper's foreground job ([`crate::foreground`]).
    pub(crate) fn spawn(&mut self) -> Result<(std::process::Child, crate::foreground::Foreground)> {
        crate::foreground::spawn(&mut self.cmd, &self.name)
    }

    /// After the program ended: print the tuner's decisions and give its exit code (128+N
    /// when signal N killed it, as a shell does). `who` starts the message about a signal.
    pub(crate) fn finish(self, status: std::process::ExitStatus, who: &str) -> ExitCode {
        if let Some(d) = &self.decisions {
            print_decisions(d, self.decisions_ours, who);
        }
        self.shim.tell_if_exit_handlers_skipped(status, who, &self.name);
        self.shim.tell_what_others_did();
        crate::foreground::exit_code(status, who, &self.name)
    }

    /// Start the program and wait for it as the wrapper's foreground job
    /// ([`crate::foreground`]): the wrapper cleans up after it however it ends.
    pub(crate) fn run(&mut self) -> Result<std::process::ExitStatus> {
        let (child, foreground) = self.spawn()?;
        crate::foreground::wait(child, foreground, &self.name)
    }
}

/// libpagewise.so next to this executable (cargo puts both in target/release).
pub(crate) fn libpagewise() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the pagewise executable")?;
    let dir = exe.parent().context("the pagewise executable has no directory")?;
    for cand in [dir.join("libpagewise.so"), dir.join("../lib/libpagewise.so")] {
        if cand.is_file() {
            return Ok(cand.canonicalize()?);
        }
    }
    bail!("libpagewise.so is not next to {} (build it: cargo build --release -p pagewise-capi)", exe.display())
}

/// A shared object carried in this binary (the shim, the PMIx exchange), written to a private
/// directory of this run (mkdtemp, mode 0700: no other user can plant or redirect anything
/// there; issue 23), removed with it when the run ends. The directories of runs that were
/// killed before they could remove theirs are removed by the next run
/// ([`pagewise_kernel::private_dir::sweep_abandoned`]).
pub(crate) struct EmbeddedFile {
    pub(crate) dir: PrivateDir,
    pub(crate) path: PathBuf,
}

/// The tag of the runs' private directories (`/tmp/pagewise-run.` and six random characters).
const RUN_DIR_TAG: &str = "run";

impl EmbeddedFile {
    /// The file the shim creates (PAGEWISE_PRELOAD_EXITED) as the program runs its exit
    /// handlers, the ones that write its end-of-run report.
    pub(crate) fn exit_marker(&self) -> PathBuf {
        self.dir.join("exited")
    }

    /// The directory (made here) where the processes the program starts leave what they put
    /// on the arena (PAGEWISE_PRELOAD_OTHERS, preload/others.c).
    pub(crate) fn others_dir(&self) -> Result<PathBuf> {
        let dir = self.dir.join("others");
        match std::fs::create_dir(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                Err(e).with_context(|| format!("creating {}", dir.display()))
            }
            _ => Ok(dir),
        }
    }

    /// After the program ended: what the processes it started put on the arena, and what those
    /// it forked kept in local memory (a line each, when there are any).
    pub(crate) fn tell_what_others_did(&self) {
        for line in crate::others::summary(&crate::others::read(&self.dir.join("others"))) {
            eprintln!("{line}");
        }
    }

    /// After a program that exited (not killed) without the shim's mark: say why no end-of-run
    /// report came. A Go program leaves by the exit_group system call itself, as `_exit` does.
    pub(crate) fn tell_if_exit_handlers_skipped(&self, status: std::process::ExitStatus, who: &str, name: &str) {
        if status.code().is_some() && !self.exit_marker().exists() {
            eprintln!(
                "{who}: {name} ended without running its exit handlers (it made the exit_group system call itself, \
                 as Go programs and _exit do): no end-of-run report"
            );
        }
    }

    pub(crate) fn write(bytes: &[u8], name: &str) -> Result<Self> {
        pagewise_kernel::private_dir::sweep_abandoned(RUN_DIR_TAG, std::time::Duration::from_secs(60));
        let dir = PrivateDir::new(RUN_DIR_TAG).context("creating the run's private directory")?;
        let path = dir.join(name);
        dir.create_file(name)
            .map_err(anyhow::Error::from)
            .and_then(|mut f| f.write_all(bytes).map_err(anyhow::Error::from))
            .with_context(|| format!("writing {name} to {}", path.display()))?;
        Ok(EmbeddedFile { dir, path })
    }
}

/// Refuse, before the program starts, to run it where its routed memory would break its system
/// calls. The shim's fault handler serves the faults the kernel takes on the program's behalf
/// (a read(2) into a page on a server), and only a userfaultfd opened without
/// UFFD_USER_MODE_ONLY sees those: with vm.unprivileged_userfaultfd = 0 an ordinary user gets
/// the other kind, and the program's read(2) would fail with EFAULT.
pub(crate) fn ensure_kernel_faults_served() -> Result<()> {
    pagewise_kernel::uffd::serves_kernel_faults().map_err(|e| {
        anyhow::anyhow!(
            "this user can open only a userfaultfd that ignores the kernel's own accesses ({e}), \
             so a read(2) into the program's routed memory would fail with EFAULT; the program was not started. \
             Run as root, give this user read-write access to /dev/userfaultfd (Linux 6.1+), \
             or set `sysctl vm.unprivileged_userfaultfd=1`"
        )
    })
}

/// Check that every server accepts a connection and the secret, before the program starts.
fn check_reachable(servers: &[String]) -> Result<()> {
    for (i, s) in servers.iter().enumerate() {
        if let Err(e) = TcpTransport::open(s, None, Some(Duration::from_secs(3))) {
            let what = match e.kind() {
                std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::InvalidInput => "refused this run",
                std::io::ErrorKind::InvalidData => "does not speak the DLM protocol",
                _ => "is unreachable",
            };
            bail!("memory server {i} ({s}) {what}: {e}; the program was not started");
        }
    }
    Ok(())
}

/// (base page, max set, set count, auto) for `--page-size`. The base page is always 4 KiB:
/// the paging unit is a whole number of pages, and every call a program makes on part of its
/// memory (madvise, munmap, mprotect: whole pages) falls on base-page boundaries.
fn page_sizes(page: &str, max: &str) -> Result<(usize, u32, u32, bool)> {
    const BASE: usize = 4 << 10;
    if page == "auto" {
        let max = parse_size(max)?;
        if !max.is_power_of_two() || !(BASE..=(64 << 20)).contains(&max) {
            bail!("--max-page-size {max} must be a power of two in 4K..64M");
        }
        let sets = (max / BASE) as u32;
        return Ok((BASE, sets, sets, true));
    }
    let size = parse_size(page)?;
    if !size.is_power_of_two() || !(BASE..=(64 << 20)).contains(&size) {
        bail!("--page-size {page} must be `auto` or a power of two in 4K..64M");
    }
    let sets = (size / BASE) as u32;
    Ok((BASE, sets, sets, false))
}

pub fn run(a: Args) -> Result<ExitCode> {
    a.dlm.check()?;
    ensure_kernel_faults_served()?;
    let mut spawned = Vec::new();
    // Spawned servers get a secret of this run, handed to them and to the program in the
    // environment (never argv); given servers take the caller's PAGEWISE_DLM_SECRET.
    let mut run_secret = None;
    let servers: Vec<String> = match &a.servers {
        Some(list) => {
            let s: Vec<String> = list.split(',').map(|x| x.trim().to_string()).filter(|x| !x.is_empty()).collect();
            if s.is_empty() {
                bail!("--servers names no server");
            }
            check_reachable(&s)?;
            s
        }
        None => {
            let redundancy = a.dlm.redundancy()?;
            let n = a.spawn_servers.unwrap_or(if redundancy.is_redundant() { redundancy.pieces() + 1 } else { 1 });
            if n == 0 || n > 64 {
                bail!("--spawn-servers {n}: give 1..64");
            }
            let bin = std::env::current_exe()?;
            let secret = Secret::generate()?;
            for _ in 0..n {
                let p = ServerProcess::spawn(&bin, &a.server_capacity, &secret).context("starting a memory server")?;
                spawned.push(p);
            }
            run_secret = Some(secret);
            spawned.iter().map(|p| p.addr.clone()).collect()
        }
    };
    let mut program = DlmProgram::prepare(&a.dlm, &servers, &a.program)?;
    if let Some(secret) = &run_secret {
        program.command().env(SECRET_ENV, secret.as_env_value());
    }
    let status = program.run()?;
    for p in spawned {
        let _ = p.stop();
    }
    Ok(program.finish(status, "pagewise run"))
}

/// Print the tuner's per-iteration table (and remove the file if it was ours).
fn print_decisions(path: &Path, ours: bool, who: &str) {
    let Ok(text) = std::fs::read_to_string(path) else { return };
    if ours {
        let _ = std::fs::remove_file(path);
    }
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else { return };
    let n = v["decisions"].as_array().map(|d| d.len()).unwrap_or(0);
    if n > 0 {
        eprintln!("{who}: page-size decisions ({n}):\n{}", abridged(v["table"].as_str().unwrap_or(""), 12));
    }
}

/// A Markdown table with at most `rows` rows: the first and last halves, and a line saying how
/// many are left out (`--decisions FILE` has them all).
fn abridged(table: &str, rows: usize) -> String {
    let lines: Vec<&str> = table.lines().collect();
    let (head, body) = lines.split_at(2.min(lines.len()));
    if body.len() <= rows {
        return table.to_string();
    }
    let mut out: Vec<String> = head.iter().map(|l| l.to_string()).collect();
    out.extend(body[..rows / 2].iter().map(|l| l.to_string()));
    out.push(format!("| … {} more (all of them with --decisions FILE) |", body.len() - rows));
    out.extend(body[body.len() - rows / 2..].iter().map(|l| l.to_string()));
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_size_flags() {
        assert_eq!(page_sizes("auto", "1M").unwrap(), (4 << 10, 256, 256, true));
        assert_eq!(page_sizes("64K", "1M").unwrap(), (4 << 10, 16, 16, false));
        assert_eq!(page_sizes("4K", "1M").unwrap(), (4 << 10, 1, 1, false));
        assert!(page_sizes("48K", "1M").is_err());
        assert!(page_sizes("auto", "2K").is_err());
    }

    #[test]
    fn long_decision_tables_are_abridged() {
        let table = "| a |\n|---|\n| 1 |\n| 2 |\n| 3 |\n| 4 |\n| 5 |";
        assert_eq!(abridged(table, 8), table);
        assert_eq!(abridged(table, 2), "| a |\n|---|\n| 1 |\n| … 3 more (all of them with --decisions FILE) |\n| 5 |");
    }

    #[test]
    fn the_shim_is_embedded() {
        assert_eq!(&SHIM[..4], b"\x7fELF");
    }
}
