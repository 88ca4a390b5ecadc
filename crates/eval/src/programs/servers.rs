//! Servers nobody here wrote — Debian's memcached and redis-server (linked with jemalloc) —
//! started plain or under `pagewise run` / `pagewise hps run`, and driven with every value
//! checked: a fill of records (YCSB's key names, values derived from the key), a read of every
//! record, and YCSB's scrambled zipfian reads. memcached is driven by the project's memcached
//! load generator ([`pagewise_kvcache::load`]); redis by the same keys and values over RESP.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use pagewise_kvcache::load::{self, push_key, push_value, value_of, Rng, ScrambledZipfian};

use super::Wrap;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Memcached,
    Redis,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Memcached => "memcached",
            Kind::Redis => "redis",
        }
    }
}

/// A running server; SIGKILLed (with what wraps it) on drop unless [`Server::stop`] ran.
pub struct Server {
    child: Child,
    /// The server process itself (the child, or the child's child under `pagewise … run`).
    pub pid: u32,
    pub addr: String,
    pub kind: Kind,
    stopped: bool,
}

/// A free port on the loopback interface.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0").context("binding a free port")?.local_addr()?.port())
}

/// Start `kind` with `mem_mib` of cache on a free loopback port, wrapped by `wrap`
/// (`pagewise` is the CLI binary), its working directory `dir`; returns once it answers.
pub fn start(kind: Kind, pagewise: &Path, wrap: &Wrap, mem_mib: u64, dir: &Path) -> anyhow::Result<Server> {
    let port = free_port()?;
    let argv: Vec<String> = match kind {
        Kind::Memcached => ["memcached", "-U", "0", "-l", "127.0.0.1", "-t", "1", "-u", "root", "-c", "64"]
            .iter()
            .map(|s| s.to_string())
            .chain(["-m".into(), mem_mib.to_string(), "-p".into(), port.to_string()])
            .collect(),
        Kind::Redis => [
            "redis-server",
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
            "--daemonize",
            "no",
            "--maxmemory-policy",
            "noeviction",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(["--maxmemory".into(), format!("{mem_mib}mb"), "--port".into(), port.to_string()])
        .chain(["--dir".into(), dir.display().to_string()])
        .collect(),
    };
    let job = super::Job {
        name: kind.name().into(),
        argv,
        env: Vec::new(),
        cwd: dir.to_path_buf(),
        canon: super::Canon::Stdout,
    };
    let mut cmd = job.command(pagewise, wrap);
    use std::os::unix::process::CommandExt;
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).process_group(0);
    // SAFETY: prctl only, async-signal-safe.
    unsafe { cmd.pre_exec(|| pagewise_kernel::signal::set_parent_death_signal(libc::SIGKILL)) };
    let child = cmd.spawn().with_context(|| format!("starting {}", kind.name()))?;
    let mut s = Server { pid: child.id(), child, addr: format!("127.0.0.1:{port}"), kind, stopped: false };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(st) = s.child.try_wait()? {
            let mut err = String::new();
            if let Some(mut e) = s.child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            s.stopped = true;
            bail!("{} ended before it listened ({st}):\n{}", kind.name(), super::tail(&err, 30));
        }
        if TcpStream::connect(&s.addr).is_ok() {
            break;
        }
        ensure!(Instant::now() < deadline, "{} did not listen on {} within 30 s", kind.name(), s.addr);
        std::thread::sleep(Duration::from_millis(20));
    }
    if *wrap != Wrap::Plain {
        let id = s.child.id();
        let comm = match kind {
            Kind::Memcached => "memcached",
            Kind::Redis => "redis-server",
        };
        s.pid = super::descendant_named(id, comm)
            .with_context(|| format!("{} under pagewise (pid {id}) has no {comm} process", kind.name()))?;
    }
    Ok(s)
}

impl Server {
    /// Stop it gracefully (SIGTERM, so the shim prints its report) and return its stderr (the
    /// wrapper's and the shim's report included). An error if it does not stop within 20 s.
    pub fn stop(mut self) -> anyhow::Result<String> {
        self.stopped = true;
        // The server only: under `pagewise run` its memory servers must outlive it.
        // SAFETY: kill(2) takes no pointers.
        unsafe { libc::kill(self.pid as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                let _ = pagewise_kernel::signal::kill_process_group(self.child.id() as i32, libc::SIGKILL);
                let _ = self.child.wait();
                bail!("{} did not stop within 20 s of SIGTERM", self.kind.name());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        Ok(err)
    }

    /// Whether the server process still runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if !self.stopped {
            let _ = pagewise_kernel::signal::kill_process_group(self.child.id() as i32, libc::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

fn connect(addr: &str) -> anyhow::Result<(BufReader<TcpStream>, TcpStream)> {
    let s = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    s.set_write_timeout(Some(Duration::from_secs(60)))?;
    Ok((BufReader::new(s.try_clone()?), s))
}

/// RESP: an array of bulk strings.
fn resp_command(out: &mut Vec<u8>, parts: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", parts.len()).as_bytes());
    for p in parts {
        out.extend_from_slice(format!("${}\r\n", p.len()).as_bytes());
        out.extend_from_slice(p);
        out.extend_from_slice(b"\r\n");
    }
}

/// One RESP bulk-string reply (`$-1` is None).
fn resp_bulk(r: &mut BufReader<TcpStream>) -> anyhow::Result<Option<Vec<u8>>> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let len: i64 = line
        .strip_prefix('$')
        .and_then(|l| l.trim_end().parse().ok())
        .with_context(|| format!("redis: expected a bulk string, got {line:?}"))?;
    if len < 0 {
        return Ok(None);
    }
    let mut buf = vec![0u8; len as usize + 2];
    r.read_exact(&mut buf)?;
    buf.truncate(len as usize);
    Ok(Some(buf))
}

/// Store records `0..records` with `value_len`-byte values; every reply must be a success.
pub fn fill(kind: Kind, addr: &str, records: u64, value_len: usize) -> anyhow::Result<()> {
    match kind {
        Kind::Memcached => {
            let r = load::load(addr, 0, records, value_len, 2, 64).context("memcached: storing the records")?;
            ensure!(r.bad == 0, "memcached refused {} of {records} sets", r.bad);
        }
        Kind::Redis => {
            let (mut r, mut w) = connect(addr)?;
            let (mut buf, mut key, mut value) = (Vec::new(), Vec::new(), Vec::new());
            let mut n = 0;
            while n < records {
                let batch = (records - n).min(64);
                buf.clear();
                for i in n..n + batch {
                    key.clear();
                    push_key(i, &mut key);
                    value.clear();
                    push_value(&key, value_len, &mut value);
                    resp_command(&mut buf, &[b"SET", &key, &value]);
                }
                w.write_all(&buf)?;
                for i in n..n + batch {
                    let mut line = String::new();
                    r.read_line(&mut line)?;
                    ensure!(line == "+OK\r\n", "redis: SET of record {i} answered {line:?}");
                }
                n += batch;
            }
        }
    }
    Ok(())
}

/// Read every record `0..records` back and compare it with the value stored.
pub fn check_all(kind: Kind, addr: &str, records: u64, value_len: usize) -> anyhow::Result<()> {
    let (mut r, mut w) = connect(addr)?;
    let mut n = 0;
    let mut buf = Vec::new();
    while n < records {
        let batch = (records - n).min(64);
        buf.clear();
        for i in n..n + batch {
            let key = load::key_of(i);
            match kind {
                Kind::Memcached => buf.extend_from_slice(format!("get {key}\r\n").as_bytes()),
                Kind::Redis => resp_command(&mut buf, &[b"GET", key.as_bytes()]),
            }
        }
        w.write_all(&buf)?;
        for i in n..n + batch {
            let key = load::key_of(i);
            let want = value_of(key.as_bytes(), value_len);
            let got = match kind {
                Kind::Redis => resp_bulk(&mut r)?,
                Kind::Memcached => {
                    let mut line = String::new();
                    r.read_line(&mut line)?;
                    if line == "END\r\n" {
                        None
                    } else {
                        ensure!(
                            line == format!("VALUE {key} 0 {value_len}\r\n"),
                            "memcached: get of record {i} answered {line:?}"
                        );
                        let mut v = vec![0u8; value_len + 2];
                        r.read_exact(&mut v)?;
                        v.truncate(value_len);
                        line.clear();
                        r.read_line(&mut line)?;
                        ensure!(line == "END\r\n", "memcached: get of record {i} ended with {line:?}");
                        Some(v)
                    }
                }
            };
            let got = got.with_context(|| format!("{}: record {i} ({key}) is missing", kind.name()))?;
            ensure!(got == want, "{}: record {i} ({key}) has the wrong value", kind.name());
        }
        n += batch;
    }
    Ok(())
}

/// What a zipfian read load did.
#[derive(Clone, Copy, Debug, Default)]
pub struct Reads {
    pub ops: u64,
    pub misses: u64,
    pub secs: f64,
}

/// `ops` reads of YCSB's scrambled zipfian choice of records over two connections, 64 in
/// flight each, every value checked (a wrong value is an error; a miss is counted).
pub fn zipfian_reads(
    kind: Kind,
    addr: &str,
    records: u64,
    value_len: usize,
    ops: u64,
    seed: u64,
) -> anyhow::Result<Reads> {
    match kind {
        Kind::Memcached => {
            let r = load::run(
                addr,
                records,
                load::Choice::Zipfian,
                value_len,
                2,
                64,
                ops,
                Duration::from_secs(3600),
                true,
                seed,
            )
            .context("memcached: zipfian reads")?;
            ensure!(r.bad == 0, "memcached: {} of {} reads returned a wrong value", r.bad, r.ops);
            Ok(Reads { ops: r.ops, misses: r.misses, secs: r.secs })
        }
        Kind::Redis => {
            let t = Instant::now();
            let per = ops.div_ceil(2);
            let results: Vec<anyhow::Result<Reads>> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..2u64)
                    .map(|c| {
                        s.spawn(move || -> anyhow::Result<Reads> {
                            let zipf = ScrambledZipfian::new(records);
                            let mut rng = Rng::new(seed ^ (c + 1).wrapping_mul(0x1234_5678_9abc));
                            let (mut r, mut w) = connect(addr)?;
                            let mut res = Reads::default();
                            let mut buf = Vec::new();
                            let mut keys = Vec::new();
                            while res.ops < per {
                                let batch = (per - res.ops).min(64);
                                buf.clear();
                                keys.clear();
                                for _ in 0..batch {
                                    let key = load::key_of(zipf.next(&mut rng));
                                    resp_command(&mut buf, &[b"GET", key.as_bytes()]);
                                    keys.push(key);
                                }
                                w.write_all(&buf)?;
                                for key in &keys {
                                    match resp_bulk(&mut r)? {
                                        None => res.misses += 1,
                                        Some(v) => ensure!(
                                            v == value_of(key.as_bytes(), value_len),
                                            "redis: {key} has the wrong value"
                                        ),
                                    }
                                }
                                res.ops += batch;
                            }
                            Ok(res)
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().expect("load thread")).collect()
            });
            let mut total = Reads::default();
            for r in results {
                let r = r?;
                total.ops += r.ops;
                total.misses += r.misses;
            }
            total.secs = t.elapsed().as_secs_f64();
            Ok(total)
        }
    }
}
