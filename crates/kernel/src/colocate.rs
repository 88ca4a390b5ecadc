//! A userfaultfd handler thread kept on the program's CPU while the program has one thread:
//! DLM's fault handler (crates/dlm, runtime/fault.rs) and HPS's tracking handler
//! (crates/track, minor.rs).
//!
//! Under a handler thread a fault crosses threads twice: the faulting thread wakes the
//! handler, the handler wakes it back once the unit is in. On different CPUs each wake-up is
//! an interrupt to the other CPU — on a VM, often a halted vCPU the host must wake — and every
//! page the handler moves or drops sends its TLB flush there too. The scheduler does not put
//! the two together: it wakes each on an idle CPU, which is the other one.
//!
//! Measured (xz -3 on 2.7 MB under `pagewise run`, 4 KiB units, 18 of its 21 MiB local,
//! 122,000 faults, servers elsewhere): program and handler on different CPUs 54–58 s, on one
//! CPU 13.7 s; in the slow runs the kernel spent 10% of all CPU time sending flush interrupts
//! from UFFDIO_MOVE and more in cross-CPU wake-ups.
//!
//! So while the program has one thread, the handler pins that thread and itself to the CPU the
//! handler is on (in the program's mask), and gives both their masks back as soon as the
//! program has more threads — a program with threads has its own use for the CPUs — or the
//! one thread is another. Threads started while pinned inherit the one-CPU mask and get the
//! program's mask back at the same time. A child made by fork(2) gets it back at once
//! (`restore_in_child`); a program exec'd by a pinned process gets it back when its own
//! runtime starts (`PROGRAM_CPUS_ENV`, which `pagewise run` and `pagewise hps run` set). The
//! decision is `step`, pure; the rest carries it out.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::cpu;
use crate::procfs::ThreadCount;

/// The CPUs the program was started with (a cpulist), set by `pagewise run` and `pagewise hps
/// run`: a process that inherited a one-CPU mask from a pinned parent gets these back when
/// its runtime starts.
pub const PROGRAM_CPUS_ENV: &str = "PAGEWISE_PROGRAM_CPUS";

/// What the handler does about co-location, given what it knows now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Pin the faulting thread and the handler to one CPU.
    Pin,
    /// Give the pinned thread (and any thread started since) and the handler their masks back.
    Release,
    Stay,
}

/// The rule. `program_threads`: the process's threads other than the runtime's; `pinned`:
/// the thread pinned now, if any; `faulting`: the thread whose fault is being served (None
/// when the handler checks without a fault).
pub fn step(program_threads: u32, pinned: Option<u32>, faulting: Option<u32>) -> Step {
    match (pinned, faulting) {
        (Some(_), _) if program_threads != 1 => Step::Release,
        (Some(p), Some(f)) if p != f => Step::Release,
        (None, Some(_)) if program_threads == 1 => Step::Pin,
        _ => Step::Stay,
    }
}

/// How long a fault may act on the thread count read for an earlier one. Reading it is a
/// system call (fstat of /proc/self/task), which strace showed on every fault of a program
/// paging at 4 KiB; a thread the program starts meanwhile shares its CPU this much longer at
/// most. A pin is always decided on a fresh count.
const RECOUNT_AFTER: Duration = Duration::from_millis(1);

/// The decision a count read `age` ago (`counted`: its age and value) still settles, or None
/// when the count must be read again: without a fault (the periodic check), once it is
/// `RECOUNT_AFTER` old, and before any pin.
pub fn step_on_recent_count(
    counted: Option<(Duration, u32)>,
    pinned: Option<u32>,
    faulting: Option<u32>,
) -> Option<Step> {
    let (age, threads) = counted?;
    if faulting.is_none() || age >= RECOUNT_AFTER {
        return None;
    }
    Some(step(threads, pinned, faulting)).filter(|s| *s != Step::Pin)
}

/// The mask a fork child gets back (`restore_in_child`), as sched_setaffinity's bitmap.
static CHILD_MASK: [AtomicU64; 16] = [const { AtomicU64::new(0) }; 16];
static CHILD_RESTORE: AtomicBool = AtomicBool::new(false);

/// Co-location as the handler thread carries it out (only that thread uses it).
pub struct Colocation {
    threads: ThreadCount,
    /// Threads of the runtime in this process (the handler and its helpers): the rest are the
    /// program's.
    own_threads: u32,
    pinned: Option<Pinned>,
    /// The program's threads when last read, and when.
    counted: Option<(Instant, u32)>,
    /// Set when pinning failed (a sandbox refusing sched_setaffinity): tried no more.
    given_up: bool,
}

struct Pinned {
    tid: u32,
    cpu: usize,
    program_mask: BTreeSet<usize>,
    handler_mask: BTreeSet<usize>,
}

impl Colocation {
    /// For a runtime of `own_threads` threads, the handler among them; None where the
    /// process's thread count cannot be read.
    pub fn new(own_threads: u32) -> Option<Colocation> {
        static AT_FORK: std::sync::Once = std::sync::Once::new();
        // SAFETY: restore_in_child is an extern "C" fn doing one async-signal-safe system call.
        AT_FORK.call_once(|| unsafe {
            libc::pthread_atfork(None, None, Some(restore_in_child));
        });
        Some(Colocation {
            threads: ThreadCount::open().ok()?,
            own_threads,
            pinned: None,
            counted: None,
            given_up: false,
        })
    }

    pub fn is_pinned(&self) -> bool {
        self.pinned.is_some()
    }

    /// The CPU the handler and the program's thread share while pinned.
    pub fn pinned_cpu(&self) -> Option<usize> {
        self.pinned.as_ref().map(|p| p.cpu)
    }

    /// Act on a fault of thread `faulting` (None: a check without a fault). Returns true when
    /// it pinned.
    pub fn check(&mut self, faulting: Option<u32>) -> bool {
        if self.given_up {
            return false;
        }
        let pinned = self.pinned.as_ref().map(|p| p.tid);
        let counted = self.counted.map(|(at, n)| (at.elapsed(), n));
        let decision = match step_on_recent_count(counted, pinned, faulting) {
            Some(s) => s,
            None => {
                let Ok(total) = self.threads.get() else { return false };
                let program = total.saturating_sub(self.own_threads);
                self.counted = Some((Instant::now(), program));
                step(program, pinned, faulting)
            }
        };
        match decision {
            Step::Pin => {
                let tid = faulting.expect("a pin follows a fault");
                match pin(tid) {
                    Ok(p) => {
                        self.pinned = Some(p);
                        true
                    }
                    Err(_) => {
                        self.given_up = true;
                        false
                    }
                }
            }
            Step::Release => {
                self.release();
                false
            }
            Step::Stay => false,
        }
    }

    /// Give every mask back (also when the runtime stops).
    pub fn release(&mut self) {
        let Some(p) = self.pinned.take() else { return };
        CHILD_RESTORE.store(false, Ordering::Release);
        let one = BTreeSet::from([p.cpu]);
        let me = gettid();
        // The pinned thread, and threads it started while pinned (they inherited its mask);
        // a thread that has exited meanwhile is simply not there.
        for tid in task_ids() {
            if tid == me {
                continue;
            }
            if tid == p.tid || cpu::affinity(tid as i32).is_ok_and(|m| m == one) {
                let _ = cpu::set_affinity_of(tid as i32, &p.program_mask);
            }
        }
        let _ = cpu::set_affinity(&p.handler_mask);
    }
}

/// Pin thread `tid` and the calling (handler) thread to the CPU the handler is on, or the
/// program's first CPU when the handler's is not in the program's mask.
fn pin(tid: u32) -> crate::Result<Pinned> {
    let program_mask = cpu::affinity(tid as i32)?;
    let handler_mask = cpu::affinity(0)?;
    let here = cpu::current_cpu();
    let cpu = if program_mask.contains(&here) {
        here
    } else {
        *program_mask.iter().next().ok_or_else(|| crate::Error::Invalid("empty CPU mask".into()))?
    };
    for (i, word) in CHILD_MASK.iter().enumerate() {
        let bits = (0..64).filter(|b| program_mask.contains(&(i * 64 + b))).fold(0u64, |w, b| w | 1 << b);
        word.store(bits, Ordering::Relaxed);
    }
    CHILD_RESTORE.store(true, Ordering::Release);
    cpu::pin_to(cpu)?;
    if let Err(e) = cpu::set_affinity_of(tid as i32, &BTreeSet::from([cpu])) {
        CHILD_RESTORE.store(false, Ordering::Release);
        let _ = cpu::set_affinity(&handler_mask);
        return Err(e);
    }
    Ok(Pinned { tid, cpu, program_mask, handler_mask })
}

/// pthread_atfork child handler: a child made while the program was pinned gets the
/// program's mask back (its one thread is the forking one, which was pinned).
extern "C" fn restore_in_child() {
    if !CHILD_RESTORE.load(Ordering::Acquire) {
        return;
    }
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for (i, word) in CHILD_MASK.iter().enumerate() {
        let w = word.load(Ordering::Relaxed);
        for b in 0..64 {
            if w & (1 << b) != 0 {
                // SAFETY: i * 64 + b < 1024 = CPU_SETSIZE.
                unsafe { libc::CPU_SET(i * 64 + b, &mut set) };
            }
        }
    }
    // SAFETY: set is a valid cpu_set_t of the size passed; sched_setaffinity is
    // async-signal-safe (one system call).
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
}

/// The environment entry a wrapper gives the program it starts (`PROGRAM_CPUS_ENV` = this
/// process's CPUs), for [`widen_inherited_mask`] in whatever the program execs while pinned.
pub fn program_cpus_env() -> Option<(&'static str, String)> {
    cpu::affinity(0).ok().map(|cpus| (PROGRAM_CPUS_ENV, cpu::format_cpulist(&cpus)))
}

/// A process started by a pinned program (fork and exec) inherits the one-CPU mask: give it
/// the program's CPUs back, from `PROGRAM_CPUS_ENV`. Only a mask of exactly one CPU that is
/// not the whole program mask is widened: a mask the user chose stays.
pub fn widen_inherited_mask() {
    let Some(cpus) = std::env::var(PROGRAM_CPUS_ENV).ok().and_then(|v| cpu::parse_cpulist(&v).ok()) else {
        return;
    };
    if let Ok(now) = cpu::affinity(0) {
        if now.len() == 1 && now != cpus && now.is_subset(&cpus) {
            let _ = cpu::set_affinity(&cpus);
        }
    }
}

fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

/// The ids of this process's threads (/proc/self/task).
fn task_ids() -> Vec<u32> {
    std::fs::read_dir("/proc/self/task")
        .map(|d| d.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{step, step_on_recent_count, Step, RECOUNT_AFTER};

    #[test]
    fn one_program_thread_faulting_is_pinned() {
        assert_eq!(step(1, None, Some(7)), Step::Pin);
        assert_eq!(step(1, Some(7), Some(7)), Step::Stay);
        assert_eq!(step(1, Some(7), None), Step::Stay);
    }

    #[test]
    fn more_threads_release_and_never_pin() {
        assert_eq!(step(2, Some(7), Some(7)), Step::Release);
        assert_eq!(step(2, Some(7), None), Step::Release);
        assert_eq!(step(3, None, Some(7)), Step::Stay);
        assert_eq!(step(0, Some(7), None), Step::Release);
    }

    #[test]
    fn another_thread_faulting_releases() {
        assert_eq!(step(1, Some(7), Some(8)), Step::Release);
    }

    #[test]
    fn a_recent_count_settles_a_fault_but_never_a_pin() {
        let fresh = Some((Duration::from_micros(100), 1));
        assert_eq!(step_on_recent_count(fresh, Some(7), Some(7)), Some(Step::Stay));
        assert_eq!(step_on_recent_count(fresh, Some(7), Some(8)), Some(Step::Release));
        assert_eq!(step_on_recent_count(Some((Duration::from_micros(100), 3)), None, Some(7)), Some(Step::Stay));
        // Would pin: read again first.
        assert_eq!(step_on_recent_count(fresh, None, Some(7)), None);
        // Too old, never read, or the periodic check without a fault: read again.
        assert_eq!(step_on_recent_count(Some((RECOUNT_AFTER, 1)), Some(7), Some(7)), None);
        assert_eq!(step_on_recent_count(None, Some(7), Some(7)), None);
        assert_eq!(step_on_recent_count(fresh, Some(7), None), None);
    }

    #[test]
    fn no_fault_never_pins() {
        assert_eq!(step(1, None, None), Step::Stay);
    }
}
