//! Remote read faults, for profiling the fault path: `dlm_remote_fault SERVER UNIT_KIB [N]`.
//! Writes every unit home, drops the local copies, then reads one word of N units in random
//! order (no read-ahead; no eviction unless PAGEWISE_DLM_LOCAL_MEM is set) and prints the median and p99 ns per fault. Other
//! settings come from the environment (`PAGEWISE_DLM_*`, see `Config::from_lookup`);
//! `pagewise eval dlm-fault` is the measurement, this is what to run under `perf record`.

use std::time::Instant;

use pagewise_dlm::{Config, Dlm};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let server = a.get(1).expect("usage: dlm_remote_fault SERVER UNIT_KIB [N]").clone();
    let unit: usize = a.get(2).expect("UNIT_KIB").parse::<usize>().expect("KiB") << 10;
    let n: usize = a.get(3).map(|s| s.parse().expect("N")).unwrap_or(4000);
    let env = |k: &str| match k {
        "PAGEWISE_DLM_SERVERS" => Some(server.clone()),
        _ => std::env::var(k).ok(),
    };
    let local_mem = if std::env::var_os("PAGEWISE_DLM_LOCAL_MEM").is_some() {
        // A smaller local memory makes the faults evict: installs then reuse evicted frames.
        Config::from_lookup(env).expect("config").local_mem
    } else {
        n * unit + (4 << 20)
    };
    let cfg = Config {
        local_mem,
        base_page: 4096,
        max_set: 256,
        set_count: (unit / 4096) as u32,
        readahead: 0,
        ..Config::from_lookup(env).expect("config")
    };
    let dlm = Dlm::init(cfg).expect("init");
    let base = dlm.alloc(n * unit).expect("alloc");
    for off in (0..n * unit).step_by(4096) {
        // SAFETY: inside the area.
        unsafe { base.add(off).write_volatile(1) };
    }
    dlm.evict_all();
    // A fixed permutation (multiplicative step coprime with n), no RNG dependency.
    let step = (0..).map(|k| 7919 + 2 * k).find(|s| gcd(*s, n) == 1).expect("a step");
    let mut t = Vec::with_capacity(n);
    for i in 0..n {
        let u = i * step % n;
        let s = Instant::now();
        // SAFETY: inside the area.
        let v = unsafe { base.add(u * unit).read_volatile() };
        t.push(s.elapsed().as_nanos() as u64);
        assert_eq!(v, 1);
    }
    t.sort_unstable();
    println!("{} KiB: median {} ns, p99 {} ns", unit >> 10, t[n / 2], t[n * 99 / 100]);
    println!("{}", serde_json::to_string(&dlm.stats()).expect("stats"));
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}
