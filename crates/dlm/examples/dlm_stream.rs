//! Stream through a DLM area: `dlm_stream SERVER MODE [MiB [PASSES]]` (MODE thread|sigbus|sigsegv).
//! Prints GB/s of touching one word per 4 KiB of an area 4× the local limit. Other settings
//! come from the environment (`PAGEWISE_DLM_*`, see `Config::from_lookup`).

use std::time::Instant;

use pagewise_dlm::{Config, Dlm, FaultMode};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let server = args.get(1).expect("usage: dlm_stream SERVER MODE [MiB [PASSES]]").clone();
    let mode = FaultMode::parse(args.get(2).map(String::as_str).unwrap_or("sigbus")).expect("mode");
    let bytes: usize = args.get(3).map(|s| s.parse().expect("MiB")).unwrap_or(256) << 20;
    let env = |k: &str| match k {
        "PAGEWISE_DLM_SERVERS" => Some(server.clone()),
        _ => std::env::var(k).ok(),
    };
    let cfg = Config { local_mem: bytes / 4, fault_mode: mode, ..Config::from_lookup(env).expect("config") };
    let dlm = Dlm::init(cfg).expect("init");
    let base = dlm.alloc(bytes).expect("alloc");
    for off in (0..bytes).step_by(4096) {
        // SAFETY: inside the area.
        unsafe { base.add(off).write_volatile(1) };
    }
    dlm.evict_all();
    let passes: usize = args.get(4).map(|s| s.parse().expect("PASSES")).unwrap_or(3);
    for _ in 0..passes {
        let t = Instant::now();
        let mut sum = 0u64;
        for off in (0..bytes).step_by(4096) {
            // SAFETY: inside the area.
            sum += unsafe { base.add(off).read_volatile() } as u64;
        }
        let s = t.elapsed().as_secs_f64();
        assert_eq!(sum as usize, bytes / 4096);
        println!("{:?}: {:.2} GB/s", dlm.mode(), bytes as f64 / s / 1e9);
        dlm.evict_all();
    }
    println!("{}", serde_json::to_string(&dlm.stats()).unwrap());
}
