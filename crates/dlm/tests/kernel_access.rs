//! DLM memory handed to system calls: the handler-thread mode serves faults the kernel takes
//! on the program's behalf (read(2) into a missing page); the SIGBUS mode cannot (the kernel
//! gets EFAULT, documented in dlm.h) unless the page is resident.

mod common;

use std::io::Write;
use std::os::fd::AsRawFd;

use common::{in_child, run_child, ServerProc};
use pagewise_dlm::{Config, Dlm, FaultMode};

/// read(2) from a pipe into `dst`; returns the byte count or the errno.
fn pipe_read_into(dst: *mut u8, data: &[u8]) -> Result<usize, i32> {
    let (r, mut w) = std::io::pipe().unwrap();
    w.write_all(data).unwrap();
    drop(w);
    // SAFETY: dst is DLM memory of at least data.len() bytes.
    let n = unsafe { libc::read(r.as_raw_fd(), dst as *mut libc::c_void, data.len()) };
    if n < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(n as usize)
    }
}

fn scenario(mode: FaultMode, zero_copy: bool) {
    let servers = vec![std::env::var("DLM_TEST_SERVERS").unwrap()];
    let cfg = Config { servers, local_mem: 1 << 20, fault_mode: mode, zero_copy, ..Config::default() };
    let dlm = Dlm::init(cfg).unwrap();
    let len = 8 << 20;
    let base = dlm.alloc(len).unwrap();
    let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    // Written home first, so the read(2) below meets a page that must be fetched.
    // SAFETY: inside the area.
    unsafe { base.add(3 << 20).write_volatile(9) };
    dlm.evict_all();
    let dst = base.wrapping_add((3 << 20) + 100);
    let missing = pipe_read_into(dst, &data);
    match mode {
        FaultMode::HandlerThread => {
            assert_eq!(missing, Ok(data.len()));
            dlm.evict_all();
            // SAFETY: inside the area.
            let back = unsafe { std::slice::from_raw_parts(dst, data.len()) };
            assert_eq!(back, &data[..]);
            // SAFETY: as above.
            assert_eq!(unsafe { base.add(3 << 20).read_volatile() }, 9);
        }
        _ => {
            assert_eq!(missing, Err(libc::EFAULT));
            // Once the pages are resident (touched by the program), the kernel can use them.
            for off in (0..data.len() + 4096).step_by(4096) {
                // SAFETY: inside the area.
                unsafe { base.add((3 << 20) + off).write_volatile(0) };
            }
            assert_eq!(pipe_read_into(dst, &data), Ok(data.len()));
        }
    }
    println!("KERNEL-ACCESS-OK");
}

fn run(mode: FaultMode, zero_copy: bool, name: &str) {
    if in_child() {
        scenario(mode, zero_copy);
        return;
    }
    let s = ServerProc::start("256M");
    let out = run_child(name, &[("DLM_TEST_SERVERS", s.addr.clone())]);
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && so.contains("KERNEL-ACCESS-OK"), "{so}\n{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn handler_thread_serves_faults_taken_in_system_calls() {
    run(FaultMode::HandlerThread, false, "handler_thread_serves_faults_taken_in_system_calls");
}

#[test]
fn handler_thread_serves_faults_taken_in_system_calls_zero_copy() {
    run(FaultMode::HandlerThread, true, "handler_thread_serves_faults_taken_in_system_calls_zero_copy");
}

#[test]
fn sigbus_mode_gives_efault_to_system_calls_on_missing_pages() {
    run(FaultMode::Sigbus, false, "sigbus_mode_gives_efault_to_system_calls_on_missing_pages");
}

#[test]
fn sigbus_mode_gives_efault_to_system_calls_on_missing_pages_zero_copy() {
    run(FaultMode::Sigbus, true, "sigbus_mode_gives_efault_to_system_calls_on_missing_pages_zero_copy");
}
