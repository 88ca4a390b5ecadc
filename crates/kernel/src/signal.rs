//! Real-time signals carrying a number (HPS notification), per-thread masks, and thread
//! identity and CPU clocks.
//!
//! HPS tells a process "N pages are active" with a queued real-time signal whose `si_value`
//! holds N (sigqueue(3)). Real-time signals queue (signal(7): "multiple instances of real-time
//! signals can be queued"), so a notification sent while the previous one is being handled is
//! kept, up to RLIMIT_SIGPENDING. Pagewise directs the signal at one thread
//! (rt_tgsigqueueinfo(2)) rather than the whole process, so a thread that never asked for
//! HPS notifications (a progress bar, a runtime worker) is never killed by the default action
//! of an unblocked real-time signal.

use std::time::Duration;

use crate::error::{Error, Result};

/// SIGRTMIN + `offset`, checked against SIGRTMAX.
pub fn rt_signal(offset: i32) -> Result<i32> {
    let sig = libc::SIGRTMIN() + offset;
    if offset < 0 || sig > libc::SIGRTMAX() {
        return Err(Error::Invalid(format!("SIGRTMIN+{offset} is beyond SIGRTMAX")));
    }
    Ok(sig)
}

/// The kernel thread id of the calling thread (gettid(2)).
pub fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// prctl(PR_SET_PDEATHSIG, sig): the calling process gets `sig` when the thread that forked it
/// exits. Async-signal-safe (one syscall, no allocation), for `Command::pre_exec`: children such
/// as an experiment's Spark daemons then die with an interrupted experiment. Returns the raw OS
/// error, as `pre_exec` wants.
pub fn set_parent_death_signal(sig: i32) -> std::io::Result<()> {
    // SAFETY: prctl with PR_SET_PDEATHSIG takes a signal number and touches no memory.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Send `sig` to every process of process group `pgid` (kill(2) with `-pgid`): how a
/// supervisor stops a child together with the processes that child started.
pub fn kill_process_group(pgid: i32, sig: i32) -> Result<()> {
    if pgid <= 1 {
        return Err(Error::Invalid(format!("kill: {pgid} names no process group of ours")));
    }
    // SAFETY: kill touches no memory of ours.
    if unsafe { libc::kill(-pgid, sig) } != 0 {
        return Err(Error::last_os("kill(process group)"));
    }
    Ok(())
}

/// Whether child `pid` has ended, without reaping it (waitid(2) with `WNOWAIT`): its id stays
/// its own until the caller reaps it, so a signal sent to it meanwhile cannot reach another
/// process that took the number over. `block`: wait until it ends (retried on EINTR).
pub fn child_ended(pid: u32, block: bool) -> Result<bool> {
    let options = libc::WEXITED | libc::WNOWAIT | if block { 0 } else { libc::WNOHANG };
    loop {
        // SAFETY: zeroed siginfo_t is a valid out-parameter; waitid writes only into it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: info is a valid, writable siginfo_t.
        if unsafe { libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, options) } == 0 {
            // WNOHANG with no change leaves si_pid 0 (waitid(2)).
            // SAFETY: waitid filled info (or left it zeroed).
            return Ok(unsafe { info.si_pid() } != 0);
        }
        let err = Error::last_os("waitid");
        if err.errno() != Some(libc::EINTR) {
            return Err(err);
        }
    }
}

/// The id of this process.
pub fn getpid() -> i32 {
    std::process::id() as i32
}

/// Queue `sig` with `value` in `si_value` to thread `tid` of process `tgid`
/// (rt_tgsigqueueinfo(2), filled in as sigqueue(3) would: `si_code = SI_QUEUE`).
pub fn queue_to_thread(tgid: i32, tid: i32, sig: i32, value: u64) -> Result<()> {
    // SAFETY: an all-zero siginfo_t is a valid starting point; we fill the fields sigqueue sets.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    info.si_signo = sig;
    info.si_code = libc::SI_QUEUE;
    // Layout of the _rt member (include/uapi/asm-generic/siginfo.h): after signo/errno/code
    // (3 ints, padded to 16 bytes on 64-bit) come pid (int), uid (uint), then sigval (8 bytes).
    // SAFETY: siginfo_t is 128 bytes; offsets 16..32 lie inside it.
    unsafe {
        let base = &mut info as *mut libc::siginfo_t as *mut u8;
        (base.add(16) as *mut i32).write(getpid());
        (base.add(20) as *mut u32).write(libc::getuid());
        (base.add(24) as *mut u64).write(value);
    }
    // SAFETY: info is a valid siginfo_t for the call; the kernel copies it.
    let rc = unsafe { libc::syscall(libc::SYS_rt_tgsigqueueinfo, tgid, tid, sig, &info as *const libc::siginfo_t) };
    if rc != 0 {
        return Err(Error::last_os("rt_tgsigqueueinfo"));
    }
    Ok(())
}

/// Block (`true`) or unblock `sig` in the calling thread (pthread_sigmask(3)).
pub fn set_thread_blocked(sig: i32, blocked: bool) -> Result<()> {
    // SAFETY: sigset_t is plain data initialised by sigemptyset before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        let how = if blocked { libc::SIG_BLOCK } else { libc::SIG_UNBLOCK };
        let rc = libc::pthread_sigmask(how, &set, std::ptr::null_mut());
        if rc != 0 {
            return Err(Error::Syscall { call: "pthread_sigmask", source: std::io::Error::from_raw_os_error(rc) });
        }
    }
    Ok(())
}

/// Spawn a thread of Pagewise's own (a fault handler, a tracker) with every asynchronous signal
/// blocked: a signal the kernel sends to the process as a whole (a timer's SIGALRM, SIGCHLD, a
/// kill(2)) is delivered to a thread that does not block it, and Pagewise's threads must not be
/// that thread — the program's handler would run on a thread that serves the program's faults,
/// and a handler touching that memory would wait on itself. Faults' own signals (SIGBUS,
/// SIGSEGV, SIGFPE, SIGILL, SIGTRAP, SIGSYS) stay unblocked. The new thread inherits the mask
/// (pthread_sigmask(3)); the caller's is restored.
///
/// Returns once the thread runs: by then its thread-local storage exists. In a library that
/// was dlopen'd (libpagewise under the preload shim), a thread's TLS block is allocated on its
/// first use with the process's `malloc` — a program's own allocator (redis's jemalloc), whose
/// memory may be the very memory this thread serves: allocated later, it would fault on memory
/// only it can bring in, and wait for ever. For the same reason the new thread first tells the
/// preload shim, when present, never to route what it allocates (`mark_runtime_thread`).
pub fn spawn_blocking_signals<F, T>(builder: std::thread::Builder, f: F) -> std::io::Result<std::thread::JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    // SAFETY: sigset_t is plain data initialised by sigfillset/sigdelset before use; `old` is
    // written by pthread_sigmask before it is read.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        for sig in [libc::SIGBUS, libc::SIGSEGV, libc::SIGFPE, libc::SIGILL, libc::SIGTRAP, libc::SIGSYS] {
            libc::sigdelset(&mut set, sig);
        }
        let mut old: libc::sigset_t = std::mem::zeroed();
        let rc = libc::pthread_sigmask(libc::SIG_SETMASK, &set, &mut old);
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
        let (started, running) = std::sync::mpsc::sync_channel::<()>(1);
        let spawned = builder.spawn(move || {
            mark_runtime_thread();
            // std has set this thread's handle in its TLS before this runs: the block exists.
            let _ = started.send(());
            f()
        });
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        let handle = spawned?;
        let _ = running.recv();
        Ok(handle)
    }
}

/// Tell the preload shim of `pagewise run` / `pagewise hps run`, when it is in the process,
/// that the calling thread is one of the runtime's own: it never routes that thread's
/// allocations or mappings to an arena. A runtime thread given arena memory would fault on
/// memory it serves itself (DLM's fault handler, HPS's tracker) and wait for itself forever.
fn mark_runtime_thread() {
    if let Some(sym) = crate::shim_function(c"pagewise_runtime_thread") {
        // SAFETY: the shim defines `void pagewise_runtime_thread(void)` (preload/shim.c).
        let mark: extern "C" fn() = unsafe { std::mem::transmute::<*mut libc::c_void, extern "C" fn()>(sym) };
        mark();
    }
}

/// Wait for `sig` (which must be blocked in this thread) up to `timeout`; `None` waits
/// forever. Returns the `si_value` of the dequeued signal, or `Ok(None)` on timeout.
/// EINTR (another signal's handler ran) is retried.
pub fn wait_value(sig: i32, timeout: Option<Duration>) -> Result<Option<u64>> {
    // SAFETY: sigset and siginfo are plain data; sigtimedwait writes info on success.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        loop {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let ts = timeout.map(|t| libc::timespec { tv_sec: t.as_secs() as _, tv_nsec: t.subsec_nanos() as _ });
            let tsp = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
            let rc = libc::sigtimedwait(&set, &mut info, tsp);
            if rc == sig {
                return Ok(Some(siginfo_value(&info)));
            }
            let err = std::io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EAGAIN) => return Ok(None),
                Some(libc::EINTR) => continue,
                _ => return Err(Error::Syscall { call: "sigtimedwait", source: err }),
            }
        }
    }
}

/// The `si_value` of a queued signal (as written by [`queue_to_thread`]).
pub fn siginfo_value(info: &libc::siginfo_t) -> u64 {
    // SAFETY: offset 24 of the 128-byte siginfo_t holds sigval for SI_QUEUE signals.
    unsafe { ((info as *const libc::siginfo_t as *const u8).add(24) as *const u64).read_unaligned() }
}

/// A signal handler taking the queued value: `fn(sig, value)`. It runs in signal context and
/// must only do async-signal-safe work (atomics, write(2) to a pipe or eventfd).
pub type ValueHandler = extern "C" fn(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void);

/// Install `handler` for `sig` with SA_SIGINFO | SA_RESTART.
pub fn install_handler(sig: i32, handler: ValueHandler) -> Result<()> {
    // SAFETY: a zeroed sigaction with a valid handler and empty mask is well formed.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
            return Err(Error::last_os("sigaction"));
        }
    }
    Ok(())
}

/// Which other signals wait while a handler runs ([`swap_handler`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WhileHandling {
    /// None: another signal's handler may interrupt this one.
    BlockNone,
    /// Every signal that can be blocked: the handler runs to its end before any other handler
    /// runs on its thread (they run after it returns).
    BlockAll,
}

/// Install `handler` for `sig` (SA_SIGINFO | SA_RESTART) and return the action it replaced, so
/// the caller can chain to it and put it back ([`set_action`]).
pub fn swap_handler(sig: i32, handler: ValueHandler, blocking: WhileHandling) -> Result<libc::sigaction> {
    // SAFETY: a zeroed sigaction with a valid handler and a mask set by sigemptyset or
    // sigfillset is well formed; old is valid output storage.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        match blocking {
            WhileHandling::BlockNone => libc::sigemptyset(&mut sa.sa_mask),
            WhileHandling::BlockAll => libc::sigfillset(&mut sa.sa_mask),
        };
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, &sa, &mut old) != 0 {
            return Err(Error::last_os("sigaction"));
        }
        Ok(old)
    }
}

/// Set the action of `sig` (e.g. the one [`swap_handler`] returned).
pub fn set_action(sig: i32, action: &libc::sigaction) -> Result<()> {
    // SAFETY: action is a valid sigaction.
    if unsafe { libc::sigaction(sig, action, std::ptr::null_mut()) } != 0 {
        return Err(Error::last_os("sigaction"));
    }
    Ok(())
}

/// Hand a fault signal that is not ours to the action our handler replaced (`previous`, null
/// for "the default"): a function is called directly with the kernel's arguments; a default or
/// ignore disposition is reinstalled so that, once we return, the access repeats and meets it
/// as if we had never been installed. Both HPS and DLM handle SIGBUS; whichever is installed
/// second forwards to the first, so neither can unhook the other.
///
/// # Safety
/// Call only from a signal handler for `sig`, with the `info`/`ctx` it received; `previous`
/// must be null or point at a sigaction that stays valid while handlers can run.
pub unsafe fn forward_to_previous(
    previous: *const libc::sigaction,
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    ctx: *mut libc::c_void,
) {
    // SAFETY: sigaction(2) is async-signal-safe; the caller guarantees `previous` and the
    // handler arguments are valid.
    unsafe {
        if previous.is_null() {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(sig, &sa, std::ptr::null_mut());
            return;
        }
        let p = &*previous;
        if p.sa_sigaction == libc::SIG_DFL || p.sa_sigaction == libc::SIG_IGN {
            libc::sigaction(sig, p, std::ptr::null_mut());
        } else if p.sa_flags & libc::SA_SIGINFO != 0 {
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                std::mem::transmute(p.sa_sigaction);
            f(sig, info, ctx);
        } else {
            let f: extern "C" fn(libc::c_int) = std::mem::transmute(p.sa_sigaction);
            f(sig);
        }
    }
}

/// Uninstall the handler `ours` of `sig`, putting back `previous` (null: the default) — but only
/// while `ours` is still the installed action. When another handler was installed over ours
/// it forwards to ours, which (now inactive) forwards to `previous`: replacing it here would
/// unhook the later handler. Returns whether the action was changed.
///
/// # Safety
/// `previous` must be null or point at a valid sigaction.
pub unsafe fn restore_if_current(sig: libc::c_int, ours: usize, previous: *const libc::sigaction) -> Result<bool> {
    // SAFETY: output storage for the current action; a null new action only reads it.
    let mut current: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::sigaction(sig, std::ptr::null(), &mut current) } != 0 {
        return Err(Error::last_os("sigaction"));
    }
    if current.sa_sigaction != ours {
        return Ok(false);
    }
    if previous.is_null() {
        reset_handler(sig)?;
    } else {
        // SAFETY: the caller guarantees previous is valid.
        set_action(sig, unsafe { &*previous })?;
    }
    Ok(true)
}

/// Restore the default disposition of `sig`, discarding its instances still queued. The
/// default action of a real-time signal ends the process, so an instance sent while the
/// handler was installed but not yet delivered (its thread not scheduled yet) would otherwise
/// kill the process once the default is back. Setting SIG_IGN first discards them (signal(7):
/// a pending signal whose disposition becomes "ignore" is discarded; Linux flushes it from
/// every thread's queue); the caller must make sure no new instance is sent after this.
pub fn reset_handler(sig: i32) -> Result<()> {
    for disposition in [libc::SIG_IGN, libc::SIG_DFL] {
        // SAFETY: SIG_IGN / SIG_DFL with an empty mask is well formed.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = disposition;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
                return Err(Error::last_os("sigaction"));
            }
        }
    }
    Ok(())
}

/// CPU time consumed by the calling thread (CLOCK_THREAD_CPUTIME_ID).
pub fn thread_cpu_time() -> Duration {
    crate::cpu::CpuClock::THREAD.now()
}

/// Whether process `pid` exists (kill(pid, 0); EPERM still means it exists).
pub fn process_alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 performs only the existence and permission check.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_ended_sees_the_end_without_reaping() {
        let mut child = std::process::Command::new("sleep").arg("0.2").spawn().unwrap();
        assert!(!child_ended(child.id(), false).unwrap(), "sleep 0.2 is still running");
        assert!(child_ended(child.id(), true).unwrap());
        assert!(child_ended(child.id(), false).unwrap(), "still there to reap: not reaped");
        assert!(child.wait().unwrap().success());
        assert!(child_ended(child.id(), false).is_err(), "reaped: no such child (ECHILD)");
    }

    // Different bodies, so the optimiser cannot fold them into one address.
    static LAST: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
    extern "C" fn first(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
        LAST.store(1, std::sync::atomic::Ordering::Relaxed);
    }
    extern "C" fn second(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
        LAST.store(2, std::sync::atomic::Ordering::Relaxed);
    }

    fn current(sig: i32) -> usize {
        // SAFETY: read-only query into valid storage.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            libc::sigaction(sig, std::ptr::null(), &mut sa);
            sa.sa_sigaction
        }
    }

    #[test]
    fn an_earlier_handler_does_not_unhook_a_later_one() {
        // A signal nothing else in the test binary uses.
        let sig = rt_signal(7).unwrap();
        let original = swap_handler(sig, first, WhileHandling::BlockNone).unwrap();
        let first_action = swap_handler(sig, second, WhileHandling::BlockAll).unwrap();
        // `first` leaves while `second` (installed over it) is current: nothing changes.
        // SAFETY: original is a valid sigaction.
        assert!(!unsafe { restore_if_current(sig, first as *const () as usize, &original) }.unwrap());
        assert_eq!(current(sig), second as *const () as usize);
        // `second` leaves: `first`'s action comes back.
        // SAFETY: first_action is a valid sigaction.
        assert!(unsafe { restore_if_current(sig, second as *const () as usize, &first_action) }.unwrap());
        assert_eq!(current(sig), first as *const () as usize);
        set_action(sig, &original).unwrap();
        // Neither ran (the signal was never sent); reading LAST also keeps their stores alive.
        assert_eq!(LAST.load(std::sync::atomic::Ordering::Relaxed), 0);
    }

    // Where the handler of the inner signal ran: 1 inside the outer handler, 2 after it.
    static INNER_RAN: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
    static IN_OUTER: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    static INNER_SIG: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
    extern "C" fn outer(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
        use std::sync::atomic::Ordering::SeqCst;
        IN_OUTER.store(true, SeqCst);
        // SAFETY: raise is async-signal-safe; the inner signal has a handler.
        unsafe { libc::raise(INNER_SIG.load(SeqCst)) };
        IN_OUTER.store(false, SeqCst);
    }
    extern "C" fn inner(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
        use std::sync::atomic::Ordering::SeqCst;
        INNER_RAN.store(if IN_OUTER.load(SeqCst) { 1 } else { 2 }, SeqCst);
    }

    #[test]
    fn block_all_holds_other_signals_until_the_handler_returns() {
        use std::sync::atomic::Ordering::SeqCst;
        let (outer_sig, inner_sig) = (rt_signal(10).unwrap(), rt_signal(11).unwrap());
        INNER_SIG.store(inner_sig, SeqCst);
        let inner_before = swap_handler(inner_sig, inner, WhileHandling::BlockNone).unwrap();
        for (blocking, where_inner_ran) in [(WhileHandling::BlockNone, 1), (WhileHandling::BlockAll, 2)] {
            let outer_before = swap_handler(outer_sig, outer, blocking).unwrap();
            INNER_RAN.store(0, SeqCst);
            // SAFETY: the outer signal has a handler.
            unsafe { libc::raise(outer_sig) };
            assert_eq!(INNER_RAN.load(SeqCst), where_inner_ran, "{blocking:?}");
            set_action(outer_sig, &outer_before).unwrap();
        }
        set_action(inner_sig, &inner_before).unwrap();
    }

    #[test]
    fn queued_values_arrive_in_order_and_none_is_lost() {
        let sig = rt_signal(3).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            set_thread_blocked(sig, true).unwrap();
            tx.send(gettid()).unwrap();
            let mut got = Vec::new();
            while let Some(v) = wait_value(sig, Some(Duration::from_secs(5))).unwrap() {
                got.push(v);
                if got.len() == 200 {
                    break;
                }
            }
            got
        });
        let tid = rx.recv().unwrap();
        for v in 0..200u64 {
            queue_to_thread(getpid(), tid, sig, v * 7).unwrap();
        }
        let got = waiter.join().unwrap();
        assert_eq!(got, (0..200u64).map(|v| v * 7).collect::<Vec<_>>());
    }

    fn pending_here(sig: i32) -> bool {
        // SAFETY: sigpending fills a valid sigset_t.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigpending(&mut set);
            libc::sigismember(&set, sig) == 1
        }
    }

    #[test]
    fn reset_discards_an_instance_queued_for_the_handler() {
        let sig = rt_signal(12).unwrap();
        let before = swap_handler(sig, first, WhileHandling::BlockNone).unwrap();
        // Queued while the handler is installed, not yet delivered (blocked in this thread),
        // as when the thread it is queued to has not run yet.
        set_thread_blocked(sig, true).unwrap();
        queue_to_thread(getpid(), gettid(), sig, 1).unwrap();
        assert!(pending_here(sig));
        reset_handler(sig).unwrap();
        // Still pending, unblocking would end the test binary (the default action): check
        // first, and only unblock when it is gone.
        assert!(!pending_here(sig), "reset_handler left a queued instance that the default action would deliver");
        set_thread_blocked(sig, false).unwrap();
        set_action(sig, &before).unwrap();
    }

    #[test]
    fn wait_times_out_with_none() {
        let sig = rt_signal(4).unwrap();
        set_thread_blocked(sig, true).unwrap();
        assert_eq!(wait_value(sig, Some(Duration::from_millis(10))).unwrap(), None);
    }

    #[test]
    fn liveness_of_self_and_of_a_reaped_child() {
        assert!(process_alive(getpid()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        child.wait().unwrap();
        assert!(!process_alive(pid));
        assert!(rt_signal(1000).is_err());
    }
}
