//! Faults served on the faulting thread: the SIGBUS handler (userfaultfd with
//! UFFD_FEATURE_SIGBUS) and the SIGSEGV handler (the no-userfaultfd fallback).
//!
//! The handler first looks the address up in the published ranges of the live areas
//! ([`publish`], [`withdraw`]: a fixed array of atomics the runtime updates when it makes or
//! frees an area), without a lock. Signals on addresses outside every area go straight to the
//! handler that was installed before ours (HPS's tracker, Rust's stack-overflow reporter, a
//! JIT's or garbage collector's handler, or the default action) without touching the runtime's
//! lock (issue 23: taking it first made every foreign fault wait for whatever the runtime was
//! doing, and deadlock when the faulting thread held it). The previous handler is called
//! directly when it is a function, so a DLM installed after HPS never unhooks HPS's handler.
//! For an address inside an area, the handler locks the runtime's state and serves the fault
//! like the handler thread would; the instruction is retried when it returns.
//!
//! What a program's own signal handlers may touch (also in include/pagewise/dlm.h): anything
//! but DLM memory and the runtime's API. A handler can interrupt a thread inside `Dlm::alloc`,
//! `free` or another call that holds the runtime's lock; a fault on a DLM page from there would
//! wait for that lock forever. While a fault is served all signals are blocked on its thread,
//! so no handler runs in the middle of one.
//!
//! What runs in the handler: a mutex lock (never held by the faulting thread itself: the
//! runtime never touches area memory while holding it except resident pages, which cannot
//! fault), socket send/recv into preallocated buffers, ioctl/mprotect/madvise. No allocation
//! on the fault path (buffers, the clock and the pending queues are sized at init).

use std::io;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use pagewise_kernel::signal::WhileHandling;

use crate::runtime::{Served, ACTIVE};

/// Areas whose ranges can be published at once; beyond that the handler takes the lock for
/// every address while the overflow lasts (correct, only slower).
const MAX_PUBLISHED: usize = 1024;

/// One published range `[start, end)`; `end == 0`: free. Written only when an area is made
/// (before any access to it can fault) and after it is freed, so a reader never misses a live
/// area; a torn read can only make it take the lock for an address that is not ours, and the
/// runtime's own lookup then says so.
struct Range {
    start: AtomicUsize,
    end: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE_RANGE: Range = Range { start: AtomicUsize::new(0), end: AtomicUsize::new(0) };
static RANGES: [Range; MAX_PUBLISHED] = [FREE_RANGE; MAX_PUBLISHED];
/// Slots below this index may be in use (readers scan only these).
static USED: AtomicUsize = AtomicUsize::new(0);
/// Live areas that found no free slot.
static OVERFLOW: AtomicUsize = AtomicUsize::new(0);

/// Publish the range of a new area `[start, start + len)` for the handler's lock-free check.
/// Called by the runtime before the area's address is handed out.
pub(crate) fn publish(start: usize, len: usize) {
    for (i, r) in RANGES.iter().enumerate() {
        // Claim a free slot: its start goes from 0 to ours; its end last, so readers see the
        // range only once it is whole.
        if r.end.load(Ordering::Acquire) == 0
            && r.start.compare_exchange(0, start, Ordering::AcqRel, Ordering::Acquire).is_ok()
        {
            USED.fetch_max(i + 1, Ordering::AcqRel);
            r.end.store(start + len, Ordering::Release);
            return;
        }
    }
    OVERFLOW.fetch_add(1, Ordering::AcqRel);
}

/// Withdraw the range of the area at `start` (freed).
pub(crate) fn withdraw(start: usize) {
    let used = USED.load(Ordering::Acquire);
    for r in &RANGES[..used] {
        if r.start.load(Ordering::Acquire) == start && r.end.load(Ordering::Acquire) != 0 {
            r.end.store(0, Ordering::Release);
            r.start.store(0, Ordering::Release);
            return;
        }
    }
    let _ = OVERFLOW.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
}

/// Whether `addr` may lie in a DLM area: true for every address of a live area (and, while
/// areas overflow the table, for every address). Lock-free and async-signal-safe.
fn maybe_ours(addr: usize) -> bool {
    if OVERFLOW.load(Ordering::Acquire) > 0 {
        return true;
    }
    let used = USED.load(Ordering::Acquire);
    RANGES[..used].iter().any(|r| {
        let start = r.start.load(Ordering::Acquire);
        let end = r.end.load(Ordering::Acquire);
        start <= addr && addr < end
    })
}

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
    let inner = if maybe_ours(addr) { ACTIVE.load(Ordering::Acquire) } else { std::ptr::null_mut() };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_ranges_are_found_and_withdrawn_ones_are_not() {
        // Addresses no real area has (the table is shared with any runtime of this process).
        let (a, b) = (0x7000_dead_0000usize, 0x7000_beef_0000usize);
        assert!(!maybe_ours(a) && !maybe_ours(b));
        publish(a, 0x10000);
        publish(b, 0x2000);
        assert!(maybe_ours(a) && maybe_ours(a + 0xffff) && !maybe_ours(a + 0x10000) && !maybe_ours(a - 1));
        assert!(maybe_ours(b + 0x1fff));
        withdraw(a);
        assert!(!maybe_ours(a) && maybe_ours(b));
        withdraw(b);
        assert!(!maybe_ours(b));
    }
}
