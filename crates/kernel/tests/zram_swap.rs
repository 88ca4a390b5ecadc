//! Swap on zram set up by `pagewise_kernel::swap::ZramSwap` really holds a program's pages, and
//! the settings guard never leaves the device initialised or the swap on: it is swapped off,
//! reset and its algorithm put back when the guard drops, after a panic, and (through the
//! guard's journal) after SIGKILL. A device already in use is refused and left alone.
//!
//! The children are this test binary re-run with `PAGEWISE_ZRAM_CHILD` naming what to do.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use pagewise_kernel::cgroup::{v1_memory_root, v2_memory_root, MemCgroup};
use pagewise_kernel::guard::{recover_dead_journals, SettingsGuard};
use pagewise_kernel::swap::zram::parse_algorithms;
use pagewise_kernel::swap::{active_swaps, SwapSpace, ZramSwap};

const DEVICE: &str = "zram0";
const SIZE: u64 = 64 << 20;

/// One device, so one test at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn sysfs(file: &str) -> String {
    std::fs::read_to_string(Path::new("/sys/block").join(DEVICE).join(file)).unwrap().trim().to_string()
}

fn selected_algorithm() -> Option<String> {
    parse_algorithms(&sysfs("comp_algorithm")).selected
}

/// An algorithm the device offers other than its current one, so that the test sees it put
/// back.
fn another_algorithm() -> Option<String> {
    let a = parse_algorithms(&sysfs("comp_algorithm"));
    a.available.into_iter().find(|x| Some(x) != a.selected.as_ref())
}

fn can_use_zram() -> bool {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        pagewise_kernel::testing::skip("zram setup and swapon(2) need root");
        return false;
    }
    if !Path::new("/sys/block").join(DEVICE).exists() {
        pagewise_kernel::testing::skip("no /sys/block/zram0: kernel without zram, or the module is not loaded");
        return false;
    }
    true
}

fn listed() -> bool {
    active_swaps().unwrap().iter().any(|a| a.path == Path::new("/dev").join(DEVICE))
}

/// The device as nobody uses it: uninitialised, not swap, its algorithm `algorithm`.
fn assert_unused(algorithm: &Option<String>) {
    assert!(!listed(), "swapped off");
    assert_eq!(sysfs("initstate"), "0", "reset");
    assert_eq!(sysfs("disksize"), "0", "reset");
    assert_eq!(&selected_algorithm(), algorithm, "algorithm put back");
}

/// The children's side: set the device up as swap, turn it on, say so, then misbehave as told.
#[test]
fn child_entry() {
    let Ok(action) = std::env::var("PAGEWISE_ZRAM_CHILD") else { return };
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
    let guard = SettingsGuard::new();
    let zram = ZramSwap::create(&guard, DEVICE, SIZE, another_algorithm().as_deref()).unwrap();
    zram.on().unwrap();
    println!("zram-on");
    match action.as_str() {
        "panic" => panic!("deliberate panic with zram swap on"),
        _ => std::thread::sleep(std::time::Duration::from_secs(60)),
    }
}

// The callers wait for the child; the child, whose guard resets the device, ends by itself
// (panic, or its 60 s sleep).
#[allow(clippy::zombie_processes)]
fn spawn_child(action: &str) -> std::process::Child {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env("PAGEWISE_ZRAM_CHILD", action)
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
            panic!("the child ended before turning zram swap on: {status:?}");
        }
        if line.contains("zram-on") {
            assert!(listed(), "the child's zram swap is on");
            assert_eq!(sysfs("initstate"), "1");
            return child;
        }
    }
}

#[test]
fn zram_swap_holds_pages_and_is_reset_when_the_guard_drops() {
    let _serial = one_at_a_time();
    if !can_use_zram() {
        return;
    }
    let before = selected_algorithm();
    let other = another_algorithm();
    {
        let guard = SettingsGuard::new_without_signal_handler();
        let zram = ZramSwap::create(&guard, DEVICE, SIZE, other.as_deref()).unwrap();
        assert_eq!(Some(zram.algorithm().to_string()), other.clone().or(before.clone()));
        assert_eq!(selected_algorithm().as_deref(), Some(zram.algorithm()));
        assert_eq!(sysfs("disksize"), SIZE.to_string());
        assert!(!zram.is_on().unwrap(), "not on before on()");
        let again = SettingsGuard::new_without_signal_handler();
        let e = ZramSwap::create(&again, DEVICE, SIZE, None).unwrap_err();
        assert!(e.to_string().contains("already set up"), "{e}");
        drop(again);
        assert_eq!(sysfs("initstate"), "1", "a refused second setup leaves the first one alone");
        zram.on().unwrap();
        let area = zram.area().unwrap().expect("listed in /proc/swaps");
        assert_eq!(area.kind, "partition");
        // The kernel's size excludes the header page.
        assert_eq!(area.size_kib, (SIZE - 4096) >> 10);
        // It really holds pages: a program over its memory cgroup's limit runs to the end with
        // every byte intact, its excess compressed into the device.
        if v1_memory_root().is_some() || v2_memory_root().is_some() {
            let cg = MemCgroup::create(&guard, &format!("zram-test-{}", std::process::id())).unwrap();
            cg.set_limit(Some(16 << 20)).unwrap();
            zram.reset_peak().unwrap();
            let out_before = pagewise_kernel::procfs::read_vmstat().unwrap()["pswpout"];
            let mut cmd = Command::new(std::env::current_exe().unwrap());
            cmd.args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
                .env("PAGEWISE_ZRAM_CHILD", "touch")
                .stderr(Stdio::null());
            cg.spawn_into(&mut cmd).unwrap();
            let out = cmd.output().unwrap();
            assert!(out.status.success(), "the child ran to the end under its limit: {:?}", out.status);
            assert!(String::from_utf8_lossy(&out.stdout).contains("bad 0"), "every byte came back");
            let paged = pagewise_kernel::procfs::read_vmstat().unwrap()["pswpout"] - out_before;
            assert!(paged >= (16 << 20) / 4096, "pages went to swap: {paged}");
            let stat = zram.mm_stat().unwrap();
            assert!(stat.mem_used_max > 0, "the device's pool held them: {stat:?}");
        } else {
            pagewise_kernel::testing::skip("no memory cgroup: zram swap not exercised");
        }
        zram.off().unwrap();
        assert!(!zram.is_on().unwrap());
        zram.on().unwrap();
    }
    assert_unused(&before);
}

#[test]
fn zram_swap_is_reset_after_a_panic() {
    let _serial = one_at_a_time();
    if !can_use_zram() {
        return;
    }
    let before = selected_algorithm();
    let mut child = spawn_child("panic");
    assert!(!child.wait().unwrap().success());
    assert_unused(&before);
}

#[test]
fn zram_swap_is_reset_after_sigkill_once_a_guard_starts() {
    let _serial = one_at_a_time();
    if !can_use_zram() {
        return;
    }
    let before = selected_algorithm();
    let mut child = spawn_child("sleep");
    child.kill().unwrap();
    child.wait().unwrap();
    // SIGKILL leaves it set up until the next guard starts (which may be another process's).
    let errors = recover_dead_journals();
    assert!(errors.is_empty(), "{errors:?}");
    assert_unused(&before);
}
