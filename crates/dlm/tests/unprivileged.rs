//! Fault-path choice without privileges: an unprivileged process (uid nobody, with
//! vm.unprivileged_userfaultfd=0) still gets userfaultfd in user-mode-only form and the SIGBUS
//! path; with userfaultfd blocked entirely (seccomp, as container profiles do) the runtime
//! falls back to PROT_NONE + SIGSEGV by itself. Both pass the same integrity scenario.

mod common;

use std::os::unix::process::CommandExt;
use std::process::Command;

use common::{in_child, ServerProc};
use pagewise_dlm::{Config, Dlm, FaultMode};
use rand::{Rng, SeedableRng};

const NOBODY: u32 = 65534;

fn scenario() {
    let servers: Vec<String> = std::env::var("DLM_TEST_SERVERS").unwrap().split(',').map(String::from).collect();
    let cfg = Config { servers, local_mem: 1 << 20, fault_mode: FaultMode::Auto, ..Config::default() };
    let dlm = Dlm::init(cfg).unwrap();
    let len = 16usize << 20;
    let base = dlm.alloc(len).unwrap() as *mut u64;
    let mut model = vec![0u64; len / 4096];
    let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
    for _ in 0..5000 {
        let k = rng.random_range(0..model.len());
        // SAFETY: k*512 words is inside the area.
        let v = unsafe { base.add(k * 512).read_volatile() };
        assert_eq!(v, model[k]);
        let nv = rng.random::<u64>();
        // SAFETY: as above.
        unsafe { base.add(k * 512).write_volatile(nv) };
        model[k] = nv;
    }
    for (k, &m) in model.iter().enumerate() {
        // SAFETY: as above.
        assert_eq!(unsafe { base.add(k * 512).read_volatile() }, m);
    }
    dlm.audit().unwrap();
    let st = dlm.stats();
    println!("MODE={} USER_MODE_ONLY={} evictions={}", st.mode, st.uffd_user_mode_only, st.evictions);
}

/// A seccomp filter making userfaultfd(2) fail with ENOSYS (x86-64 syscall numbers).
fn block_userfaultfd() -> std::io::Result<()> {
    #[repr(C)]
    struct SockFilter {
        code: u16,
        jt: u8,
        jf: u8,
        k: u32,
    }
    #[repr(C)]
    struct SockFprog {
        len: u16,
        filter: *const SockFilter,
    }
    let filter = [
        SockFilter { code: 0x20, jt: 0, jf: 0, k: 0 }, // A = seccomp_data.nr
        SockFilter { code: 0x15, jt: 0, jf: 1, k: libc::SYS_userfaultfd as u32 },
        SockFilter { code: 0x06, jt: 0, jf: 0, k: 0x0005_0000 | libc::ENOSYS as u32 }, // RET_ERRNO
        SockFilter { code: 0x06, jt: 0, jf: 0, k: 0x7fff_0000 },                       // RET_ALLOW
    ];
    let prog = SockFprog { len: filter.len() as u16, filter: filter.as_ptr() };
    // SAFETY: prctl with valid arguments; the filter outlives the call (the kernel copies it).
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            || libc::prctl(libc::PR_SET_SECCOMP, 2 /* SECCOMP_MODE_FILTER */, &prog as *const SockFprog) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

fn run(name: &str, seccomp: bool) -> Option<String> {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        pagewise_kernel::testing::skip("switching to uid nobody needs root");
        return None;
    }
    let sysctl = std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd").unwrap_or_default();
    if !seccomp && sysctl.trim() != "0" {
        pagewise_kernel::testing::skip(format!("vm.unprivileged_userfaultfd={} (the case needs 0)", sysctl.trim()));
        return None;
    }
    // One at a time: a fork in another test while the copy below is open for writing would
    // hand the child the write descriptor, and exec of the copy would fail with ETXTBSY.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let servers = [ServerProc::start("256M"), ServerProc::start("256M")];
    // The test binary may sit below a directory only root can enter (a clone under a
    // `mktemp -d` directory is 0700): run a copy from a directory the user nobody can enter.
    // A private directory (mkdtemp), opened to others below once it holds only our copy.
    let scratch = pagewise_kernel::private_dir::PrivateDir::new(&format!("unprivileged-{name}")).unwrap();
    let dir = scratch.path().to_path_buf();
    let exe = dir.join("unprivileged-test");
    std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
    for p in [&dir, &exe] {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    let mut cmd = Command::new(&exe);
    cmd.current_dir(&dir)
        .args(["--exact", name, "--nocapture"])
        .env("DLM_CHILD", "1")
        .env(pagewise_dlm::auth::SECRET_ENV, common::secret().as_env_value())
        .env("DLM_TEST_SERVERS", format!("{},{}", servers[0].addr, servers[1].addr))
        .uid(NOBODY)
        .gid(NOBODY);
    if seccomp {
        // SAFETY: the closure only makes prctl calls, which are async-signal-safe.
        unsafe { cmd.pre_exec(block_userfaultfd) };
    }
    let out = cmd.output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let so = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{so}\n{}", String::from_utf8_lossy(&out.stderr));
    Some(so)
}

#[test]
fn unprivileged_process_gets_user_mode_userfaultfd() {
    if in_child() {
        scenario();
        return;
    }
    if let Some(so) = run("unprivileged_process_gets_user_mode_userfaultfd", false) {
        assert!(so.contains("MODE=sigbus USER_MODE_ONLY=true"), "{so}");
    }
}

#[test]
fn without_userfaultfd_the_sigsegv_fallback_is_chosen() {
    if in_child() {
        scenario();
        return;
    }
    if let Some(so) = run("without_userfaultfd_the_sigsegv_fallback_is_chosen", true) {
        assert!(so.contains("MODE=sigsegv"), "{so}");
    }
}

/// The handler thread is there to serve the kernel's faults too (a read(2) into a page not
/// resident): unprivileged, with only a user-mode-only descriptor to be had, it is refused
/// rather than started to fail such reads with EFAULT.
#[test]
fn the_handler_thread_is_refused_a_user_mode_only_userfaultfd() {
    if in_child() {
        let servers: Vec<String> = std::env::var("DLM_TEST_SERVERS").unwrap().split(',').map(String::from).collect();
        let cfg = Config { servers, local_mem: 1 << 20, fault_mode: FaultMode::HandlerThread, ..Config::default() };
        match Dlm::init(cfg) {
            Ok(d) => println!("STARTED mode={} USER_MODE_ONLY={}", d.stats().mode, d.stats().uffd_user_mode_only),
            Err(e) => println!("REFUSED: {e}"),
        }
        return;
    }
    if let Some(so) = run("the_handler_thread_is_refused_a_user_mode_only_userfaultfd", false) {
        assert!(so.contains("REFUSED: ") && so.contains("userfaultfd"), "{so}");
    }
}
