//! `pagewise eval dlm-programs --net PROFILE`: the option is accepted (dlm-programs runs across
//! the testbed), an unknown profile is a clear error, and the experiment's memory servers are
//! on the testbed's server hosts, at the testbed's addresses, while a program under
//! `pagewise run` on the client host gets its pages from them and gives the plain run's
//! output. Needs root and iproute2 (the testbed's network namespaces).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use pagewise_eval::experiments::dlm_programs::servers::RunServers;
use pagewise_eval::net::ServerHosts;
use pagewise_eval::programs::{self, dlm_paging, jobs, routed_allocations, DlmFlags, Scratch, Wrap};
use pagewise_kernel::testbed::profile;

fn pagewise() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_pagewise"))
}

fn eval(args: &[&str]) -> (bool, String) {
    let out = Command::new(pagewise()).arg("eval").args(args).output().expect("starting pagewise eval");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn dlm_programs_is_among_the_experiments_net_accepts() {
    // An experiment that stays on one host is refused before anything runs, with the list of
    // those that run across the testbed.
    let (ok, err) = eval(&["thp-baseline", "--quick", "--net", "25gbe"]);
    assert!(!ok, "thp-baseline accepted --net: {err}");
    let able = err.split("these do:").nth(1).unwrap_or_else(|| panic!("no list of experiments in: {err}"));
    let able: Vec<&str> = able.lines().next().unwrap_or("").split(',').map(str::trim).collect();
    assert!(able.contains(&"dlm-programs"), "dlm-programs does not take --net: {able:?}");

    let (ok, err) = eval(&["dlm-programs", "--quick", "--net", "token-ring"]);
    assert!(!ok, "an unknown profile was accepted: {err}");
    assert!(err.contains("no network profile") && err.contains("myrinet-10g-x2"), "{err}");
}

#[test]
fn dlm_programs_servers_are_on_the_testbed_hosts_and_serve_a_program_on_the_client_host() {
    let bin = pagewise();
    let hosts = ServerHosts::new(Some(profile("25gbe").unwrap()), 2).unwrap();
    let testbed_ips = hosts.server_addresses().expect("servers on a testbed");
    let servers = RunServers::start(&hosts, &bin, 2).unwrap();
    let addrs: Vec<SocketAddr> = servers.addresses().iter().map(|a| a.parse().unwrap()).collect();
    assert_eq!(addrs.len(), 2);
    for (a, ip) in addrs.iter().zip(&testbed_ips) {
        assert!(!a.ip().is_loopback(), "server at {a}: on this host's loopback");
        assert_eq!(a.ip().to_string(), *ip, "server at {a}: not a testbed server host's address");
    }
    assert_ne!(addrs[0].ip(), addrs[1].ip(), "both servers on one host");

    let scratch = Scratch::new("eval-net").unwrap();
    let job = jobs::sort(scratch.path(), 4 << 20, 16 << 20).unwrap();
    let budget = Duration::from_secs(120);
    let plain = programs::run(job.command(&bin, &Wrap::Plain), budget, None).unwrap();
    let want = job.canonical(&plain).unwrap();
    // The program on the client host, as dlm-programs runs it.
    let _on_client = hosts.enter_client().unwrap();
    let dlm = |local_mem: u64| {
        let flags = DlmFlags {
            page_size: Some(64 << 10),
            max_page_size: 64 << 10,
            local_mem,
            servers: 2,
            min_alloc: 1 << 20,
            decisions: None,
        };
        let out = programs::run(servers.command(&bin, &job, &flags), budget, None).unwrap();
        let tail = programs::tail(&out.stderr, 20);
        assert!(out.status.is_some_and(|s| s.success()), "pagewise run: {:?}\n{tail}", out.status);
        assert_eq!(job.canonical(&out).unwrap(), want, "output differs from the plain run's\n{tail}");
        assert!(routed_allocations(&out.stderr, "dlm").unwrap_or(0) > 0, "nothing on DLM memory\n{tail}");
        dlm_paging(&out.stderr).unwrap_or_else(|| panic!("no DLM counters on stderr\n{tail}"))
    };
    // With room to spare it measures what sort touches; with nine tenths of that, pages
    // travel to the testbed's servers and back.
    let touched = dlm(1 << 30).peak_local_bytes;
    let local = (touched * 9 / 10) & !((64 << 10) - 1);
    assert!(local >= 1 << 20, "sort touched {touched} B of DLM memory, too little to page");
    let p = dlm(local);
    assert!(p.travelled(), "no page travelled at {local} B local: {p:?}");
}
