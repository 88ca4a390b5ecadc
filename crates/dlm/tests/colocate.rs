//! Under the handler thread, a program with one thread is pinned with the handler to one CPU
//! while it faults, and every mask is given back when it starts a thread; a child made by
//! fork(2) while pinned gets the program's mask at once, and a process started with an
//! inherited one-CPU mask gets the program's CPUs back (`runtime/colocate.rs`). Real server,
//! real faults; masks read from the kernel.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use pagewise_dlm::{Config, Dlm, FaultMode};
use pagewise_kernel::cpu;

const AREA: usize = 8 << 20;

fn dlm(colocate: bool) -> Dlm {
    Dlm::init(Config {
        servers: vec![std::env::var("DLM_TEST_SERVER").unwrap()],
        local_mem: 1 << 20,
        base_page: 4096,
        max_set: 1,
        set_count: 1,
        fault_mode: FaultMode::HandlerThread,
        colocate,
        ..Config::default()
    })
    .expect("init")
}

/// Touch every page of the area: with 1 MiB local of 8 MiB, faults all the way.
fn sweep(area: *mut u8) {
    for p in (0..AREA).step_by(4096) {
        // SAFETY: inside the area; the handler serves the fault.
        unsafe { area.add(p).write_volatile(p as u8) };
    }
}

fn handler_tid() -> i32 {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .find(|e| std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.starts_with("dlm-fault-handl")))
        .and_then(|e| e.file_name().to_str()?.parse().ok())
        .expect("the handler thread")
}

/// Wait (bounded) until `f` holds: the handler checks every 10 ms while pinned.
fn eventually(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !f() {
        assert!(Instant::now() < deadline, "{what}: not within 5 s");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn pins_and_gives_back() {
    let all = cpu::affinity(0).unwrap();
    assert!(all.len() >= 2, "needs two CPUs to tell a pin from the mask: {all:?}");
    let d = dlm(true);
    let area = d.alloc(AREA).unwrap();
    sweep(area);
    let mine = cpu::affinity(0).unwrap();
    assert_eq!(mine.len(), 1, "the program's one thread is pinned while it faults");
    assert_eq!(cpu::affinity(handler_tid()).unwrap(), mine, "the handler shares its CPU");
    assert!(d.stats().colocations >= 1);

    // A child made while pinned runs on the program's CPUs.
    // SAFETY: the child only calls sched_getaffinity (through `cpu::affinity`, which does not
    // allocate on success) and _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        let ok = cpu::affinity(0).is_ok_and(|m| m == all);
        // SAFETY: ends the child.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "the fork child has the program's CPUs");

    // A second thread: every mask back, the new thread's too, and no pin while it lives.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        // SAFETY: gettid has no preconditions.
        tid_tx.send(unsafe { libc::gettid() }).unwrap();
        rx.recv().unwrap();
    });
    let second = tid_rx.recv().unwrap();
    eventually("masks given back", || {
        cpu::affinity(0).unwrap() == all
            && cpu::affinity(second).unwrap() == all
            && cpu::affinity(handler_tid()).unwrap() == all
    });
    let pins = d.stats().colocations;
    sweep(area);
    assert_eq!(cpu::affinity(0).unwrap(), all, "no pin while the program has two threads");
    assert_eq!(d.stats().colocations, pins);
    tx.send(()).unwrap();
    t.join().unwrap();

    // One thread again: pinned again at its next faults.
    eventually("one thread again", || std::fs::read_dir("/proc/self/task").unwrap().count() == 2);
    sweep(area);
    assert_eq!(cpu::affinity(0).unwrap().len(), 1, "pinned again");
    d.free(area).unwrap();
    d.audit().unwrap();
}

fn off_leaves_masks_alone() {
    let all = cpu::affinity(0).unwrap();
    let d = dlm(false);
    let area = d.alloc(AREA).unwrap();
    sweep(area);
    assert_eq!(cpu::affinity(0).unwrap(), all);
    assert_eq!(cpu::affinity(handler_tid()).unwrap(), all);
    assert_eq!(d.stats().colocations, 0);
}

fn inherited_mask_is_widened() {
    let program: BTreeSet<usize> = cpu::parse_cpulist(&std::env::var(pagewise_dlm::PROGRAM_CPUS_ENV).unwrap()).unwrap();
    let one = *program.iter().next_back().unwrap();
    cpu::pin_to(one).unwrap();
    let _d = dlm(true);
    assert_eq!(cpu::affinity(0).unwrap(), program, "a one-CPU mask inherited from a pinned parent is widened");
}

// The scenarios, by the name `DLM_SCENARIO` gives them: only a program with one thread is
// pinned (`common::Scenarios`).
scenarios! {
    "pins" => pins_and_gives_back,
    "off" => off_leaves_masks_alone,
    "widen" => inherited_mask_is_widened,
}

fn run(scenario: &str) {
    let all = cpu::format_cpulist(&cpu::affinity(0).unwrap());
    common::run_scenario(scenario, &[(pagewise_dlm::PROGRAM_CPUS_ENV, all)]);
}

#[test]
fn a_single_threaded_program_shares_the_handlers_cpu_until_it_starts_a_thread() {
    run("pins");
}

#[test]
fn without_colocation_no_mask_changes() {
    run("off");
}

#[test]
fn a_process_started_by_a_pinned_program_gets_the_programs_cpus() {
    run("widen");
}
