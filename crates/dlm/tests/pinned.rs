//! Pages the kernel holds pinned — another process's process_vm_readv/writev (Open MPI's
//! shared-memory transport between ranks on one host), O_DIRECT I/O, io_uring's registered
//! buffers — cannot be moved (UFFDIO_MOVE fails with EBUSY). The runtime then keeps them
//! resident and evicts others; it never stops the program, and never loses a byte.
//!
//! The pin here is io_uring's: IORING_REGISTER_BUFFERS holds its pages until they are
//! unregistered, so every eviction of them is refused, every time.

mod common;

use common::with_server;
use pagewise_dlm::{Config, Dlm, FaultMode};

/// An io_uring instance holding `[addr, addr + len)` pinned (IORING_REGISTER_BUFFERS) until
/// dropped.
struct Pin {
    ring: libc::c_int,
}

impl Pin {
    fn new(addr: *mut u8, len: usize) -> Pin {
        // struct io_uring_params: 120 bytes, zero asks for the defaults.
        let mut params = [0u8; 120];
        // SAFETY: params is a zeroed io_uring_params; the kernel writes the ring offsets into it.
        let ring = unsafe { libc::syscall(libc::SYS_io_uring_setup, 4, params.as_mut_ptr()) } as libc::c_int;
        assert!(ring >= 0, "io_uring_setup: {}", std::io::Error::last_os_error());
        let iov = libc::iovec { iov_base: addr.cast(), iov_len: len };
        // SAFETY: one iovec; the kernel pins its pages (faulting them in through the runtime).
        let rc = unsafe {
            libc::syscall(libc::SYS_io_uring_register, ring, 0 /* REGISTER_BUFFERS */, &iov, 1)
        };
        assert_eq!(rc, 0, "IORING_REGISTER_BUFFERS: {}", std::io::Error::last_os_error());
        Pin { ring }
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        // SAFETY: closing the ring we opened unregisters its buffers.
        unsafe { libc::close(self.ring) };
    }
}

fn word(pass: u64, i: usize) -> u64 {
    (pass << 40) ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Each 4 KiB page of `[base, base + len)` holds `word(pass, page)` in its first and last word.
fn write_pass(base: *mut u8, len: usize, pass: u64) {
    for (i, off) in (0..len).step_by(4096).enumerate() {
        // SAFETY: inside the area, 8-byte aligned.
        unsafe {
            (base.add(off) as *mut u64).write_volatile(word(pass, i));
            (base.add(off + 4088) as *mut u64).write_volatile(!word(pass, i));
        }
    }
}

fn check_pass(base: *mut u8, len: usize, pass: u64) {
    for (i, off) in (0..len).step_by(4096).enumerate() {
        // SAFETY: as in write_pass.
        let (a, z) = unsafe {
            ((base.add(off) as *const u64).read_volatile(), (base.add(off + 4088) as *const u64).read_volatile())
        };
        assert_eq!((a, z), (word(pass, i), !word(pass, i)), "page {i} after pass {pass}");
    }
}

fn scenario(fault_mode: FaultMode) {
    let servers = vec![std::env::var("DLM_TEST_SERVER").unwrap()];
    // 128 KiB units (moved to and from the shadow), 1 MiB of local memory: 8 units.
    let cfg =
        Config { servers, local_mem: 1 << 20, base_page: 16 << 10, set_count: 8, fault_mode, ..Config::default() };
    let dlm = Dlm::init(cfg).unwrap();
    let len = 8 << 20;
    let base = dlm.alloc(len).unwrap();
    write_pass(base, len, 1);
    // Pin a unit and a half, across a unit boundary: the runtime may keep them, not the rest.
    let pinned = base.wrapping_add((3 << 20) + (64 << 10));
    // Under SIGBUS the kernel cannot fault pages in for the registration (EFAULT): touched
    // first, they are resident.
    for off in (0..192 << 10).step_by(4096) {
        // SAFETY: inside the area.
        unsafe { pinned.add(off).write_volatile(pinned.add(off).read_volatile()) };
    }
    let pin = Pin::new(pinned, 192 << 10);
    for pass in 2..5 {
        check_pass(base, len, pass - 1);
        write_pass(base, len, pass);
    }
    dlm.evict_all();
    check_pass(base, len, 4);
    drop(pin);
    write_pass(base, len, 5);
    dlm.evict_all();
    check_pass(base, len, 5);
    let s = dlm.stats();
    // Evicting or arming the pinned units was refused, and they were kept.
    assert!(s.pinned_kept_bytes > 0, "{s:?}");
}

#[test]
fn pinned_pages_stay_resident_and_nothing_is_lost_handler_thread() {
    with_server("pinned_pages_stay_resident_and_nothing_is_lost_handler_thread", || scenario(FaultMode::HandlerThread));
}

#[test]
fn pinned_pages_stay_resident_and_nothing_is_lost_sigbus() {
    with_server("pinned_pages_stay_resident_and_nothing_is_lost_sigbus", || scenario(FaultMode::Sigbus));
}
