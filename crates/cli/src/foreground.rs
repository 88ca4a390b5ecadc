//! The program a wrapper (`pagewise run`, `pagewise hps run`, `pagewise mpi`) runs is its
//! foreground job: the wrapper outlives it, so that it can clean up after it (the shim's
//! private directory, the servers it spawned, the published counts) whichever way it ends.
//!
//! As system(3) does while it waits: SIGINT and SIGQUIT are ignored by the wrapper (a
//! terminal sends them to the whole foreground process group, the program included: the
//! program decides), and SIGTERM and SIGHUP are passed on to the program (someone ended the
//! wrapper: they meant the program). Either way the wrapper goes on waiting, then cleans up;
//! its cleanup after the program ended (seconds at most) is not cut short by them either.

use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus};

use anyhow::Context as _;
use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
use signal_hook::iterator::Signals;

/// Whether the wrapper passes signal `sig` on to its program (else it ignores it).
fn passed_on(sig: i32) -> bool {
    matches!(sig, SIGTERM | SIGHUP)
}

/// The wrapper's signal handling while its program runs (module doc), from before the program
/// starts ([`spawn`]: a signal sent the moment the program exists finds it in place) until
/// dropped. The handlers are the wrapper's only: the program runs with the default
/// dispositions (execve resets handled signals).
pub(crate) struct Foreground {
    handle: signal_hook::iterator::Handle,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Foreground {
    /// Ignore SIGINT and SIGQUIT and pass SIGTERM and SIGHUP on to process `pid` until dropped.
    /// Signals that came while `signals` waited for the program are handled first.
    fn pass_on(mut signals: Signals, pid: u32) -> anyhow::Result<Self> {
        let handle = signals.handle();
        let thread = std::thread::Builder::new()
            .name("pw-foreground".into())
            .spawn(move || {
                for sig in signals.forever() {
                    if passed_on(sig) {
                        // SAFETY: kill(2) takes no pointers. The program is reaped only
                        // after this thread ended (`wait`, `Foreground::drop`), so `pid` is
                        // still the program's.
                        unsafe { libc::kill(pid as libc::pid_t, sig) };
                    }
                }
            })
            .context("starting the wrapper's signal thread")?;
        Ok(Foreground { handle, thread: Some(thread) })
    }
}

impl Drop for Foreground {
    fn drop(&mut self) {
        self.handle.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Start `cmd`, the wrapper's program (`name` in errors), as its foreground job (module doc).
/// The handlers are in place before the program starts, so a SIGINT that reaches the wrapper
/// as soon as the program exists is ignored too, and a SIGTERM is passed on.
pub(crate) fn spawn(cmd: &mut Command, name: &str) -> anyhow::Result<(Child, Foreground)> {
    let signals =
        Signals::new([SIGINT, SIGQUIT, SIGTERM, SIGHUP]).context("installing the wrapper's signal handlers")?;
    let child = cmd.spawn().with_context(|| format!("starting {name}"))?;
    let foreground = Foreground::pass_on(signals, child.id())?;
    Ok((child, foreground))
}

/// Wait for `child`, started by [`spawn`], then end the wrapper's signal handling.
///
/// The machine pays for the wrapper for as long as the program runs, so it first gives back
/// what starting the program left it holding: the file pages it mapped (4.9 of its 5.3 MiB,
/// `pagewise_kernel::shrink`) and the free memory of its heap. Safe while its other threads
/// (the signal thread, readers of the servers' output) run: none of them unmaps, writes or
/// re-protects a file mapping, the only kind given back.
pub(crate) fn wait(mut child: Child, foreground: Foreground, name: &str) -> anyhow::Result<ExitStatus> {
    // Best effort: a wrapper that could not shrink still waits and cleans up.
    let _ = pagewise_kernel::shrink::unmap_unchanged_file_pages();
    pagewise_kernel::shrink::trim_heap();
    pagewise_kernel::signal::child_ended(child.id(), true).with_context(|| format!("waiting for {name}"))?;
    drop(foreground);
    child.wait().with_context(|| format!("reaping {name}"))
}

/// The shell's exit code for a program that ended with `status`: its own code, or 128+N when
/// signal N killed it (said on stderr, `who` first).
pub(crate) fn exit_code(status: ExitStatus, who: &str, name: &str) -> std::process::ExitCode {
    match (status.code(), status.signal()) {
        (Some(c), _) => std::process::ExitCode::from(c as u8),
        (None, Some(sig)) => {
            eprintln!("{who}: {name} was killed by signal {sig}");
            std::process::ExitCode::from(128u8.wrapping_add(sig as u8))
        }
        _ => std::process::ExitCode::FAILURE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_term_and_hup_are_passed_on() {
        assert!(passed_on(SIGTERM) && passed_on(SIGHUP));
        assert!(!passed_on(SIGINT) && !passed_on(SIGQUIT));
    }
}
