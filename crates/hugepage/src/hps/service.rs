//! How the application hears about active pages by signal: the handler-mode service thread,
//! fed by the signal handler through a pipe, and the wait-mode call that blocks for one.

use std::cell::Cell;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use pagewise_kernel::{fd, signal};

use super::period::process;
use super::{Hps, Notify};
use crate::{Error, Result};

thread_local! {
    static BLOCKED: Cell<bool> = const { Cell::new(false) };
}

/// Write end of the handler-mode pipe (the signal handler may only do async-signal-safe work).
static HANDLER_PIPE: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let value = unsafe { signal::siginfo_value(&*info) };
    let fd = HANDLER_PIPE.load(Ordering::Acquire);
    if fd >= 0 {
        // Async-signal-safe; 8 bytes to a pipe are written atomically (PIPE_BUF), so the
        // service thread never reads a torn value.
        let _ = fd::write_signal_safe(fd, &value.to_ne_bytes());
    }
}

impl Hps {
    pub(super) fn start_service(&self) -> Result<()> {
        // Out of the program's way: the signal handler writes to the pipe by number, and a
        // program's dup2 onto that number would have it write into the program's file.
        let (read_end, write_end) = fd::pipe()?;
        let (read_end, write_end) = (fd::out_of_the_way(read_end), fd::out_of_the_way(write_end));
        HANDLER_PIPE.store(write_end.as_raw_fd(), Ordering::Release);
        signal::install_handler(self.shared.sig, on_signal)?;
        let s = self.shared.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        // Signals blocked but its own notification (unblocked first thing below).
        let handle =
            signal::spawn_blocking_signals(std::thread::Builder::new().name("pw-hps-service".into()), move || {
                let _ = signal::set_thread_blocked(s.sig, false);
                let _ = tx.send(signal::gettid());
                let mut buf = [0u8; 8];
                loop {
                    match fd::read(&read_end, &mut buf) {
                        Ok(8) => {
                            if u64::from_ne_bytes(buf) == u64::MAX {
                                break;
                            }
                            s.received.fetch_add(1, Ordering::Relaxed);
                            let _ = process(&s);
                        }
                        // End of file (the write end closed) or a failed read: stop serving.
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
                // Dropping read_end closes it.
            })
            .map_err(|e| Error::Io { path: "thread spawn".into(), source: e })?;
        let tid = rx.recv().map_err(|_| Error::Invalid("service thread died".into()))?;
        self.shared.target_tid.store(tid, Ordering::Release);
        *self.service.lock().expect("service lock") = Some((handle, write_end));
        Ok(())
    }

    /// Stop the service thread, if there is one (handler mode).
    pub(super) fn stop_service(&self) {
        if let Some((h, write_end)) = self.service.lock().expect("service lock").take() {
            HANDLER_PIPE.store(-1, Ordering::Release);
            let _ = signal::reset_handler(self.shared.sig);
            let _ = fd::write(&write_end, &u64::MAX.to_ne_bytes());
            drop(write_end);
            let _ = h.join();
        }
    }

    /// Block this thread until a notification (up to `timeout`; `None`: forever), then run the
    /// decision step in it. Returns the number of active pages the notification carried, or
    /// `None` on timeout. The first call blocks the signal in the calling thread, so
    /// notifications arriving while the step runs stay queued for the next call.
    pub fn wait_signal(&self, timeout: Option<Duration>) -> Result<Option<u64>> {
        if self.shared.cfg.lock().expect("cfg lock").notify != Notify::Wait {
            return Err(Error::Invalid("wait_signal needs Notify::Wait (HPS_NOTIFY_WAIT)".into()));
        }
        let sig = self.shared.sig;
        if !BLOCKED.with(|b| b.get()) {
            signal::set_thread_blocked(sig, true)?;
            BLOCKED.with(|b| b.set(true));
        }
        self.shared.target_tid.store(signal::gettid(), Ordering::Release);
        match signal::wait_value(sig, timeout)? {
            Some(n) => {
                self.shared.received.fetch_add(1, Ordering::Relaxed);
                process(&self.shared)?;
                Ok(Some(n))
            }
            None => Ok(None),
        }
    }
}
