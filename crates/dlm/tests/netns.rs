//! Multi-host: the program and its memory servers in separate network namespaces joined by a
//! veth pair (`ip netns`), created and removed by the test. Skips with a reason without `ip` or
//! without root.

mod common;

use std::process::Command;

use common::{in_child, pagewise_bin, ServerProc};
use pagewise_dlm::{Config, Dlm};
use rand::{Rng, SeedableRng};

struct Netns {
    names: Vec<String>,
}

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip");
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

fn scenario() {
    let servers: Vec<String> = std::env::var("DLM_TEST_SERVERS").unwrap().split(',').map(String::from).collect();
    let cfg = Config { servers, local_mem: 2 << 20, ..Config::default() };
    let dlm = Dlm::init(cfg).unwrap();
    let len = 32usize << 20;
    let base = dlm.alloc(len).unwrap() as *mut u64;
    let words = len / 8;
    let mut model = vec![0u64; words / 512];
    let mut rng = rand::rngs::SmallRng::seed_from_u64(11);
    for _ in 0..20_000 {
        let k = rng.random_range(0..model.len());
        // SAFETY: k*512 < words.
        let v = unsafe { base.add(k * 512).read_volatile() };
        assert_eq!(v, model[k], "word {k}");
        let nv = rng.random::<u64>();
        // SAFETY: as above.
        unsafe { base.add(k * 512).write_volatile(nv) };
        model[k] = nv;
    }
    for (k, &m) in model.iter().enumerate() {
        // SAFETY: as above.
        assert_eq!(unsafe { base.add(k * 512).read_volatile() }, m, "word {k} at the end");
    }
    let st = dlm.stats();
    assert!(st.writebacks > 0 && st.fetched_units > 0);
    println!("NETNS-OK {}", serde_json::to_string(&st).unwrap());
}

#[test]
fn client_and_servers_in_separate_network_namespaces() {
    if in_child() {
        scenario();
        return;
    }
    if Command::new("ip").arg("-V").output().is_err() {
        pagewise_kernel::testing::skip("the `ip` command (iproute2) is missing");
        return;
    }
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        pagewise_kernel::testing::skip("creating network namespaces needs root");
        return;
    }
    let id = std::process::id() % 10_000;
    let (cns, sns) = (format!("pwdlm-c{id}"), format!("pwdlm-s{id}"));
    let ns = Netns { names: vec![cns.clone(), sns.clone()] };
    let (vc, vs) = (format!("pwc{id}"), format!("pws{id}"));
    let net = format!("10.213.{}", id % 250);
    ip(&["netns", "add", &cns]);
    ip(&["netns", "add", &sns]);
    ip(&["link", "add", &vc, "type", "veth", "peer", "name", &vs]);
    ip(&["link", "set", &vc, "netns", &cns]);
    ip(&["link", "set", &vs, "netns", &sns]);
    ip(&["-n", &cns, "addr", "add", &format!("{net}.2/24"), "dev", &vc]);
    ip(&["-n", &sns, "addr", "add", &format!("{net}.1/24"), "dev", &vs]);
    for (n, d) in [(&cns, &vc), (&sns, &vs)] {
        ip(&["-n", n, "link", "set", d, "up"]);
        ip(&["-n", n, "link", "set", "lo", "up"]);
    }
    let bin = pagewise_bin();
    let start = |port: u16| {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &sns]).arg(&bin);
        ServerProc::start_with(cmd, &format!("{net}.1:{port}"), "1G")
    };
    let servers = [start(7101), start(7102)];
    let addrs = servers.iter().map(|s| s.addr.clone()).collect::<Vec<_>>().join(",");
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("ip")
        .args(["netns", "exec", &cns])
        .arg(exe)
        .args(["--exact", "client_and_servers_in_separate_network_namespaces", "--nocapture"])
        .env("DLM_CHILD", "1")
        .env("DLM_TEST_SERVERS", &addrs)
        .output()
        .unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && so.contains("NETNS-OK"), "{so}\n{}", String::from_utf8_lossy(&out.stderr));
    // Both servers saw the client arrive from the client namespace's address, over the veth.
    for s in &servers {
        let log = s.log.lock().unwrap().join("");
        assert!(log.contains(&format!("client {net}.2:")), "server {} log:\n{log}", s.addr);
    }
    drop(servers);
    drop(ns);
}
