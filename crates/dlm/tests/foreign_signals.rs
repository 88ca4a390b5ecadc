//! A fault outside every DLM area reaches the program's own handler without waiting for the
//! runtime's lock (issue 23: the SIGBUS/SIGSEGV handler took the lock before it looked at the
//! address). The program installs its own handler first — a guard page it opens on SIGSEGV,
//! a file mapping it extends on SIGBUS — then starts DLM; a thread of it holds the runtime's
//! lock (a STATS request to a server this test has stopped with SIGSTOP) while the main thread
//! faults on its own memory. The program's handler must run while that thread still waits.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{in_child, ServerProc};
use pagewise_dlm::{Config, Dlm, FaultMode};

static OWN_HANDLED: AtomicUsize = AtomicUsize::new(0);
static GUARD: AtomicUsize = AtomicUsize::new(0);
static MEMFD: AtomicI32 = AtomicI32::new(-1);

/// The program's own handler: make its own memory accessible (async-signal-safe calls only).
extern "C" fn own_handler(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    let guard = GUARD.load(Ordering::Acquire);
    if guard == 0 || addr < guard || addr >= guard + 4096 {
        // Not the program's page: a real crash.
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(90) };
    }
    // SAFETY: the guard page is this program's own mapping; mprotect and ftruncate are
    // async-signal-safe system calls.
    unsafe {
        if sig == libc::SIGSEGV {
            libc::mprotect(guard as *mut libc::c_void, 4096, libc::PROT_READ | libc::PROT_WRITE);
        } else {
            libc::ftruncate(MEMFD.load(Ordering::Acquire), 4096);
        }
    }
    OWN_HANDLED.fetch_add(1, Ordering::AcqRel);
}

/// Map the program's own page that faults with `sig` on first touch, and install its handler.
fn own_memory(sig: libc::c_int) -> *mut u8 {
    // SAFETY: plain mmap/memfd calls; the results are checked.
    let page = unsafe {
        if sig == libc::SIGSEGV {
            libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        } else {
            // A shared mapping of an empty memfd: touching it is SIGBUS until the file grows.
            let fd = libc::memfd_create(c"own".as_ptr(), 0);
            assert!(fd >= 0);
            MEMFD.store(fd, Ordering::Release);
            libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
        }
    };
    assert_ne!(page, libc::MAP_FAILED);
    GUARD.store(page as usize, Ordering::Release);
    // SAFETY: a zeroed sigaction with our handler; the old action is not needed.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = own_handler as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(sig, &sa, std::ptr::null_mut()), 0);
    }
    page as *mut u8
}

/// The system call thread `tid` of this process is blocked in (-1 when running).
fn blocked_in(tid: i32) -> i64 {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall")).unwrap_or_default();
    text.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(-1)
}

fn scenario(mode: FaultMode) {
    let sig = if mode == FaultMode::Sigsegv { libc::SIGSEGV } else { libc::SIGBUS };
    let own = own_memory(sig);
    let cfg = Config {
        servers: vec![std::env::var("DLM_TEST_SERVER").unwrap()],
        local_mem: 1 << 20,
        fault_mode: mode,
        fault_timeout: Some(Duration::from_secs(120)),
        ..Config::default()
    };
    let dlm = Dlm::init(cfg).unwrap();
    assert_eq!(dlm.mode(), mode);
    let area = dlm.alloc(4 << 20).unwrap();
    // SAFETY: inside the area.
    unsafe { area.add(100).write_volatile(7) };
    println!("READY");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap(); // the server is stopped now
    let returned = AtomicBool::new(false);
    let tid = AtomicI32::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: gettid has no preconditions.
            tid.store(unsafe { libc::gettid() }, Ordering::Release);
            let _ = dlm.server_stats(0); // holds the runtime's lock until the server answers
            returned.store(true, Ordering::Release);
        });
        // Wait until that thread sits in a receive (read or recvfrom) with the lock held.
        let start = Instant::now();
        while tid.load(Ordering::Acquire) == 0 || !matches!(blocked_in(tid.load(Ordering::Acquire)), 0 | 45) {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the STATS thread never blocked (syscall {}, returned {})",
                blocked_in(tid.load(Ordering::Acquire)),
                returned.load(Ordering::Acquire)
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(100));
        // SAFETY: the program's own page; its handler makes it accessible.
        unsafe { own.write_volatile(1) };
        println!(
            "FOREIGN-DONE handled={} lock_holder_returned={}",
            OWN_HANDLED.load(Ordering::Acquire),
            returned.load(Ordering::Acquire)
        );
        std::io::stdout().flush().unwrap();
        std::io::stdin().read_line(&mut line).unwrap(); // the server runs again
    });
    // DLM faults still work (and the area's data is intact).
    // SAFETY: inside the area.
    assert_eq!(unsafe { area.add(100).read_volatile() }, 7);
    println!("SCENARIO-OK");
}

/// Wait until every thread of `pid` is stopped: kill(2) wakes one thread to start the group
/// stop, and until the others have stopped too, one of them can still answer a request.
fn wait_stopped(pid: i32) {
    let start = Instant::now();
    loop {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
        let all = tasks.flatten().all(|t| {
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            // The state follows the command name in parentheses.
            matches!(stat.rsplit(')').next().and_then(|r| r.split_whitespace().next()), Some("T" | "t"))
        });
        if all {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "the server did not stop");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn run(name: &str) {
    let mut srv = ServerProc::start("64M");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env("DLM_CHILD", "1")
        .env("DLM_TEST_SERVER", &srv.addr)
        .env(pagewise_dlm::auth::SECRET_ENV, common::secret().as_env_value())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let wait_line = |what: &str, within: Duration| -> Option<String> {
        let deadline = Instant::now() + within;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match rx.recv_timeout(left) {
                // libtest may print the test's name on the same line before our output.
                Ok(l) if l.contains(what) => return Some(l[l.find(what).unwrap()..].to_string()),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
        None
    };
    assert!(wait_line("READY", Duration::from_secs(60)).is_some(), "the scenario did not start");
    let pid = srv.child.id() as i32;
    pagewise_kernel::net::kill(pid, libc::SIGSTOP).unwrap();
    wait_stopped(pid);
    writeln!(stdin, "go").unwrap();
    let done = wait_line("FOREIGN-DONE", Duration::from_secs(30));
    pagewise_kernel::net::kill(pid, libc::SIGCONT).unwrap();
    let _ = writeln!(stdin, "go");
    let ok = wait_line("SCENARIO-OK", Duration::from_secs(60));
    let _ = child.kill();
    let _ = child.wait();
    srv.kill();
    let log = srv.log.lock().unwrap().join("");
    let done =
        done.unwrap_or_else(|| panic!("the program's own fault waited for the runtime's lock; server log:\n{log}"));
    assert_eq!(done, "FOREIGN-DONE handled=1 lock_holder_returned=false", "{done}");
    assert!(ok.is_some(), "DLM faults after the foreign one failed");
}

#[test]
fn a_foreign_sigbus_does_not_wait_for_the_runtime_lock() {
    if in_child() {
        return scenario(FaultMode::Sigbus);
    }
    run("a_foreign_sigbus_does_not_wait_for_the_runtime_lock");
}

#[test]
fn a_foreign_sigsegv_does_not_wait_for_the_runtime_lock() {
    if in_child() {
        return scenario(FaultMode::Sigsegv);
    }
    run("a_foreign_sigsegv_does_not_wait_for_the_runtime_lock");
}
