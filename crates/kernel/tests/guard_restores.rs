//! The settings guard restores a changed THP mode and hugetlb pool after a panic, after
//! SIGTERM, and (through its journal) after SIGKILL — each time in a child process that really
//! changed the system.
//!
//! The child is this same test binary re-run with `PAGEWISE_GUARD_CHILD` naming what to do.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use pagewise_kernel::guard::SettingsGuard;
use pagewise_kernel::thp::{HugetlbPool, ThpSetting};

const HUGE_2M: u64 = 2 << 20;
static SERIAL: Mutex<()> = Mutex::new(());

fn can_change_settings() -> bool {
    // SAFETY: no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let writable = std::fs::metadata(ThpSetting::Enabled.path()).is_ok();
    if !root || !writable {
        pagewise_kernel::testing::skip("needs root and THP sysfs");
    }
    root && writable
}

fn snapshot() -> (String, u64) {
    (ThpSetting::Enabled.read().unwrap().active, HugetlbPool::read(HUGE_2M).unwrap().nr_hugepages)
}

/// Another THP mode than the current one, and another pool size.
fn changed_values() -> (String, u64) {
    let mode = ThpSetting::Enabled.read().unwrap();
    let other = mode.choices.iter().find(|c| **c != mode.active).unwrap().clone();
    (other, HugetlbPool::read(HUGE_2M).unwrap().nr_hugepages + 3)
}

/// The child's side: change both settings, report, then misbehave as told.
#[test]
fn child_entry() {
    let Ok(action) = std::env::var("PAGEWISE_GUARD_CHILD") else { return };
    let (mode, pages) = changed_values();
    let guard = SettingsGuard::new();
    ThpSetting::Enabled.set(&guard, &mode).unwrap();
    HugetlbPool::resize(&guard, HUGE_2M, pages).unwrap();
    println!("changed");
    match action.as_str() {
        "panic" => panic!("deliberate panic with settings changed"),
        _ => std::thread::sleep(Duration::from_secs(60)),
    }
}

fn spawn_child(action: &str) -> std::process::Child {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env("PAGEWISE_GUARD_CHILD", action)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(lines.any(|l| l.unwrap().contains("changed")), "child never changed the settings");
    child
}

/// Serialise the tests that change system settings, and take the settings' values before;
/// `None` in the child process itself or where settings cannot be changed.
fn setup() -> Option<(std::sync::MutexGuard<'static, ()>, (String, u64))> {
    if std::env::var("PAGEWISE_GUARD_CHILD").is_ok() || !can_change_settings() {
        return None;
    }
    let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    Some((serial, snapshot()))
}

/// Start a child that changes the settings and sleeps, check the change, then kill it with `sig`.
fn change_then_kill(before: &(String, u64), sig: i32) {
    let mut child = spawn_child("sleep");
    assert_ne!(&snapshot(), before, "the child really changed the settings");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, sig) };
    assert!(!child.wait().unwrap().success());
}

#[test]
fn restored_after_a_panic_in_a_child() {
    let Some((_serial, before)) = setup() else { return };
    let status = spawn_child("panic").wait().unwrap();
    assert!(!status.success(), "the child panicked");
    assert_eq!(snapshot(), before);
}

#[test]
fn restored_after_sigterm() {
    let Some((_serial, before)) = setup() else { return };
    change_then_kill(&before, libc::SIGTERM);
    assert_eq!(snapshot(), before);
}

#[test]
fn restored_after_sigkill_by_the_next_guard() {
    let Some((_serial, before)) = setup() else { return };
    change_then_kill(&before, libc::SIGKILL);
    assert_ne!(snapshot(), before, "SIGKILL leaves the change in place");
    let _next = SettingsGuard::new_without_signal_handler();
    assert_eq!(snapshot(), before, "the next guard replayed the dead child's journal");
}
