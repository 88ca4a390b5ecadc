//! CPUs: the online list, affinity, and cpulist syntax (`0-3,8,10-11`).

use std::collections::BTreeSet;

use crate::error::{read_trimmed, Error, Result};

/// Parse a kernel cpulist (`0-3,8`). Empty text is the empty set.
pub fn parse_cpulist(text: &str) -> Result<BTreeSet<usize>> {
    let mut set = BTreeSet::new();
    for part in text.trim().split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || Error::Invalid(format!("bad cpulist element {part:?} in {text:?}"));
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) =
                    (a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?);
                if a > b || b - a > 1 << 16 {
                    return Err(bad());
                }
                set.extend(a..=b);
            }
            None => {
                set.insert(part.parse().map_err(|_| bad())?);
            }
        }
    }
    Ok(set)
}

/// Format a set as a compact cpulist.
pub fn format_cpulist(cpus: &BTreeSet<usize>) -> String {
    let mut parts = Vec::new();
    let mut iter = cpus.iter().copied().peekable();
    while let Some(start) = iter.next() {
        let mut end = start;
        while iter.peek() == Some(&(end + 1)) {
            end = iter.next().expect("peeked");
        }
        parts.push(if start == end { start.to_string() } else { format!("{start}-{end}") });
    }
    parts.join(",")
}

/// The online CPUs (/sys/devices/system/cpu/online).
pub fn online_cpus() -> Result<BTreeSet<usize>> {
    parse_cpulist(&read_trimmed("/sys/devices/system/cpu/online")?)
}

/// Pin the calling thread to `cpus`.
pub fn set_affinity(cpus: &BTreeSet<usize>) -> Result<()> {
    if cpus.is_empty() {
        return Err(Error::Invalid("empty CPU set".into()));
    }
    if let Some(c) = cpus.iter().find(|&&c| c >= libc::CPU_SETSIZE as usize) {
        return Err(Error::Invalid(format!("CPU {c} beyond CPU_SETSIZE")));
    }
    set_affinity_raw(0, cpus.iter().copied()).map_err(|source| Error::Syscall { call: "sched_setaffinity", source })
}

/// sched_setaffinity(pid, cpus): no allocation, so also usable between fork and exec. CPUs at
/// or beyond CPU_SETSIZE are left out.
fn set_affinity_raw(pid: i32, cpus: impl Iterator<Item = usize>) -> std::io::Result<()> {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for c in cpus.filter(|&c| c < libc::CPU_SETSIZE as usize) {
        // SAFETY: c < CPU_SETSIZE.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: set is a valid cpu_set_t of the size passed.
    if unsafe { libc::sched_setaffinity(pid, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Pin the calling process to one CPU, async-signal-safe (one syscall, no allocation): for
/// `Command::pre_exec`, so that a server and every thread it ever starts run on `cpu`.
/// Returns the raw OS error, as `pre_exec` wants.
pub fn pin_before_exec(cpu: usize) -> std::io::Result<()> {
    set_affinity_raw(0, std::iter::once(cpu))
}

/// Pin the calling thread to one CPU.
pub fn pin_to(cpu: usize) -> Result<()> {
    set_affinity(&BTreeSet::from([cpu]))
}

/// The calling thread's (or `pid`'s, when non-zero) allowed CPUs.
pub fn affinity(pid: i32) -> Result<BTreeSet<usize>> {
    // SAFETY: plain data.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: set is writable and sized as passed.
    if unsafe { libc::sched_getaffinity(pid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return Err(Error::last_os("sched_getaffinity"));
    }
    // SAFETY: reading bits of an initialised set.
    Ok((0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect())
}

/// Pin another task (thread or process) to `cpus`.
pub fn set_affinity_of(pid: i32, cpus: &BTreeSet<usize>) -> Result<()> {
    set_affinity_raw(pid, cpus.iter().copied()).map_err(|source| Error::Syscall { call: "sched_setaffinity", source })
}

extern "C" {
    // glibc's; the libc crate does not declare it for Linux.
    fn clock_getcpuclockid(pid: libc::pid_t, clock: *mut libc::clockid_t) -> libc::c_int;
}

/// CPU time process `pid` has used so far, all its threads together, ended ones too: its
/// per-process CPU clock. With steal accounting (CONFIG_PARAVIRT_TIME_ACCOUNTING) time the
/// hypervisor gave to other guests is not in it, so it measures work, not the host's load.
pub fn process_cpu_time(pid: i32) -> Result<std::time::Duration> {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: clock is a valid out-pointer. The error number is returned, not set in errno.
    let rc = unsafe { clock_getcpuclockid(pid, &mut clock) };
    if rc != 0 {
        return Err(Error::Syscall { call: "clock_getcpuclockid", source: std::io::Error::from_raw_os_error(rc) });
    }
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid out-pointer.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return Err(Error::last_os("clock_gettime"));
    }
    Ok(std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

/// A CPU-time clock that any thread may read: this process's (all its threads together) or one
/// thread's, taken by that thread and read later by others (a runtime's own thread, whose time
/// is then subtracted from the process's to leave the program's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuClock(libc::clockid_t);

impl CpuClock {
    /// The calling process's clock (CLOCK_PROCESS_CPUTIME_ID): exact, in nanoseconds, also
    /// with tick-based user/system accounting, which only splits the total by samples.
    pub const PROCESS: CpuClock = CpuClock(libc::CLOCK_PROCESS_CPUTIME_ID);
    /// The clock of whichever thread reads it (CLOCK_THREAD_CPUTIME_ID).
    pub const THREAD: CpuClock = CpuClock(libc::CLOCK_THREAD_CPUTIME_ID);

    /// The calling thread's clock, by id, so that other threads can read it too.
    pub fn this_thread() -> Result<CpuClock> {
        let mut clock: libc::clockid_t = 0;
        // SAFETY: pthread_self() is a live thread (the caller); clock is a valid out-pointer.
        // The error number is returned, not set in errno.
        let rc = unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut clock) };
        if rc != 0 {
            return Err(Error::Syscall {
                call: "pthread_getcpuclockid",
                source: std::io::Error::from_raw_os_error(rc),
            });
        }
        Ok(CpuClock(clock))
    }

    /// CPU time so far; zero once the clock's thread has ended (its clock is gone).
    pub fn now(&self) -> std::time::Duration {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: ts is a valid out-pointer.
        if unsafe { libc::clock_gettime(self.0, &mut ts) } != 0 {
            return std::time::Duration::ZERO;
        }
        std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    }
}

/// CPU time (user and system) of every child of this process that ended and was waited for,
/// and of their own waited-for descendants: getrusage(2) RUSAGE_CHILDREN. The difference across
/// one `Command::output()` is that command's CPU time, all its threads together.
pub fn waited_children_cpu_time() -> Result<std::time::Duration> {
    // SAFETY: rusage is plain data; all-zero is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: ru is a valid out-pointer.
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) } != 0 {
        return Err(Error::last_os("getrusage"));
    }
    let tv = |t: libc::timeval| std::time::Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    Ok(tv(ru.ru_utime) + tv(ru.ru_stime))
}

/// The pids of the kswapd kernel threads (`kswapdN`, one per node), from /proc/PID/comm.
pub fn kswapd_pids() -> Result<Vec<i32>> {
    let dir = std::fs::read_dir("/proc").map_err(|source| Error::Read { path: "/proc".into(), source })?;
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        if let Ok(comm) = read_trimmed(format!("/proc/{pid}/comm")) {
            if comm.strip_prefix("kswapd").is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit())) {
                out.push(pid);
            }
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// Run the calling thread under SCHED_FIFO at `priority` (1..=99), or back under SCHED_OTHER
/// with 0. A reclaim worker uses it so its wake-up preempts the work on its core at once.
pub fn set_fifo_priority(priority: i32) -> Result<()> {
    if !(0..=99).contains(&priority) {
        return Err(Error::Invalid(format!("SCHED_FIFO priority {priority} outside 0..=99")));
    }
    let policy = if priority == 0 { libc::SCHED_OTHER } else { libc::SCHED_FIFO };
    let param = libc::sched_param { sched_priority: priority };
    // SAFETY: a valid sched_param; pid 0 is the calling thread.
    if unsafe { libc::sched_setscheduler(0, policy, &param) } != 0 {
        return Err(Error::last_os("sched_setscheduler"));
    }
    Ok(())
}

/// Pin another task to `cpus` under `guard`, which gives it back its current affinity.
pub fn pin_task(guard: &crate::guard::SettingsGuard, pid: i32, cpus: &BTreeSet<usize>) -> Result<()> {
    let before = affinity(pid)?;
    guard.record_affinity(pid, &before);
    set_affinity_of(pid, cpus)
}

/// The CPU the calling thread runs on right now.
pub fn current_cpu() -> usize {
    // SAFETY: no preconditions.
    let c = unsafe { libc::sched_getcpu() };
    c.max(0) as usize
}

/// What the scheduler says of one thread (`/proc/PID/task/TID/schedstat`, needs
/// CONFIG_SCHED_INFO): time on a CPU, time runnable but waiting in a run queue, and the number
/// of times it was given a CPU. The wait is what a thread loses to others on its cores.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct SchedStat {
    pub on_cpu_ns: u64,
    pub run_queue_wait_ns: u64,
    pub timeslices: u64,
}

impl SchedStat {
    /// Parse the file's one line: `on_cpu_ns run_queue_wait_ns timeslices`.
    pub fn parse(text: &str) -> Result<Self> {
        let v: Vec<u64> = text
            .split_whitespace()
            .map(|f| f.parse().map_err(|_| Error::parse("schedstat", format!("not a number: {f:?}"))))
            .collect::<Result<_>>()?;
        match v[..] {
            [on_cpu_ns, run_queue_wait_ns, timeslices] => Ok(SchedStat { on_cpu_ns, run_queue_wait_ns, timeslices }),
            _ => Err(Error::parse("schedstat", format!("expected 3 fields, got {text:?}"))),
        }
    }

    /// The calling thread's (`/proc/thread-self/schedstat`).
    pub fn this_thread() -> Result<Self> {
        Self::parse(&read_trimmed("/proc/thread-self/schedstat")?)
    }

    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &SchedStat) -> SchedStat {
        SchedStat {
            on_cpu_ns: self.on_cpu_ns.saturating_sub(earlier.on_cpu_ns),
            run_queue_wait_ns: self.run_queue_wait_ns.saturating_sub(earlier.run_queue_wait_ns),
            timeslices: self.timeslices.saturating_sub(earlier.timeslices),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_child_that_spins_shows_its_cpu_time_and_a_missing_process_is_an_error() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 0.3; i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; sleep 5"])
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        // Sleeping, it has used next to nothing yet.
        assert!(process_cpu_time(pid).unwrap() < std::time::Duration::from_millis(20));
        let t = std::time::Instant::now();
        let mut used = process_cpu_time(pid).unwrap();
        while used < std::time::Duration::from_millis(20) && t.elapsed() < std::time::Duration::from_secs(30) {
            std::thread::sleep(std::time::Duration::from_millis(10));
            used = process_cpu_time(pid).unwrap();
        }
        let _ = child.kill();
        let _ = child.wait();
        assert!(used >= std::time::Duration::from_millis(20), "the spinning child used {used:?}");
        assert!(process_cpu_time(pid).is_err(), "a reaped child still has a CPU clock");
    }

    #[test]
    fn a_waited_childs_cpu_time_is_counted_once_it_ended() {
        let before = waited_children_cpu_time().unwrap();
        // The shell spins in its own process: at least some tens of milliseconds of CPU.
        let out = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"])
            .output()
            .unwrap();
        assert!(out.status.success());
        let used = waited_children_cpu_time().unwrap() - before;
        assert!(used >= std::time::Duration::from_millis(20), "the spinning child used {used:?}");
    }

    #[test]
    fn schedstat_parses_the_kernel_line_and_counts_this_threads_work() {
        // Captured on Linux 6.18 (Firecracker guest).
        let s = SchedStat::parse("1520873 20451 12\n").unwrap();
        assert_eq!((s.on_cpu_ns, s.run_queue_wait_ns, s.timeslices), (1_520_873, 20_451, 12));
        assert!(SchedStat::parse("1 2").is_err());
        assert!(SchedStat::parse("1 x 3").is_err());
        // Spin until the thread's own CPU clock says 20 ms (on a busy machine the wall time
        // is longer): schedstat counts at least that on a CPU, and on-CPU plus waiting never
        // exceeds the wall time.
        let thread_cpu = || {
            let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            // SAFETY: ts is a valid out-pointer.
            assert_eq!(unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) }, 0);
            ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
        };
        let (before, cpu0, t) = (SchedStat::this_thread().unwrap(), thread_cpu(), std::time::Instant::now());
        while thread_cpu() - cpu0 < 20_000_000 {
            std::hint::black_box(0u64);
        }
        let spent = SchedStat::this_thread().unwrap().since(&before);
        let wall = t.elapsed().as_nanos() as u64;
        assert!(spent.on_cpu_ns >= 19_000_000, "20 ms of spinning counted as {spent:?}");
        assert!(spent.on_cpu_ns + spent.run_queue_wait_ns <= wall + 2_000_000, "{spent:?} in {wall} ns");
    }

    #[test]
    fn a_threads_clock_read_by_another_thread_counts_that_threads_work_only() {
        use std::sync::mpsc;
        let (tx, rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let worker = std::thread::spawn(move || {
            let own = CpuClock::this_thread().unwrap();
            tx.send(own).unwrap();
            // Spin until this thread's own clock says 30 ms, then wait (off CPU).
            while own.now() < std::time::Duration::from_millis(30) {
                std::hint::black_box(0u64);
            }
            done_rx.recv().unwrap();
        });
        let clock = rx.recv().unwrap();
        let process0 = CpuClock::PROCESS.now();
        let t = std::time::Instant::now();
        while clock.now() < std::time::Duration::from_millis(30) && t.elapsed() < std::time::Duration::from_secs(30) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let (worker_cpu, reader_cpu) = (clock.now(), CpuClock::THREAD.now());
        assert!(worker_cpu >= std::time::Duration::from_millis(30), "{worker_cpu:?}");
        // This (sleeping) thread used far less; the process clock has the worker's time in it.
        assert!(reader_cpu < worker_cpu, "reader {reader_cpu:?}, worker {worker_cpu:?}");
        assert!(CpuClock::PROCESS.now() >= process0);
        assert!(CpuClock::PROCESS.now() >= worker_cpu);
        done_tx.send(()).unwrap();
        worker.join().unwrap();
        // join returns once the kernel clears the thread's id (CLONE_CHILD_CLEARTID), a moment
        // before the exiting task is released; until then its clock still reads.
        let t = std::time::Instant::now();
        while clock.now() != std::time::Duration::ZERO && t.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(clock.now(), std::time::Duration::ZERO, "an ended thread's clock reads zero");
    }

    #[test]
    fn parses_kernel_cpulists() {
        assert_eq!(parse_cpulist("0-1").unwrap(), BTreeSet::from([0, 1]));
        assert_eq!(parse_cpulist("0-3,8,10-11\n").unwrap(), BTreeSet::from([0, 1, 2, 3, 8, 10, 11]));
        assert!(parse_cpulist("").unwrap().is_empty());
        assert!(parse_cpulist("3-1").is_err());
        assert!(parse_cpulist("a").is_err());
    }

    #[test]
    fn online_cpus_and_pinning() {
        let online = online_cpus().unwrap();
        assert!(!online.is_empty());
        let last = *online.iter().last().unwrap();
        std::thread::spawn(move || {
            pin_to(last).unwrap();
            assert_eq!(affinity(0).unwrap(), BTreeSet::from([last]));
            assert_eq!(current_cpu(), last);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn guard_gives_a_pinned_task_its_affinity_back() {
        let online = online_cpus().unwrap();
        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let pid = child.id() as i32;
        let before = affinity(pid).unwrap();
        {
            let guard = crate::guard::SettingsGuard::new_without_signal_handler();
            let first = BTreeSet::from([*online.iter().next().unwrap()]);
            pin_task(&guard, pid, &first).unwrap();
            pin_task(&guard, pid, &first).unwrap();
            assert_eq!(affinity(pid).unwrap(), first);
        }
        assert_eq!(affinity(pid).unwrap(), before);
        child.kill().unwrap();
        child.wait().unwrap();
    }

    proptest! {
        #[test]
        fn cpulist_round_trips(cpus in proptest::collection::btree_set(0usize..512, 0..64)) {
            prop_assert_eq!(parse_cpulist(&format_cpulist(&cpus)).unwrap(), cpus);
        }
    }
}
