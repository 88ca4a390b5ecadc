//! The loads of the reclaim experiments and tests, as separate processes so each can live in
//! its own memory cgroup and on its own core. Each prints one JSON object on stdout.
//!
//! - `protect --cpu C --pages N --period-ms P --seconds S [--fifo PRIO] [--cgroup DIR]`: seed
//!   002's latency-critical task: pinned, mlockall'ed, optionally SCHED_FIFO, every P ms maps N pages, touches each one and
//!   unmaps them; reports the latency of each map+touch (p50/p99/max µs).
//! - `pressure --cpu C [--file F] --fill-mb M --seconds S [--rate-mib R] [--cgroup DIR]`:
//!   seed 002's pressure: M MiB of anonymous memory touched and held, then sequential reads
//!   of F (larger than the group) over and over, at most R MiB/s when R > 0 (paced per MiB);
//!   without F it only holds the anonymous memory. With `--min-mb N` it goes on past S
//!   seconds until N MiB are read (a fixed amount of work whatever the disk's speed). Reports
//!   MiB/s read.
//! - `fileserver --dir D --threads T --files N --file-kb K --ops O --lookup-pct L
//!   [--cgroup DIR] [--cpu C]`: seed 004's file server: T worker threads (named `pw-fs-worker`)
//!   each doing O requests over N files: reads and rewrites of whole files, and `stat` lookups
//!   of existing and of missing names (negative dentries); reports request latency, the
//!   total time and the bytes read from storage (page-cache misses).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use pagewise_kernel::cgroup::MemCgroup;
use pagewise_kernel::cpu::SchedStat;
use pagewise_kernel::mem::{mlockall_current_and_future, touch_pages, MapOptions, Mapping};
use pagewise_kernel::procfs::{read_io, Pid};

fn die(msg: impl std::fmt::Display) -> ! {
    eprintln!("pagewise-reclaim-load: {msg}");
    std::process::exit(2)
}

struct Args(HashMap<String, String>);

impl Args {
    fn parse(rest: &[String]) -> Self {
        let mut m = HashMap::new();
        let mut it = rest.iter();
        while let Some(k) = it.next() {
            let Some(k) = k.strip_prefix("--") else { die(format!("unexpected argument {k:?}")) };
            let v = it.next().unwrap_or_else(|| die(format!("--{k} needs a value")));
            m.insert(k.to_string(), v.clone());
        }
        Args(m)
    }
    fn get<T: std::str::FromStr>(&self, k: &str, default: Option<T>) -> T {
        match self.0.get(k) {
            Some(v) => v.parse().unwrap_or_else(|_| die(format!("--{k}: bad value {v:?}"))),
            None => default.unwrap_or_else(|| die(format!("--{k} is required"))),
        }
    }
    fn opt(&self, k: &str) -> Option<String> {
        self.0.get(k).cloned()
    }
}

fn join_cgroup(a: &Args) {
    if let Some(dir) = a.opt("cgroup") {
        let cg = MemCgroup::open(&dir).unwrap_or_else(|e| die(e));
        cg.add_process(std::process::id()).unwrap_or_else(|e| die(e));
    }
}

fn pin(a: &Args) {
    if let Some(c) = a.opt("cpu") {
        let c: usize = c.parse().unwrap_or_else(|_| die("--cpu: not a number"));
        pagewise_kernel::cpu::pin_to(c).unwrap_or_else(|e| die(e));
    }
}

fn summary(mut ns: Vec<u64>) -> serde_json::Value {
    ns.sort_unstable();
    let n = ns.len();
    let q = |p: f64| if n == 0 { 0.0 } else { ns[((n as f64 * p).ceil() as usize).clamp(1, n) - 1] as f64 / 1e3 };
    serde_json::json!({
        "count": n, "p50_us": q(0.5), "p99_us": q(0.99), "max_us": q(1.0),
        "mean_us": if n == 0 { 0.0 } else { ns.iter().sum::<u64>() as f64 / n as f64 / 1e3 },
    })
}

fn protect(a: &Args) {
    join_cgroup(a);
    pin(a);
    let pages: usize = a.get("pages", Some(512));
    let period = Duration::from_millis(a.get("period-ms", Some(10)));
    let seconds: f64 = a.get("seconds", None);
    mlockall_current_and_future().unwrap_or_else(|e| die(e));
    // The paper's application habits: SCHED_FIFO (or RR) plus mlockall plus pinning.
    let fifo: i32 = a.get("fifo", Some(0));
    if fifo > 0 {
        pagewise_kernel::cpu::set_fifo_priority(fifo).unwrap_or_else(|e| die(e));
    }
    let len = pages * 4096;
    let mut lat = Vec::new();
    let t0 = Instant::now();
    let mut next = t0;
    while t0.elapsed().as_secs_f64() < seconds {
        let t = Instant::now();
        let m = Mapping::anonymous(len, &MapOptions::default()).unwrap_or_else(|e| die(e));
        // SAFETY: our own fresh writable mapping of `len` bytes.
        unsafe { touch_pages(m.addr(), len) };
        lat.push(t.elapsed().as_nanos() as u64);
        drop(m);
        next += period;
        if let Some(d) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        } else {
            next = Instant::now();
        }
    }
    println!("{}", serde_json::json!({ "latency": summary(lat.clone()), "samples_ns": lat }));
}

fn pressure(a: &Args) {
    join_cgroup(a);
    pin(a);
    let file = a.opt("file").map(PathBuf::from);
    let fill = a.get::<usize>("fill-mb", Some(0)) << 20;
    let seconds: f64 = a.get("seconds", None);
    let rate_mib: f64 = a.get("rate-mib", Some(0.0));
    let min_bytes = a.get::<u64>("min-mb", Some(0)) << 20;
    let _fill = (fill > 0).then(|| {
        let m = Mapping::anonymous(fill, &MapOptions::default()).unwrap_or_else(|e| die(e));
        // SAFETY: our own fresh writable mapping.
        unsafe { touch_pages(m.addr(), fill) };
        m
    });
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    let t0 = Instant::now();
    let Some(file) = file else {
        std::thread::sleep(Duration::from_secs_f64(seconds));
        println!("{}", serde_json::json!({ "bytes": 0, "seconds": seconds, "mib_per_s": 0.0 }));
        return;
    };
    let done = |total: u64| t0.elapsed().as_secs_f64() >= seconds && total >= min_bytes;
    'outer: while !done(total) {
        let mut f = std::fs::File::open(&file).unwrap_or_else(|e| die(format!("{}: {e}", file.display())));
        loop {
            let n = f.read(&mut buf).unwrap_or_else(|e| die(e));
            if n == 0 {
                break;
            }
            total += n as u64;
            if done(total) {
                break 'outer;
            }
            if rate_mib > 0.0 {
                // Paced: the next MiB is due when the rate allows it.
                let due = t0 + Duration::from_secs_f64(total as f64 / (rate_mib * 1048576.0));
                if let Some(d) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(d);
                }
            }
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "{}",
        serde_json::json!({ "bytes": total, "seconds": secs, "mib_per_s": total as f64 / secs / (1 << 20) as f64 })
    );
}

fn fileserver(a: &Args) {
    join_cgroup(a);
    pin(a);
    let dir = PathBuf::from(a.get::<String>("dir", None));
    let threads: usize = a.get("threads", Some(4));
    let files: usize = a.get("files", Some(2000));
    let file_kb: usize = a.get("file-kb", Some(64));
    let ops: usize = a.get("ops", Some(10_000));
    let lookup_pct: u64 = a.get("lookup-pct", Some(20));
    let setup = a.get::<u32>("setup", Some(1)) == 1;
    // Missing names differ per run, so every run creates its own negative dentries.
    let salt: String = a.get("salt", Some(String::from("0")));
    let path_of = |i: usize| dir.join(format!("d{:03}", i % 256)).join(format!("f{i:07}"));
    if setup {
        for d in 0..256.min(files.max(1)) {
            std::fs::create_dir_all(dir.join(format!("d{d:03}"))).unwrap_or_else(|e| die(e));
        }
        let data = vec![0x5au8; file_kb * 1024];
        for i in 0..files {
            std::fs::write(path_of(i), &data).unwrap_or_else(|e| die(format!("{}: {e}", path_of(i).display())));
        }
    }
    if a.get::<u32>("drop", Some(1)) == 1 {
        // Start cold: the files' pages must be read back, and charged, inside the group.
        // Written first: fadvise(DONTNEED) leaves dirty pages and pages under writeback in
        // the cache, and a run right after the setup (or after another run's rewrites)
        // found most of the file set cached outside its group.
        for i in 0..files {
            if let Ok(f) = std::fs::File::open(path_of(i)) {
                let _ = f.sync_data();
            }
            let _ = pagewise_kernel::pagecache::drop_file_cache(&path_of(i));
        }
    }
    let io0 = read_io(Pid::SelfProcess).unwrap_or_else(|e| die(e));
    let t0 = Instant::now();
    let mut handles = Vec::new();
    for t in 0..threads {
        let dir = dir.clone();
        let salt = salt.clone();
        handles.push(
            std::thread::Builder::new()
                .name("pw-fs-worker".into())
                .spawn(move || {
                    let path_of = |i: usize| dir.join(format!("d{:03}", i % 256)).join(format!("f{i:07}"));
                    let sched0 = SchedStat::this_thread().unwrap_or_default();
                    let mut lat = Vec::with_capacity(ops);
                    let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ (t as u64 + 1);
                    let mut buf = vec![0u8; file_kb * 1024];
                    for op in 0..ops {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let i = (x % files as u64) as usize;
                        let s = Instant::now();
                        if x % 100 < lookup_pct {
                            // Metadata lookups: an existing name and a missing one (a negative dentry).
                            let _ = std::fs::metadata(path_of(i));
                            let _ = std::fs::metadata(
                                dir.join(format!("d{:03}", i % 256)).join(format!("missing-{salt}-{t}-{op}-{i}")),
                            );
                        } else if x % 100 < 90 {
                            if let Ok(mut f) = std::fs::File::open(path_of(i)) {
                                let _ = f.read(&mut buf);
                            }
                        } else if let Ok(mut f) = std::fs::File::create(path_of(i)) {
                            let _ = f.write_all(&buf);
                        }
                        lat.push(s.elapsed().as_nanos() as u64);
                    }
                    (lat, SchedStat::this_thread().unwrap_or_default().since(&sched0))
                })
                .unwrap_or_else(|e| die(e)),
        );
    }
    let (mut lat, mut on_cpu_ns, mut wait_ns) = (Vec::new(), 0u64, 0u64);
    for h in handles {
        let (l, sched) = h.join().unwrap_or_else(|_| die("worker panicked"));
        lat.extend(l);
        on_cpu_ns += sched.on_cpu_ns;
        wait_ns += sched.run_queue_wait_ns;
    }
    let secs = t0.elapsed().as_secs_f64();
    let io = read_io(Pid::SelfProcess).unwrap_or_else(|e| die(e));
    println!(
        "{}",
        serde_json::json!({
            "seconds": secs, "requests": lat.len(), "latency": summary(lat),
            // Bytes the workers had the kernel fetch from storage: their page-cache misses.
            "storage_read_mib": io.read_bytes.saturating_sub(io0.read_bytes) as f64 / 1048576.0,
            // All workers together: CPU time, and time runnable but waiting for a CPU.
            "workers_on_cpu_s": on_cpu_ns as f64 / 1e9, "workers_run_queue_wait_s": wait_ns as f64 / 1e9,
        })
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((mode, rest)) = args.split_first() else {
        die("usage: pagewise-reclaim-load protect|pressure|fileserver --key value ...")
    };
    let a = Args::parse(rest);
    match mode.as_str() {
        "protect" => protect(&a),
        "pressure" => pressure(&a),
        "fileserver" => fileserver(&a),
        other => die(format!("unknown mode {other:?}")),
    }
}
