//! Faults served on the faulting thread: the SIGBUS handler (userfaultfd with
//! UFFD_FEATURE_SIGBUS) and the SIGSEGV handler (the no-userfaultfd fallback).
//!
//! The handler locks the runtime's state and serves the fault like the handler thread would;
//! the instruction is retried when it returns. Signals on addresses outside DLM areas go to
//! the handler that was installed before ours (HPS's tracker, Rust's stack-overflow reporter,
//! or the default action): called directly when it is a function, so a DLM installed after
//! HPS never unhooks HPS's handler.
//!
//! What runs in the handler: a mutex lock (never held by the faulting thread itself: the
//! runtime never touches area memory while holding it except resident pages, which cannot
//! fault), socket send/recv into preallocated buffers, ioctl/mprotect/madvise. No allocation
//! on the fault path (buffers, the clock and the pending queues are sized at init).

use std::io;
use std::sync::atomic::{AtomicPtr, Ordering};

use pagewise_kernel::signal::WhileHandling;

use crate::runtime::{Served, ACTIVE};

/// A handler we installed, with the one it replaced.
pub struct Installed {
    sig: libc::c_int,
}

static OLD_BUS: AtomicPtr<libc::sigaction> = AtomicPtr::new(std::ptr::null_mut());
static OLD_SEGV: AtomicPtr<libc::sigaction> = AtomicPtr::new(std::ptr::null_mut());

fn old_slot(sig: libc::c_int) -> &'static AtomicPtr<libc::sigaction> {
    if sig == libc::SIGBUS {
        &OLD_BUS
    } else {
        &OLD_SEGV
    }
}

/// Install our handler for `sig` (SIGBUS or SIGSEGV).
///
/// The action it replaces is kept in storage that is never freed: a handler running on
/// another thread may be reading the previous saved action while a later `install` replaces
/// it, so an old one is leaked (one small struct per install; a process installs a handful).
pub fn install(sig: libc::c_int) -> io::Result<Installed> {
    // All signals wait while a fault is served: a handler of the program's that touched DLM
    // memory would otherwise fault again with the runtime's lock held by its own thread, and
    // would see a unit whose reply is being received into its place (`ReplyInto::View`).
    let old = pagewise_kernel::signal::swap_handler(sig, handler, WhileHandling::BlockAll)
        .map_err(|e| io::Error::from_raw_os_error(e.errno().unwrap_or(libc::EINVAL)))?;
    old_slot(sig).store(Box::into_raw(Box::new(old)), Ordering::Release);
    Ok(Installed { sig })
}

/// Put back the handler `install` replaced, unless another handler (HPS's) was installed over
/// ours meanwhile: that one forwards to ours, which forwards on.
pub fn restore(i: Installed) {
    // SAFETY: the slot holds null or the valid sigaction saved by install.
    let _ = unsafe {
        pagewise_kernel::signal::restore_if_current(
            i.sig,
            handler as *const () as usize,
            old_slot(i.sig).load(Ordering::Acquire),
        )
    };
}

/// Whether the faulting access was a write, from the x86 page-fault error code.
fn is_write(ctx: *mut libc::c_void) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if ctx.is_null() {
            return false;
        }
        // SAFETY: the kernel passes a ucontext_t to SA_SIGINFO handlers.
        let uc = unsafe { &*(ctx as *const libc::ucontext_t) };
        uc.uc_mcontext.gregs[libc::REG_ERR as usize] & 2 != 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ctx;
        false
    }
}

extern "C" fn handler(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let errno = io::Error::last_os_error().raw_os_error().unwrap_or(0);
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    let inner = ACTIVE.load(Ordering::Acquire);
    let served = if inner.is_null() {
        Served::NotOurs
    } else {
        // SAFETY: ACTIVE points at the runtime's Inner while the handler is installed (cleared
        // before the Arc can be dropped).
        let inner = unsafe { &*inner };
        let mut st = inner.lock();
        inner.serve(&mut st, addr, is_write(ctx))
    };
    if let Served::NotOurs = served {
        // SAFETY: the slot holds the sigaction saved by `install` (never freed); we are in the handler for `sig` with the kernel's arguments.
        unsafe { pagewise_kernel::signal::forward_to_previous(old_slot(sig).load(Ordering::Acquire), sig, info, ctx) };
    }
    // SAFETY: restoring errno of the interrupted code.
    unsafe { *libc::__errno_location() = errno };
}
