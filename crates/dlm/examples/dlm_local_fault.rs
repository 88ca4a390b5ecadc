//! Fault cost without the network: first touches of never-written units are installed as zeros
//! locally. `dlm_local_fault SERVER MODE UNIT_KIB` prints the median ns per fault.

use std::time::Instant;

use pagewise_dlm::{Config, Dlm, FaultMode};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let mode = FaultMode::parse(&a[2]).expect("mode");
    let unit: usize = a[3].parse::<usize>().expect("KiB") << 10;
    let n = 4000;
    let cfg = Config {
        servers: vec![a[1].clone()],
        local_mem: n * unit + (4 << 20),
        base_page: 4096,
        max_set: 256,
        set_count: (unit / 4096) as u32,
        fault_mode: mode,
        readahead: 0,
        zero_copy: std::env::var("PAGEWISE_DLM_ZERO_COPY").is_ok_and(|v| v == "1"),
        ..Config::default()
    };
    let dlm = Dlm::init(cfg).expect("init");
    let base = dlm.alloc(n * unit).expect("alloc");
    let mut t = Vec::with_capacity(n);
    for u in (0..n).rev() {
        let s = Instant::now();
        // SAFETY: inside the area.
        unsafe { base.add(u * unit).read_volatile() };
        t.push(s.elapsed().as_nanos() as u64);
    }
    t.sort();
    let mut w = Vec::with_capacity(n);
    for u in 0..n {
        let s = Instant::now();
        // SAFETY: inside the area.
        unsafe { base.add(u * unit).write_volatile(1) };
        w.push(s.elapsed().as_nanos() as u64);
    }
    w.sort();
    // For comparison with WP_ASYNC dirty tracking: one PAGEMAP_SCAN of a unit for written pages
    // (what eviction would cost per unit instead of a first-write fault).
    let scanner = pagewise_kernel::pagemap_scan::PagemapScanner::open(pagewise_kernel::procfs::Pid::SelfProcess)
        .expect("pagemap");
    let q = pagewise_kernel::pagemap_scan::ScanQuery {
        required: pagewise_kernel::pagemap_scan::category::WRITTEN,
        ..Default::default()
    };
    let mut out = Vec::with_capacity(64);
    let mut sc = Vec::with_capacity(n);
    for u in 0..n {
        let a = base as usize + u * unit;
        let s = Instant::now();
        scanner.scan(a, a + unit, &q, &mut out).expect("PAGEMAP_SCAN");
        sc.push(s.elapsed().as_nanos() as u64);
    }
    sc.sort();
    println!("PAGEMAP_SCAN of one {} KiB unit: p50 {} ns", unit >> 10, sc[n / 2]);
    let st = dlm.stats();
    println!(
        "{:?} unit {} KiB: zero-fill fault p50 {} ns, first write p50 {} ns (faults {}, wp {}, zero units {})",
        dlm.mode(),
        unit >> 10,
        t[n / 2],
        w[n / 2],
        st.faults,
        st.wp_faults,
        st.zero_units
    );
}
