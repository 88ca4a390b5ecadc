//! Third-party programs as workloads: how to run a Debian program nobody here wrote — plain,
//! under `pagewise run` (DLM) or under `pagewise hps run` — and what its output must be.
//!
//! Shared by the experiments that run real programs (`dlm-programs`, `hps-programs`) and by the
//! compatibility tests of the CLI (crates/cli/tests/compat_*.rs), so that an experiment and a
//! test mean the same thing by "sort on a 20 MB file" and by "the same output".
//!
//! A [`Job`] is one run of a batch program: its argv, environment and working directory (its
//! inputs generated there by the constructor in [`jobs`]), and how to reduce what it printed to
//! a canonical text ([`Job::canonical`]). The canonical text is what must be identical between
//! a plain run and a run on Pagewise memory: the whole stdout (hashed when large) for programs
//! whose output is deterministic, the self-checks (and sizes) for benchmarks that print their
//! speed (hpcc, 7-Zip's benchmark). [`run`] starts a command in its own process group with a
//! time budget and records its stdout digest, stderr, wall time and peak RSS (wait4(2)).
//! [`servers`] starts redis and memcached and drives them with values checked.

pub mod jobs;
pub mod servers;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};

/// How a program is run.
#[derive(Clone, Debug, PartialEq)]
pub enum Wrap {
    /// On its own.
    Plain,
    /// `pagewise run`: DLM memory.
    Dlm(DlmFlags),
    /// `pagewise hps run --min-alloc MIN`, with `--track-placed` when `track_placed`.
    Hps { min_alloc: u64, track_placed: bool },
}

/// The flags of `pagewise run` the experiments and tests vary.
#[derive(Clone, Debug, PartialEq)]
pub struct DlmFlags {
    /// `None`: `--page-size auto`; otherwise a fixed unit in bytes.
    pub page_size: Option<u64>,
    /// `--max-page-size` under auto.
    pub max_page_size: u64,
    pub local_mem: u64,
    pub servers: usize,
    pub min_alloc: u64,
    /// `--decisions FILE`.
    pub decisions: Option<PathBuf>,
}

impl DlmFlags {
    pub fn args(&self) -> Vec<String> {
        let mut a = vec!["run".to_string()];
        match self.page_size {
            None => {
                a.extend(["--page-size".into(), "auto".into(), "--max-page-size".into(), size_arg(self.max_page_size)])
            }
            Some(s) => a.extend(["--page-size".into(), size_arg(s)]),
        }
        a.extend([
            "--local-mem".into(),
            self.local_mem.to_string(),
            "--spawn-servers".into(),
            self.servers.to_string(),
            "--min-alloc".into(),
            self.min_alloc.to_string(),
        ]);
        if let Some(d) = &self.decisions {
            a.extend(["--decisions".into(), d.display().to_string()]);
        }
        a
    }
}

/// A size as `pagewise run` takes it (`64K`, `1M`, or bytes).
pub fn size_arg(bytes: u64) -> String {
    if bytes.is_multiple_of(1 << 20) {
        format!("{}M", bytes >> 20)
    } else if bytes.is_multiple_of(1 << 10) {
        format!("{}K", bytes >> 10)
    } else {
        bytes.to_string()
    }
}

/// How a job's output is reduced to what must be identical between runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Canon {
    /// The whole stdout (its digest and length).
    Stdout,
    /// The digest and length of a file the program writes in its working directory (removed
    /// before each run).
    File(&'static str),
    /// hpcc: the self-checks and sizes of hpccoutf.txt in the working directory.
    Hpcc,
    /// 7-Zip's benchmark: the dictionary sizes it tested and that it finished (it verifies
    /// its own decompression and exits non-zero on a mismatch).
    SevenZipBench,
    /// Lines `round K VALUE` and `checksum X` kept, times dropped (hps_gather.py).
    Rounds,
}

/// One run of a batch program.
#[derive(Clone, Debug)]
pub struct Job {
    pub name: String,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub canon: Canon,
}

impl Job {
    /// The command for `wrap` (`pagewise` is the CLI binary).
    pub fn command(&self, pagewise: &Path, wrap: &Wrap) -> Command {
        let mut cmd = match wrap {
            Wrap::Plain => Command::new(&self.argv[0]),
            Wrap::Dlm(f) => {
                let mut c = Command::new(pagewise);
                c.args(f.args()).arg("--").arg(&self.argv[0]);
                c
            }
            Wrap::Hps { min_alloc, track_placed } => {
                let mut c = Command::new(pagewise);
                c.args(["hps", "run", "--min-alloc", &min_alloc.to_string()]);
                if *track_placed {
                    c.arg("--track-placed");
                }
                c.arg("--").arg(&self.argv[0]);
                c
            }
        };
        cmd.args(&self.argv[1..]).current_dir(&self.cwd);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    /// Clear what a previous run left in the working directory (hpcc appends to its output).
    pub fn reset(&self) -> anyhow::Result<()> {
        let written = match self.canon {
            Canon::Hpcc => Some("hpccoutf.txt"),
            Canon::File(name) => Some(name),
            _ => None,
        };
        if let Some(name) = written {
            let out = self.cwd.join(name);
            if out.exists() {
                std::fs::remove_file(&out).with_context(|| format!("removing {}", out.display()))?;
            }
        }
        Ok(())
    }

    /// What must be identical between runs, from a finished run's outcome; an error when the
    /// run failed or its self-checks did.
    pub fn canonical(&self, o: &Outcome) -> anyhow::Result<String> {
        match o.status {
            None => bail!("{} did not finish", self.name),
            Some(st) if !st.success() => bail!("{} failed ({st}):\n{}", self.name, tail(&o.stderr, 40)),
            _ => {}
        }
        match self.canon {
            Canon::Stdout => Ok(format!("{} bytes, xxh3 {:016x}", o.stdout.bytes, o.stdout.digest)),
            Canon::File(name) => {
                let path = self.cwd.join(name);
                let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
                Ok(format!("{name}: {} bytes, xxh3 {:016x}", bytes.len(), twox_hash::XxHash3_64::oneshot(&bytes)))
            }
            Canon::Hpcc => {
                let path = self.cwd.join("hpccoutf.txt");
                let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
                hpcc_checks(&text)
            }
            Canon::SevenZipBench => seven_zip_checks(&o.stdout.head),
            Canon::Rounds => Ok(o
                .stdout
                .head
                .lines()
                .filter_map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    match f.as_slice() {
                        ["round", k, _secs] => Some(format!("round {k}")),
                        ["checksum", _] => Some(l.to_string()),
                        _ => None,
                    }
                })
                .collect::<Vec<_>>()
                .join("\n")),
        }
    }
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// hpcc's self-checks from hpccoutf.txt: every verification line (RandomAccess's error counts,
/// PTRANS's residual checks, STREAM's validation, the nodes with errors of DGEMM, FFT and
/// STREAM, HPL's PASSED/FAILED without its residual), the problem sizes and `Success=`. An
/// error when a check failed or the run did not end with `Success=1`.
pub fn hpcc_checks(text: &str) -> anyhow::Result<String> {
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        let keep = line.starts_with("Found ")
            || line.contains("completed and passed residual checks")
            || line.contains("completed and failed residual checks")
            || line.starts_with("Solution Validates")
            || line.starts_with("Failed Validation")
            || line.starts_with("Node(s) with error")
            || (line.contains("_N=") && !line.contains(' '))
            || line.starts_with("Success=");
        if keep {
            out.push(line.to_string());
        } else if line.starts_with("||Ax-b||") {
            // The residual's value depends on summation order; its verdict must not.
            out.push(format!("HPL {}", line.split_whitespace().last().unwrap_or("")));
        }
    }
    ensure!(out.iter().any(|l| l == "Success=1"), "hpcc did not report Success=1:\n{}", out.join("\n"));
    ensure!(
        !out.iter().any(|l| l.contains("FAILED") || l.contains("(failed)")),
        "hpcc: a check failed:\n{}",
        out.join("\n")
    );
    ensure!(
        out.iter().filter(|l| l.starts_with("Node(s) with error")).all(|l| l.ends_with(" 0")),
        "hpcc: a node reported errors:\n{}",
        out.join("\n")
    );
    Ok(out.join("\n"))
}

/// 7-Zip's benchmark: the dictionary sizes of its result lines (`22:`, `23:` …) and its `Tot:`
/// line's presence. Its speeds vary; its verification does not (a decoding error ends it with
/// an error message and a non-zero status).
pub fn seven_zip_checks(stdout: &str) -> anyhow::Result<String> {
    let dicts: Vec<&str> = stdout
        .lines()
        .filter_map(|l| {
            let d = l.split_whitespace().next()?.strip_suffix(':')?;
            d.parse::<u32>().ok().map(|_| d)
        })
        .collect();
    ensure!(!dicts.is_empty(), "7-Zip's benchmark printed no result line:\n{}", tail(stdout, 20));
    ensure!(
        stdout.lines().any(|l| l.starts_with("Tot:")),
        "7-Zip's benchmark printed no Tot: line:\n{}",
        tail(stdout, 20)
    );
    ensure!(!stdout.contains("ERROR"), "7-Zip's benchmark reports an error:\n{}", tail(stdout, 20));
    Ok(format!("dictionaries 2^{}", dicts.join(" 2^")))
}

/// 7-Zip's benchmark total rating (MIPS) from its `Tot:` line: the last number.
pub fn seven_zip_rating(stdout: &str) -> Option<f64> {
    stdout.lines().find(|l| l.starts_with("Tot:"))?.split_whitespace().last()?.parse().ok()
}

/// What a run printed on stdout: a digest of all of it, its length, and its first 256 KiB as
/// text (enough for every canonical form but [`Canon::Stdout`]'s, which uses the digest).
#[derive(Clone, Debug, Default)]
pub struct Captured {
    pub digest: u64,
    pub bytes: u64,
    pub head: String,
}

/// A finished (or stopped) run.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// None: stopped at the time budget.
    pub status: Option<ExitStatus>,
    pub wall: f64,
    pub stdout: Captured,
    pub stderr: String,
    /// Peak RSS of the process and its waited-for descendants (wait4's ru_maxrss), bytes.
    pub max_rss: u64,
}

impl Outcome {
    pub fn finished(&self) -> bool {
        self.status.is_some()
    }
}

const HEAD: usize = 256 << 10;
/// How often [`run`] checks the child and calls its tick.
pub const TICK: Duration = Duration::from_millis(10);
/// How long a run stopped at its budget has, after SIGTERM, before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// Stop the process group of child `leader`, which is not reaped yet (so neither id can have
/// been reused): SIGTERM to the leader first — a wrapper (`pagewise run`) passes it on to its
/// program and cleans up after it (its private directory, its servers) — then, after a grace
/// period, SIGKILL to whatever of the group is left. The caller reaps the leader.
pub(crate) fn stop_group(leader: i32) -> anyhow::Result<()> {
    // SAFETY: kill(2) takes no pointers.
    unsafe { libc::kill(leader, libc::SIGTERM) };
    let grace = Instant::now() + STOP_GRACE;
    while Instant::now() < grace && !pagewise_kernel::signal::child_ended(leader as u32, false)? {
        std::thread::sleep(TICK);
    }
    let _ = pagewise_kernel::signal::kill_process_group(leader, libc::SIGKILL);
    Ok(())
}

/// Run `cmd` in its own process group (a stop reaches what it started: servers, children),
/// SIGKILLed if this process dies; wait at most `budget` (then SIGTERM, and SIGKILL after a
/// grace period), calling `tick` every [`TICK`] (a failing tick stops the run and is
/// returned). stdin is /dev/null.
pub fn run(
    mut cmd: Command,
    budget: Duration,
    mut tick: Option<&mut dyn FnMut() -> anyhow::Result<()>>,
) -> anyhow::Result<Outcome> {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    // SAFETY: prctl only, async-signal-safe.
    unsafe { cmd.pre_exec(|| pagewise_kernel::signal::set_parent_death_signal(libc::SIGKILL)) };
    let t = Instant::now();
    let mut child = cmd.spawn().with_context(|| format!("starting {cmd:?}"))?;
    let pid = child.id() as i32;
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let stdout = std::thread::spawn(move || {
        let mut h = twox_hash::XxHash3_64::new();
        let mut c = Captured::default();
        let mut head = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            match out.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    std::hash::Hasher::write(&mut h, &buf[..n]);
                    c.bytes += n as u64;
                    if head.len() < HEAD {
                        head.extend_from_slice(&buf[..n.min(HEAD - head.len())]);
                    }
                }
            }
        }
        c.digest = std::hash::Hasher::finish(&h);
        c.head = String::from_utf8_lossy(&head).into_owned();
        c
    });
    let stderr = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    let deadline = t + budget;
    let mut failed = None;
    let mut reaped = None;
    loop {
        if let Some(r) = wait4_nohang(pid)? {
            reaped = Some(r);
            break;
        }
        if Instant::now() > deadline {
            break;
        }
        if let Some(f) = tick.as_mut() {
            if let Err(e) = f() {
                failed = Some(e);
                break;
            }
        }
        std::thread::sleep(TICK);
    }
    let wall = t.elapsed().as_secs_f64();
    let (status, max_rss) = match reaped {
        Some((raw, rss)) => (Some(ExitStatus::from_raw(raw)), rss),
        None => {
            stop_group(pid)?;
            let (_, rss) = wait4_blocking(pid)?;
            (None, rss)
        }
    };
    // The group may hold descendants that outlived the leader (daemonised servers): end them.
    let _ = pagewise_kernel::signal::kill_process_group(pid, libc::SIGKILL);
    let (stdout, stderr) = (stdout.join().unwrap_or_default(), stderr.join().unwrap_or_default());
    if let Some(e) = failed {
        return Err(e.context(format!("while running {cmd:?} (stopped)")));
    }
    Ok(Outcome { status, wall, stdout, stderr, max_rss })
}

/// wait4(pid, WNOHANG): (raw wait status, ru_maxrss in bytes) once the child has ended.
fn wait4_nohang(pid: i32) -> anyhow::Result<Option<(i32, u64)>> {
    wait4(pid, libc::WNOHANG)
}

fn wait4_blocking(pid: i32) -> anyhow::Result<(i32, u64)> {
    wait4(pid, 0)?.context("wait4 without WNOHANG returned no child")
}

fn wait4(pid: i32, flags: i32) -> anyhow::Result<Option<(i32, u64)>> {
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value of the plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: both pointers are to live locals of the right types.
        let r = unsafe { libc::wait4(pid, &mut status, flags, &mut usage) };
        if r == pid {
            return Ok(Some((status, usage.ru_maxrss.max(0) as u64 * 1024)));
        }
        if r == 0 {
            return Ok(None);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(anyhow::Error::new(e).context(format!("wait4({pid})")));
        }
    }
}

/// How many allocations the shim put on `arena` memory, from its end-of-run report on stderr
/// (`pagewise: N allocation(s) on dlm memory, …`).
pub fn routed_allocations(stderr: &str, arena: &str) -> Option<u64> {
    let marker = format!(" allocation(s) on {arena} memory");
    stderr.lines().find_map(|l| l.strip_prefix("pagewise: ")?.split(marker.as_str()).next()?.parse().ok())
}

/// The DLM runtime's end-of-run counters, from a `pagewise run` program's stderr.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DlmPaging {
    pub fetched_units: u64,
    pub evicted_units: u64,
    /// Most bytes of DLM memory resident at once: with local memory to spare, what the program
    /// touched of its routed memory.
    pub peak_local_bytes: u64,
}

impl DlmPaging {
    /// Units went to a memory server and came back.
    pub fn travelled(&self) -> bool {
        self.fetched_units > 0 && self.evicted_units > 0
    }
}

/// Parse the line "pagewise: dlm: N fault(s) …, N unit(s) fetched …, N evicted …; local peak
/// X of Y MiB" (preload/arena_dlm.c).
pub fn dlm_paging(stderr: &str) -> Option<DlmPaging> {
    let line = stderr.lines().find_map(|l| l.strip_prefix("pagewise: dlm: "))?;
    let word_before = |marker: &str| -> Option<&str> { line[..line.find(marker)?].rsplit([' ', '(']).next() };
    let peak_mib: f64 = line.split("local peak ").nth(1)?.split_whitespace().next()?.parse().ok()?;
    Some(DlmPaging {
        fetched_units: word_before(" unit(s) fetched")?.parse().ok()?,
        evicted_units: word_before(" evicted")?.parse().ok()?,
        peak_local_bytes: (peak_mib * (1 << 20) as f64) as u64,
    })
}

/// The first process named `comm` (its /proc/PID/comm) among `pid` and its descendants,
/// breadth first: the program under `pagewise run`, whose other children are its memory
/// servers.
pub fn descendant_named(pid: u32, comm: &str) -> Option<u32> {
    let mut queue = std::collections::VecDeque::from([pid]);
    while let Some(p) = queue.pop_front() {
        if std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim_end() == comm) {
            return Some(p);
        }
        let tasks = std::fs::read_dir(format!("/proc/{p}/task")).into_iter().flatten().flatten();
        for t in tasks {
            let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            queue.extend(children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()));
        }
    }
    None
}

/// A scratch directory, removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> anyhow::Result<Self> {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let base = std::env::var_os("PAGEWISE_SCRATCH").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
        let dir = base.join(format!("pagewise-{tag}-{}-{k}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Scratch(dir))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dlm_paging_reads_the_end_of_run_counters() {
        let err = "pagewise: 3 allocation(s) on dlm memory (30 MiB over the run, at most 30 MiB at once), 0 refused\n\
                   pagewise: dlm: 42176 fault(s) (21546 first write(s)), 38673 unit(s) fetched (151 MiB, 7 read \
                   ahead), 4577 zero-filled, 39154 evicted (20642 written back, 80 MiB); local peak 15.5 of 16.0 MiB\n";
        let p = dlm_paging(err).unwrap();
        assert_eq!((p.fetched_units, p.evicted_units, p.peak_local_bytes), (38673, 39154, 31 << 19));
        assert!(p.travelled());
        assert_eq!(dlm_paging("pagewise: hps: 3 region(s) promoted\n"), None);
    }

    #[test]
    fn hpcc_checks_keep_verdicts_and_refuse_failures() {
        let ok = "Found 0 errors in 2097152 locations (passed).\nNode(s) with error 0\n\
                  ||Ax-b||_oo/(eps*(||A||_oo*||x||_oo+||b||_oo)*N)=        0.0061929 ...... PASSED\n\
                  HPL_N=2000\nSolution Validates: avg error less than 1.000000e-13 on all three arrays\nSuccess=1\n";
        let c = hpcc_checks(ok).unwrap();
        assert!(c.contains("HPL PASSED") && c.contains("HPL_N=2000") && !c.contains("0.0061929"), "{c}");
        assert!(hpcc_checks(&ok.replace("Success=1", "Success=0")).is_err());
        assert!(hpcc_checks(&ok.replace("PASSED", "FAILED")).is_err());
        assert!(hpcc_checks(&ok.replace("error 0", "error 1")).is_err());
    }

    #[test]
    fn seven_zip_bench_output_reduces_to_its_dictionaries() {
        let out = "Dict     Speed Usage    R/U Rating  |      Speed Usage    R/U Rating\n\
                   22:        646    18   3592    629  |       9199    18   4486    785\n\
                   23:       1559    46   3433   1589  |      33424    62   4686   2893\n\
                   Tot:              36   4049   1474\n";
        assert_eq!(seven_zip_checks(out).unwrap(), "dictionaries 2^22 2^23");
        assert_eq!(seven_zip_rating(out), Some(1474.0));
        assert!(seven_zip_checks("22: 1 2 3\n").is_err(), "no Tot: line");
    }

    #[test]
    fn routing_report_and_sizes() {
        let err = "x\npagewise: 7 allocation(s) on dlm memory, 0 refused (left in libc)\n";
        assert_eq!(routed_allocations(err, "dlm"), Some(7));
        assert_eq!(routed_allocations(err, "hps"), None);
        assert_eq!(size_arg(64 << 10), "64K");
        assert_eq!(size_arg(1 << 20), "1M");
        assert_eq!(size_arg(5000), "5000");
    }

    #[test]
    fn run_captures_stdout_status_and_peak_rss() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "head -c 300000 /dev/zero; echo err >&2; exit 3"]);
        let o = run(cmd, Duration::from_secs(30), None).unwrap();
        assert_eq!(o.status.unwrap().code(), Some(3));
        assert_eq!(o.stdout.bytes, 300000);
        assert_eq!(o.stdout.head.len(), HEAD.min(300000));
        assert_eq!(o.stderr, "err\n");
        assert!(o.max_rss > 0);
        let mut slow = Command::new("sleep");
        slow.arg("30");
        let o = run(slow, Duration::from_millis(200), None).unwrap();
        assert!(o.status.is_none() && o.wall < 10.0);
    }
}
