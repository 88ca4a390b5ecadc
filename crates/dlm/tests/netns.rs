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

/// Two namespaces joined by a veth pair, two servers in one of them.
struct Setup {
    servers: [ServerProc; 2],
    addrs: String,
    net: String,
    cns: String,
    vc: String,
    ns: Netns,
}

/// None (after printing why) when the machine cannot make namespaces.
fn setup(salt: u32) -> Option<Setup> {
    setup_with(salt, &[])
}

/// As [`setup`], the servers started with `extra` flags.
fn setup_with(salt: u32, extra: &[&str]) -> Option<Setup> {
    if Command::new("ip").arg("-V").output().is_err() {
        pagewise_kernel::testing::skip("the `ip` command (iproute2) is missing");
        return None;
    }
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        pagewise_kernel::testing::skip("creating network namespaces needs root");
        return None;
    }
    let id = (std::process::id() + salt) % 10_000;
    let (cns, sns) = (format!("pwdlm-c{id}"), format!("pwdlm-s{id}"));
    let ns = Netns { names: vec![cns.clone(), sns.clone()] };
    let (vc, vs) = (format!("pwc{id}"), format!("pws{id}"));
    let net = format!("10.{}.{}", 200 + salt % 50, id % 250);
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
        ServerProc::start_with_args(cmd, &format!("{net}.1:{port}"), "1G", extra)
    };
    let servers = [start(7101), start(7102)];
    let addrs = servers.iter().map(|s| s.addr.clone()).collect::<Vec<_>>().join(",");
    Some(Setup { servers, addrs, net, cns, vc, ns })
}

/// Run test `name` of this binary inside the client namespace.
fn run_in_client(s: &Setup, name: &str) -> std::process::Output {
    Command::new("ip")
        .args(["netns", "exec", &s.cns])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture"])
        .env("DLM_CHILD", "1")
        .env(pagewise_dlm::auth::SECRET_ENV, common::secret().as_env_value())
        .env("DLM_TEST_SERVERS", &s.addrs)
        .env("DLM_TEST_LINK", &s.vc)
        .output()
        .unwrap()
}

#[test]
fn client_and_servers_in_separate_network_namespaces() {
    if in_child() {
        scenario();
        return;
    }
    let Some(s) = setup(0) else { return };
    let out = run_in_client(&s, "client_and_servers_in_separate_network_namespaces");
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && so.contains("NETNS-OK"), "{so}\n{}", String::from_utf8_lossy(&out.stderr));
    // Both servers saw the client arrive from the client namespace's address, over the veth.
    for srv in &s.servers {
        let log = srv.log.lock().unwrap().join("");
        assert!(log.contains(&format!("client {}.2:", s.net)), "server {} log:\n{log}", srv.addr);
    }
    let Setup { servers, ns, .. } = s;
    drop(servers);
    drop(ns);
}

fn dropped_link_scenario() {
    let servers: Vec<String> = std::env::var("DLM_TEST_SERVERS").unwrap().split(',').map(String::from).collect();
    let cfg = Config {
        servers,
        local_mem: 1 << 20,
        readahead: 0,
        fault_timeout: Some(std::time::Duration::from_secs(2)),
        ..Config::default()
    };
    let dlm = Dlm::init(cfg).unwrap();
    let base = dlm.alloc(8 << 20).unwrap();
    // SAFETY: inside the area.
    unsafe { base.add(4 << 20).write_volatile(7) };
    dlm.evict_all();
    // Cut the client's side of the link: requests and replies are dropped from now on.
    ip(&["link", "set", &std::env::var("DLM_TEST_LINK").unwrap(), "down"]);
    // SAFETY: inside the area; the fetch must time out and stop the program.
    let v = unsafe { base.add(4 << 20).read_volatile() };
    println!("READ-RETURNED {v}");
}

#[test]
fn a_dropped_link_stops_the_program_with_a_message() {
    if in_child() {
        dropped_link_scenario();
        return;
    }
    let Some(s) = setup(7) else { return };
    let t = std::time::Instant::now();
    let out = run_in_client(&s, "a_dropped_link_stops_the_program_with_a_message");
    let (so, se) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success() && !so.contains("READ-RETURNED"), "{so}\n{se}");
    assert!(se.contains("no reply within") || se.contains("connection lost"), "{se}");
    assert!(s.servers.iter().any(|srv| se.contains(&srv.addr)), "the message names the server: {se}");
    assert!(t.elapsed() < std::time::Duration::from_secs(60), "took {:?}", t.elapsed());
}

fn vanished_host_scenario() {
    let servers: Vec<String> = std::env::var("DLM_TEST_SERVERS").unwrap().split(',').map(String::from).collect();
    let dlm = Dlm::init(Config { servers, local_mem: 1 << 20, readahead: 0, ..Config::default() }).unwrap();
    let base = dlm.alloc(8 << 20).unwrap();
    // SAFETY: inside the area.
    unsafe { base.add(4 << 20).write_volatile(7) };
    dlm.evict_all();
    // The host vanishes: no FIN, no RST, nothing answers the servers' keepalive probes; this
    // process lives on (it only sleeps), so its kernel does not close the connections.
    ip(&["link", "set", &std::env::var("DLM_TEST_LINK").unwrap(), "down"]);
    println!("LINK-DOWN");
    std::thread::sleep(std::time::Duration::from_secs(40));
    std::mem::forget(dlm);
}

/// A client whose host stops answering loses its connections and regions once the servers'
/// dead-peer timeout (`--idle-timeout 3`, TCP keepalive) has passed, while its process still
/// runs (issue 23). The other half — a live client quiet for longer than the timeout keeps its
/// regions — is `server.rs`'s `connection_bound_and_live_quiet_clients_keep_their_regions`.
#[test]
fn a_client_whose_host_vanished_loses_its_regions() {
    if in_child() {
        vanished_host_scenario();
        return;
    }
    let Some(s) = setup_with(9, &["--idle-timeout", "3"]) else { return };
    let mut child = Command::new("ip")
        .args(["netns", "exec", &s.cns])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", "a_client_whose_host_vanished_loses_its_regions", "--nocapture"])
        .env("DLM_CHILD", "1")
        .env(pagewise_dlm::auth::SECRET_ENV, common::secret().as_env_value())
        .env("DLM_TEST_SERVERS", &s.addrs)
        .env("DLM_TEST_LINK", &s.vc)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("LINK-DOWN") {
        line.clear();
        assert!(
            std::io::BufRead::read_line(&mut out, &mut line).unwrap() > 0,
            "the client ended before cutting its link"
        );
    }
    let cut = std::time::Instant::now();
    // Either way the server learns the host is gone: no answer to its keepalive probes, or
    // an ICMP "no route to host" for a probe once the neighbour entry has expired.
    let gone = |srv: &ServerProc| {
        srv.log.lock().unwrap().iter().any(|l| {
            l.contains(" gone (") && (l.contains("stopped answering (keepalive)") || l.contains("No route to host"))
        })
    };
    while !s.servers.iter().all(gone) {
        assert!(
            cut.elapsed() < std::time::Duration::from_secs(30),
            "a vanished client kept its connection; the servers logged:\n{}",
            s.servers.iter().map(|v| v.log.lock().unwrap().join("\n")).collect::<Vec<_>>().join("\n--\n")
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(child.try_wait().unwrap().is_none(), "the client process must still run");
    let _ = child.kill();
    let _ = child.wait();
    let Setup { servers, ns, .. } = s;
    for srv in servers {
        let (st, json) = srv.terminate();
        assert!(st.success());
        let v: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
        assert_eq!((v["regions"].as_u64(), v["resident_bytes"].as_u64()), (Some(0), Some(0)), "{v}");
    }
    drop(ns);
}
