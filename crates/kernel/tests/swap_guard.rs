//! A swap file made by `pagewise_kernel::swap` really works, and the settings guard never
//! leaves it on: it is swapped off and deleted when the guard drops, after a panic, and
//! (through the guard's journal) after SIGKILL.
//!
//! The files live in cargo's per-target scratch directory (target/tmp), on the disk the repo
//! is on: swapon(2) refuses tmpfs. The children are this test binary re-run with
//! `PAGEWISE_SWAP_CHILD` naming what to do.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use pagewise_kernel::cgroup::{v1_memory_root, v2_memory_root, MemCgroup};
use pagewise_kernel::guard::{recover_dead_journals, SettingsGuard};
use pagewise_kernel::swap::{active_swaps, SwapFile, SwapSpace};

const SIZE: u64 = 64 << 20;

/// One swap file on at a time. The kernel pages any process out to any active swap file, so
/// a test's file would otherwise hold another test's pages, and its swapoff — which must bring
/// them back into that test's limited memory cgroup — can fail (ENOMEM) and leave it on.
static ONE_SWAP_FILE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_SWAP_FILE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn scratch(tag: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("swap-guard-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(tag)
}

fn can_swap() -> bool {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        pagewise_kernel::testing::skip("swapon(2) needs CAP_SYS_ADMIN (root)");
        return false;
    }
    if !Path::new("/proc/swaps").exists() {
        pagewise_kernel::testing::skip("no /proc/swaps: kernel built without CONFIG_SWAP");
        return false;
    }
    true
}

fn listed(path: &Path) -> bool {
    active_swaps().unwrap().iter().any(|a| a.path == path)
}

/// The children's side: make a swap file, turn it on, report its path, then misbehave as told.
#[test]
fn child_entry() {
    let Ok(action) = std::env::var("PAGEWISE_SWAP_CHILD") else { return };
    if action == "touch" {
        // Touch 48 MiB, then check every byte: under a 16 MiB limit most of it went to swap.
        let mut v = vec![0u8; 48 << 20];
        for (i, b) in v.iter_mut().enumerate() {
            *b = (i / 4096) as u8 ^ (i as u8);
        }
        let bad = v.iter().enumerate().filter(|(i, b)| **b != (i / 4096) as u8 ^ (*i as u8)).count();
        println!("bad {bad}");
        return;
    }
    let path = PathBuf::from(std::env::var("PAGEWISE_SWAP_FILE").unwrap());
    let guard = SettingsGuard::new();
    let swap = SwapFile::create(&guard, &path, SIZE).unwrap();
    swap.on().unwrap();
    println!("swap-on {}", swap.path().display());
    match action.as_str() {
        "panic" => panic!("deliberate panic with swap on"),
        _ => std::thread::sleep(std::time::Duration::from_secs(60)),
    }
}

// The callers wait for the child; a failed unwrap here fails the test, and the child, whose
// guard removes its swap file, ends by itself (panic, or its 60 s sleep).
#[allow(clippy::zombie_processes)]
fn spawn_child(action: &str, file: &Path) -> (std::process::Child, PathBuf) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env("PAGEWISE_SWAP_CHILD", action)
        .env("PAGEWISE_SWAP_FILE", file)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 {
            let status = child.wait().unwrap();
            panic!("the child ended before turning swap on: {status:?}");
        }
        // libtest prints "test child_entry ... " before the child's own output.
        if let Some(p) = line.trim().split("swap-on ").nth(1) {
            let p = PathBuf::from(p);
            assert!(listed(&p), "the child's swap file is on");
            return (child, p);
        }
    }
}

#[test]
fn swap_file_works_and_is_gone_when_the_guard_drops() {
    let _serial = one_at_a_time();
    if !can_swap() {
        return;
    }
    let path;
    {
        let guard = SettingsGuard::new_without_signal_handler();
        let swap = SwapFile::create(&guard, scratch("dropped"), SIZE).unwrap();
        path = swap.path().to_path_buf();
        assert!(path.is_file() && !swap.is_on().unwrap());
        assert!(SwapFile::create(&guard, &path, SIZE).is_err(), "an existing file is never overwritten");
        swap.on().unwrap();
        let area = swap.area().unwrap().expect("listed in /proc/swaps");
        // The kernel's size excludes the header page.
        assert_eq!(area.size_kib, (SIZE - 4096) >> 10);
        assert_eq!(area.kind, "file");
        // It really holds pages: a program over its memory cgroup's limit runs to the end with
        // every byte intact, its excess paged out (pswpout grows; other swap users only add).
        if v1_memory_root().is_some() || v2_memory_root().is_some() {
            let cg = MemCgroup::create(&guard, &format!("swap-test-{}", std::process::id())).unwrap();
            cg.set_limit(Some(16 << 20)).unwrap();
            let before = pagewise_kernel::procfs::read_vmstat().unwrap()["pswpout"];
            let mut cmd = Command::new(std::env::current_exe().unwrap());
            cmd.args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
                .env("PAGEWISE_SWAP_CHILD", "touch")
                .stderr(Stdio::null());
            cg.spawn_into(&mut cmd).unwrap();
            let out = cmd.output().unwrap();
            assert!(out.status.success(), "the child ran to the end under its limit: {:?}", out.status);
            assert!(String::from_utf8_lossy(&out.stdout).contains("bad 0"), "every byte came back");
            let paged = pagewise_kernel::procfs::read_vmstat().unwrap()["pswpout"] - before;
            assert!(paged >= (16 << 20) / 4096, "pages went to swap: {paged}");
        } else {
            pagewise_kernel::testing::skip("no memory cgroup: swap file not exercised");
        }
        swap.off().unwrap();
        assert!(!swap.is_on().unwrap());
        swap.on().unwrap();
        assert!(swap.is_on().unwrap());
    }
    assert!(!listed(&path), "swapped off when the guard dropped");
    assert!(!path.exists(), "deleted when the guard dropped");
}

#[test]
fn swap_file_is_gone_after_a_panic() {
    let _serial = one_at_a_time();
    if !can_swap() {
        return;
    }
    let (mut child, path) = spawn_child("panic", &scratch("panicked"));
    assert!(!child.wait().unwrap().success());
    assert!(!listed(&path), "swapped off by the unwinding guard");
    assert!(!path.exists());
}

#[test]
fn swap_file_is_gone_after_sigkill_once_a_guard_starts() {
    let _serial = one_at_a_time();
    if !can_swap() {
        return;
    }
    let (mut child, path) = spawn_child("sleep", &scratch("killed"));
    child.kill().unwrap();
    child.wait().unwrap();
    // SIGKILL leaves it on until the next guard starts (which may be another process's).
    let errors = recover_dead_journals();
    assert!(errors.is_empty(), "{errors:?}");
    assert!(!listed(&path), "swapped off from the dead process's journal");
    assert!(!path.exists());
}
