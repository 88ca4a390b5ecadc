//! Streaming through faults against TCP streaming, paired: `dlm_stream_vs_tcp SERVER [MiB [PASSES]]`.
//!
//! The stream of `pagewise eval dlm-fault` (128 KiB units of 16 KiB × 8, read-ahead of 32
//! units, an area 4× the local limit, one word read per 4 KiB) in this one process, each pass
//! followed by a TCP stream of the same bytes from the same server (1 MiB READs, 8 in flight,
//! into one buffer). Prints the median GB/s of both, the median of the per-pass ratios, and
//! the runtime's counters per unit and pass. Run it single-threaded as a DLM program is (it
//! is); other settings come from the environment (`PAGEWISE_DLM_*`, `Config::from_lookup`),
//! `PAGEWISE_DLM_READAHEAD` included.

use std::time::Instant;

use pagewise_dlm::auth::Secret;
use pagewise_dlm::proto::{Header, Opcode};
use pagewise_dlm::transport::{TcpTransport, Transport};
use pagewise_dlm::{Config, Dlm};

const UNIT: usize = 128 << 10;
const CHUNK: usize = 1 << 20;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let server = args.get(1).expect("usage: dlm_stream_vs_tcp SERVER [MiB [PASSES]]").clone();
    let bytes: usize = args.get(2).map(|s| s.parse().expect("MiB")).unwrap_or(256) << 20;
    let passes: usize = args.get(3).map(|s| s.parse().expect("PASSES")).unwrap_or(7);
    let env = |k: &str| match k {
        "PAGEWISE_DLM_SERVERS" => Some(server.clone()),
        _ => std::env::var(k).ok(),
    };
    let mut cfg = Config {
        local_mem: bytes / 4,
        base_page: 16 << 10,
        max_set: 8,
        set_count: 8,
        ..Config::from_lookup(env).expect("config")
    };
    if std::env::var_os("PAGEWISE_DLM_READAHEAD").is_none() {
        cfg.readahead = 32;
    }
    let dlm = Dlm::init(cfg).expect("init");
    let base = dlm.alloc(bytes).expect("alloc");
    let word = |off: usize| (off as u64) | 1;
    for off in (0..bytes).step_by(4096) {
        // SAFETY: inside the area.
        unsafe { (base.add(off) as *mut u64).write_volatile(word(off)) };
    }
    dlm.evict_all();

    let secret = Secret::from_env().expect("secret");
    let mut tcp = Tcp::new(&server, secret.as_ref(), bytes);
    let mut buf = vec![0u8; CHUNK];
    let mut dlm_gbps = Vec::new();
    let mut tcp_gbps = Vec::new();
    let before = serde_json::to_value(dlm.stats()).expect("stats");
    for _ in 0..passes {
        let t = Instant::now();
        for off in (0..bytes).step_by(4096) {
            // SAFETY: inside the area.
            let v = unsafe { (base.add(off) as *const u64).read_volatile() };
            assert_eq!(v, word(off), "offset {off}");
        }
        dlm_gbps.push(bytes as f64 / t.elapsed().as_secs_f64() / 1e9);
        dlm.evict_all();
        tcp_gbps.push(tcp.stream(bytes, &mut buf));
    }
    let after = serde_json::to_value(dlm.stats()).expect("stats");
    let ratios: Vec<f64> = dlm_gbps.iter().zip(&tcp_gbps).map(|(d, t)| d / t).collect();
    println!(
        "DLM {:.2} GB/s, TCP {:.2} GB/s, DLM/TCP {:.3} (per pass: {})",
        median(&dlm_gbps),
        median(&tcp_gbps),
        median(&ratios),
        ratios.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(" ")
    );
    let units = (passes * bytes / UNIT) as f64;
    let per_unit: Vec<String> = [
        "faults",
        "readahead_units",
        "grouped_reads",
        "arrived_installs",
        "moved_units",
        "joined_move_ins",
        "borrowed_receives",
        "second_chances",
    ]
    .iter()
    .map(|k| {
        let d = after[k].as_u64().unwrap_or(0) - before[k].as_u64().unwrap_or(0);
        format!("{k} {:.2}", d as f64 / units)
    })
    .collect();
    println!("per unit and pass: {}", per_unit.join(", "));
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A raw protocol client with a region as large as the area, filled.
struct Tcp {
    t: TcpTransport,
    region: u32,
    id: u32,
}

impl Tcp {
    fn new(server: &str, secret: Option<&Secret>, bytes: usize) -> Self {
        let t = TcpTransport::open(server, secret, None).expect("connect");
        let mut tcp = Tcp { t, region: 0, id: 1 };
        let mut h = tcp.header(Opcode::Alloc);
        h.page = (bytes / 4096) as u64;
        h.length = 4;
        tcp.t.send(&h, &4096u32.to_le_bytes()).expect("ALLOC");
        tcp.region = tcp.t.recv_header().expect("ALLOC reply").region;
        let data = vec![0x5Au8; CHUNK];
        for off in (0..bytes).step_by(CHUNK) {
            let mut h = tcp.header(Opcode::Write);
            h.page = (off / 4096) as u64;
            h.set_count = (CHUNK / 4096) as u32;
            h.length = CHUNK as u32;
            tcp.t.send(&h, &data).expect("WRITE");
            assert_eq!(tcp.t.recv_header().expect("WRITE reply").status, 0);
        }
        tcp
    }

    fn header(&mut self, op: Opcode) -> Header {
        let mut h = Header::request(op, self.id);
        self.id += 1;
        h.region = self.region;
        h
    }

    fn read(&mut self, chunk: usize) {
        let mut h = self.header(Opcode::Read);
        h.page = (chunk * CHUNK / 4096) as u64;
        h.set_count = (CHUNK / 4096) as u32;
        self.t.send(&h, &[]).expect("READ");
    }

    /// GB/s of `bytes` read in 1 MiB READs, 8 in flight (`pagewise eval dlm-fault`'s TCP stream).
    fn stream(&mut self, bytes: usize, buf: &mut [u8]) -> f64 {
        let (n, depth) = (bytes / CHUNK, 8);
        let t = Instant::now();
        for i in 0..n.min(depth) {
            self.read(i);
        }
        for i in 0..n {
            let r = self.t.recv_header().expect("READ reply");
            self.t.recv_payload(&mut buf[..r.length as usize]).expect("READ payload");
            if i + depth < n {
                self.read(i + depth);
            }
        }
        bytes as f64 / t.elapsed().as_secs_f64() / 1e9
    }
}
