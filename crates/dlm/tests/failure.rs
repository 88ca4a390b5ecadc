//! A memory server killed mid-run stops the program with a message naming the server and the
//! address range — never wrong data. The program runs in a child process.

mod common;

use common::{in_child, run_child, ServerProc};
use pagewise_dlm::{Config, Dlm, FaultMode};

fn scenario(mode: FaultMode) {
    let servers: Vec<String> = std::env::var("DLM_TEST_SERVERS").unwrap().split(',').map(String::from).collect();
    let victim: i32 = std::env::var("DLM_TEST_VICTIM").unwrap().parse().unwrap();
    let cfg = Config { servers, local_mem: 2 << 20, fault_mode: mode, ..Config::default() };
    let dlm = Dlm::init(cfg).unwrap();
    let len = 32 << 20;
    let base = dlm.alloc(len).unwrap();
    for off in (0..len).step_by(4096) {
        // SAFETY: inside the area.
        unsafe { base.add(off).write_volatile(0xA5) };
    }
    dlm.evict_all();
    // SAFETY: killing the server process the parent named.
    unsafe { libc::kill(victim, libc::SIGKILL) };
    std::thread::sleep(std::time::Duration::from_millis(300));
    let mut wrong = 0usize;
    for off in (0..len).step_by(4096) {
        // SAFETY: inside the area.
        if unsafe { base.add(off).read_volatile() } != 0xA5 {
            wrong += 1;
        }
    }
    println!("READ-ALL-DONE wrong={wrong}");
}

fn run(mode: FaultMode, name: &str) {
    if in_child() {
        scenario(mode);
        return;
    }
    let a = ServerProc::start("1G");
    let b = ServerProc::start("1G");
    let out = run_child(
        name,
        &[("DLM_TEST_SERVERS", format!("{},{}", a.addr, b.addr)), ("DLM_TEST_VICTIM", b.child.id().to_string())],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the program must stop: {stdout}");
    assert!(!stdout.contains("READ-ALL-DONE"), "the program went on reading: {stdout}");
    assert!(
        stderr.contains(&format!("memory server 1 ({})", b.addr))
            && stderr.contains("failed")
            && stderr.contains("pages 0x"),
        "message must name the server and range:\n{stderr}"
    );
}

#[test]
fn killed_server_stops_the_program_handler_thread() {
    run(FaultMode::HandlerThread, "killed_server_stops_the_program_handler_thread");
}

#[test]
fn killed_server_stops_the_program_sigbus() {
    run(FaultMode::Sigbus, "killed_server_stops_the_program_sigbus");
}

#[test]
fn killed_server_stops_the_program_sigsegv() {
    run(FaultMode::Sigsegv, "killed_server_stops_the_program_sigsegv");
}
