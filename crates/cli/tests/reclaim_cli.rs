//! The reclaim commands as a user runs them: `pagewise reclaimd`, `pagewise reclaim show/stat`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pagewise_kernel::cgroup::{v1_memory_root, v2_memory_root, MemCgroup};
use pagewise_kernel::procfs::read_vm_sysctl;
use pagewise_kernel::SettingsGuard;

const PAGEWISE: &str = env!("CARGO_BIN_EXE_pagewise");

/// `text` as reclaimd.toml in a private directory, removed when the first is dropped.
fn config_file(tag: &str, text: &str) -> (pagewise_kernel::private_dir::PrivateDir, std::path::PathBuf) {
    let dir = pagewise_kernel::private_dir::PrivateDir::new(&format!("cli-{tag}")).unwrap();
    let p = dir.join("reclaimd.toml");
    std::fs::write(&p, text).unwrap();
    (dir, p)
}

#[test]
fn bad_config_is_refused_naming_the_key() {
    let cases = [
        ("[roles]\nreclaim = \"0\"\n[cores.\"4096\"]\nmin_free_kbytes = 1\n", "cores.\"4096\""),
        ("[roles]\nprotect = \"0\"\nreclaim = \"0\"\n", "roles"),
        ("[roles]\nreclaim = \"0\"\n[cores.\"0\"]\nmin_free_kbytes = 1\npages_high_ratio = 50\n", "pages_high_ratio"),
        ("[roles]\nreclaim = \"0\"\nintervall_ms = 3\n", "intervall_ms"),
    ];
    for (i, (text, key)) in cases.iter().enumerate() {
        let (_dir, path) = config_file(&format!("bad{i}"), text);
        for args in [vec!["reclaimd", "--config"], vec!["reclaim", "show", "--config"]] {
            let out = Command::new(PAGEWISE).args(&args).arg(&path).output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{args:?} accepted {text:?}");
            assert!(err.contains(key) && err.contains(path.to_str().unwrap()), "{args:?}: {err}");
        }
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn show_prints_the_papers_semantics() {
    let (_dir, path) = config_file(
        "show",
        "[roles]\nprotect = \"1\"\nreclaim = \"0\"\n[cores.\"0\"]\nmin_free_kbytes = 12288\npages_low_ratio = 240\npages_high_ratio = 400\n",
    );
    let out = Command::new(PAGEWISE).args(["reclaim", "show", "--json", "--config"]).arg(&path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["cores"][0]["cgroup_pages"], serde_json::json!({"min": 3072, "low": 7372, "high": 12288}));
    let kernel: u64 = read_vm_sysctl("min_free_kbytes").unwrap().parse().unwrap();
    let cores = pagewise_kernel::cpu::online_cpus().unwrap().len() as u64;
    assert_eq!(j["min_free_kbytes"].as_u64().unwrap(), 12288 + (cores - 1) * kernel, "the sum of the cores' mins");
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn stat_reports_per_core_for_a_command() {
    if !pagewise_kernel::tracefs::supported() {
        pagewise_kernel::testing::skip("no tracefs");
        return;
    }
    let out = Command::new(PAGEWISE).args(["reclaim", "stat", "--json", "--", "true"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(j["total"]["memcg"]["count"].is_u64() && j["seconds"].as_f64().unwrap() < 60.0, "{j}");
    let out = Command::new(PAGEWISE).args(["reclaim", "stat", "--", "false"]).output().unwrap();
    assert!(!out.status.success(), "the command's failure is passed on");
}

#[test]
fn a_killed_daemon_leaves_the_system_as_it_found_it() {
    if v1_memory_root().is_none() && v2_memory_root().is_none() {
        pagewise_kernel::testing::skip("no memory cgroup controller");
        return;
    }
    let guard = SettingsGuard::new_without_signal_handler();
    let cg = MemCgroup::create(&guard, &format!("cli-kill-{}", std::process::id())).unwrap();
    cg.set_limit(Some(64 << 20)).unwrap();
    let before = read_vm_sysctl("vfs_cache_pressure").unwrap();
    let changed = if before == "77" { "78" } else { "77" };
    let (_dir, path) = config_file(
        "kill",
        &format!(
            "scope = \"cgroup\"\ncgroup = \"{}\"\ntree = false\n[roles]\nreclaim = \"0\"\n[split]\nvfs_cache_pressure = {changed}\n",
            cg.path().display()
        ),
    );
    let mut child = Command::new(PAGEWISE)
        .args(["reclaimd", "--config"])
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while read_vm_sysctl("vfs_cache_pressure").unwrap() != changed {
        assert!(t0.elapsed() < Duration::from_secs(10), "reclaimd did not apply its setting");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL: no handler runs
    child.wait().unwrap();
    assert_eq!(read_vm_sysctl("vfs_cache_pressure").unwrap(), changed, "still changed after SIGKILL");
    // The next guard on the machine replays the dead daemon's journal.
    drop(SettingsGuard::new_without_signal_handler());
    assert_eq!(read_vm_sysctl("vfs_cache_pressure").unwrap(), before);
    assert_eq!(cg.limit().unwrap(), Some(64 << 20));
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn set_and_show_go_through_the_running_daemons_tree() {
    if v1_memory_root().is_none() && v2_memory_root().is_none() {
        pagewise_kernel::testing::skip("no memory cgroup controller");
        return;
    }
    let tree = std::path::Path::new("/run/pagewise/percpu_free_mem");
    if pagewise_reclaim_tree_owner(tree) {
        pagewise_kernel::testing::skip("a reclaimd is already running on this machine");
        return;
    }
    let guard = SettingsGuard::new_without_signal_handler();
    let cg = MemCgroup::create(&guard, &format!("cli-set-{}", std::process::id())).unwrap();
    cg.set_limit(Some(64 << 20)).unwrap();
    let (_dir, path) = config_file(
        "set",
        &format!(
            "scope = \"cgroup\"\ncgroup = \"{}\"\n[roles]\nprotect = \"1\"\nreclaim = \"0\"\n",
            cg.path().display()
        ),
    );
    let mut daemon = Daemon(
        Command::new(PAGEWISE)
            .args(["reclaimd", "--config"])
            .arg(&path)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let child = &mut daemon.0;
    let t0 = Instant::now();
    while !tree.join("cpu1").exists() {
        assert!(t0.elapsed() < Duration::from_secs(10), "no tree");
        std::thread::sleep(Duration::from_millis(20));
    }
    let run = |args: &[&str]| Command::new(PAGEWISE).args(args).output().unwrap();
    assert!(run(&[
        "reclaim",
        "set",
        "--cpu",
        "0",
        "--min-free-kbytes",
        "12288",
        "--low-ratio",
        "240",
        "--high-ratio",
        "400"
    ])
    .status
    .success());
    let out = run(&[
        "reclaim",
        "set",
        "--cpu",
        "1",
        "--min-free-kbytes",
        "256",
        "--low-ratio",
        "3300",
        "--high-ratio",
        "4000",
    ]);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("12544"));
    let out = run(&["reclaim", "set", "--cpu", "1", "--low-ratio", "50"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("pages_low_ratio"));
    // The daemon applies the writes on its next poll (100 ms).
    std::thread::sleep(Duration::from_millis(400));
    let out = run(&["reclaim", "show", "--json"]);
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(j["source"].as_str().unwrap().contains("reclaimd pid"), "{j}");
    assert_eq!(j["min_free_kbytes"], 12544);
    assert_eq!(j["cores"][1]["thresholds"]["pages_low_ratio"], 3300);
    // SIGTERM: a clean stop that removes the tree and restores what it changed.
    sigterm(child.id());
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let mut report = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut report).unwrap();
    assert!(report.contains("min_free_kbytes is now 12544"), "{report}");
    assert!(!tree.exists());
    assert_eq!(cg.limit().unwrap(), Some(64 << 20));
    std::fs::remove_file(&path).unwrap();
}

fn pagewise_reclaim_tree_owner(tree: &std::path::Path) -> bool {
    std::fs::read_to_string(tree.join("daemon.pid"))
        .ok()
        .and_then(|p| p.trim().parse::<u32>().ok())
        .is_some_and(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists())
}

/// A daemon the test started, killed if the test fails before it stops it: a failed test
/// leaves no reclaimd behind to answer the next one's `pagewise reclaim set`.
struct Daemon(std::process::Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// SIGTERM to a child, with kill(1).
fn sigterm(pid: u32) {
    assert!(Command::new("kill").arg("-TERM").arg(pid.to_string()).status().unwrap().success());
}
