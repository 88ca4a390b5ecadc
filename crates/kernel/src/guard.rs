//! The settings guard: every change Pagewise makes to a system setting is recorded here and
//! undone when the guard drops, when the process panics (unwinding drops the guard), and on
//! SIGINT/SIGTERM (a signal thread restores every live guard, then lets the signal kill the
//! process as it would have).
//!
//! A process killed with SIGKILL cannot clean up after itself, so each guard also keeps a
//! journal under `/run/pagewise/guard/`: the next guard created on the machine finds journals
//! of dead processes and restores what they changed. That is how a crashed `reclaimd` still
//! leaves the system as it found it.
//!
//! Undo runs newest first, so a setting changed twice ends at its very first value, a
//! cgroup is emptied before the directory holding it is removed, and a device's qdisc goes
//! before the device and the device before its network namespace.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once, Weak};

use serde::{Deserialize, Serialize};

use crate::error::{read_file, write_file, Error, Result};

/// Where guards keep their journals.
pub const JOURNAL_DIR: &str = "/run/pagewise/guard";

/// One recorded change and how to undo it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum Undo {
    /// Write `original` back to `path`.
    RestoreFile { path: PathBuf, original: String },
    /// Remove a directory the guard created (a cgroup): its tasks are moved to `parent_procs`
    /// first when that is given.
    RemoveDir { path: PathBuf, parent_procs: Option<PathBuf> },
    /// Unmount a filesystem the guard mounted (tracefs).
    Unmount { path: PathBuf },
    /// Give a task (a kernel thread such as kswapd) back its CPU affinity, a cpulist.
    RestoreAffinity { pid: i32, cpus: String },
    /// Swap off a swap file the guard created (if it is on) and delete it.
    RemoveSwapFile { path: PathBuf },
    /// Swap off a zram device the guard set up (if it is on) and reset it (`sysfs` is its
    /// /sys/block directory, `device` its /dev node).
    ResetZram { sysfs: PathBuf, device: PathBuf },
    /// Delete a network namespace the guard created, ending what still runs inside
    /// (crate::netns::delete).
    DeleteNetns { name: String },
    /// Delete a network device (a bridge, one end of a veth pair) the guard created in a
    /// namespace.
    DeleteLink { netns: String, name: String },
    /// Remove the root qdisc the guard put on a device (traffic shaping).
    DeleteQdisc { netns: String, dev: String },
    /// Delete a file the guard created (a testbed's state file).
    RemoveFile { path: PathBuf },
}

struct Inner {
    journal: Option<PathBuf>,
    undo: Mutex<Vec<Undo>>,
}

/// Records system-setting changes and undoes them on drop, panic and SIGINT/SIGTERM.
pub struct SettingsGuard {
    inner: Arc<Inner>,
}

static REGISTRY: Mutex<Vec<Weak<Inner>>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(0);
static SIGNALS: Once = Once::new();

/// The value a sysfs/procfs file reads back as, in the form it must be written.
///
/// Selector files print every choice with the active one in brackets
/// (`always [madvise] never`); writing needs just the bracketed word.
pub fn normalize_setting(text: &str) -> String {
    let trimmed = text.trim();
    if let (Some(open), Some(close)) = (trimmed.find('['), trimmed.find(']')) {
        if open < close {
            return trimmed[open + 1..close].to_string();
        }
    }
    trimmed.to_string()
}

impl SettingsGuard {
    /// A guard that also restores on SIGINT/SIGTERM. Also restores what dead processes'
    /// guards left behind.
    pub fn new() -> Self {
        SIGNALS.call_once(install_signal_restorer);
        Self::new_without_signal_handler()
    }

    /// A guard for a program that handles SIGINT/SIGTERM itself and calls
    /// [`SettingsGuard::restore`] (or drops the guard) on its way out.
    pub fn new_without_signal_handler() -> Self {
        recover_dead_journals();
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let journal = std::fs::create_dir_all(JOURNAL_DIR)
            .ok()
            .map(|_| Path::new(JOURNAL_DIR).join(format!("{}-{}.json", std::process::id(), id)));
        let inner = Arc::new(Inner { journal, undo: Mutex::new(Vec::new()) });
        REGISTRY.lock().unwrap_or_else(|e| e.into_inner()).push(Arc::downgrade(&inner));
        SettingsGuard { inner }
    }

    /// Write `value` to a setting file, remembering the value it had before (the first time
    /// this guard touches the file).
    pub fn write(&self, path: impl AsRef<Path>, value: &str) -> Result<()> {
        let path = path.as_ref();
        let original = normalize_setting(&read_file(path)?);
        self.record_file(path, original);
        write_file(path, value)
    }

    /// Record that this guard owns `path` from now on: it will be removed on restore, after
    /// moving any remaining tasks into `parent_procs`.
    pub fn record_created_dir(&self, path: impl Into<PathBuf>, parent_procs: Option<PathBuf>) {
        self.push(Undo::RemoveDir { path: path.into(), parent_procs });
    }

    /// Record that this guard mounted `path`.
    pub fn record_mount(&self, path: impl Into<PathBuf>) {
        self.push(Undo::Unmount { path: path.into() });
    }

    /// Record that this guard owns the swap file `path` (canonical, as /proc/swaps prints it):
    /// it will be swapped off and deleted on restore.
    pub fn record_swap_file(&self, path: impl Into<PathBuf>) {
        self.push(Undo::RemoveSwapFile { path: path.into() });
    }

    /// Record that this guard initialises the zram device `device` (/sys/block directory
    /// `sysfs`): it will be swapped off and reset on restore.
    pub fn record_zram(&self, sysfs: impl Into<PathBuf>, device: impl Into<PathBuf>) {
        self.push(Undo::ResetZram { sysfs: sysfs.into(), device: device.into() });
    }

    /// Record `pid`'s CPU affinity before the first change this guard makes to it.
    pub fn record_affinity(&self, pid: i32, cpus: &std::collections::BTreeSet<usize>) {
        let mut undo = self.lock();
        let known = undo.iter().any(|u| matches!(u, Undo::RestoreAffinity { pid: p, .. } if *p == pid));
        if !known {
            undo.push(Undo::RestoreAffinity { pid, cpus: crate::cpu::format_cpulist(cpus) });
            self.persist(&undo);
        }
    }

    fn record_file(&self, path: &Path, original: String) {
        let mut undo = self.lock();
        let known = undo.iter().any(|u| matches!(u, Undo::RestoreFile { path: p, .. } if p == path));
        if !known {
            undo.push(Undo::RestoreFile { path: path.to_path_buf(), original });
            self.persist(&undo);
        }
    }

    /// Record `u` unless an equal step is recorded already (a qdisc replaced several times is
    /// removed once).
    pub(crate) fn push_once(&self, u: Undo) {
        let mut undo = self.lock();
        if !undo.contains(&u) {
            undo.push(u);
            self.persist(&undo);
        }
    }

    /// Record a change made elsewhere in this crate (a namespace, a device, a qdisc, a file).
    pub(crate) fn push(&self, u: Undo) {
        let mut undo = self.lock();
        undo.push(u);
        self.persist(&undo);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Undo>> {
        self.inner.undo.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn persist(&self, undo: &[Undo]) {
        if let Some(journal) = &self.inner.journal {
            // Best effort: a journal that cannot be written only loses SIGKILL recovery.
            if let Ok(text) = serde_json::to_string(undo) {
                let _ = std::fs::write(journal, text);
            }
        }
    }

    /// The changes recorded so far, oldest first.
    pub fn recorded(&self) -> Vec<Undo> {
        self.lock().clone()
    }

    /// Undo everything now (newest first). Idempotent. Returns the failures, if any, after
    /// trying every step.
    pub fn restore(&self) -> Vec<Error> {
        restore_inner(&self.inner)
    }
}

impl Default for SettingsGuard {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for SettingsGuard {
    fn drop(&mut self) {
        for err in self.restore() {
            eprintln!("pagewise: settings guard could not restore: {err}");
        }
    }
}

fn restore_inner(inner: &Inner) -> Vec<Error> {
    let steps: Vec<Undo> = std::mem::take(&mut *inner.undo.lock().unwrap_or_else(|e| e.into_inner()));
    let errors = apply_undo(steps);
    if let Some(journal) = &inner.journal {
        let _ = std::fs::remove_file(journal);
    }
    errors
}

/// Apply undo steps newest first; keep going past failures.
pub fn apply_undo(steps: Vec<Undo>) -> Vec<Error> {
    let mut errors = Vec::new();
    for step in steps.into_iter().rev() {
        let result = match &step {
            Undo::RestoreFile { path, original } => write_file(path, original),
            Undo::RemoveDir { path, parent_procs } => remove_dir(path, parent_procs.as_deref()),
            Undo::Unmount { path } => crate::tracefs::unmount(path),
            Undo::RestoreAffinity { pid, cpus } => restore_affinity(*pid, cpus),
            Undo::RemoveSwapFile { path } => crate::swap::remove_swap_file(path),
            Undo::ResetZram { sysfs, device } => crate::swap::zram::reset_zram(sysfs, device),
            Undo::DeleteNetns { name } => crate::netns::delete(name, std::time::Duration::from_secs(1)),
            Undo::DeleteLink { netns, name } => crate::netns::delete_link(netns, name),
            Undo::DeleteQdisc { netns, dev } => crate::netns::delete_root_qdisc(netns, dev),
            Undo::RemoveFile { path } => match std::fs::remove_file(path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(Error::Write { path: path.clone(), value: "unlink".into(), source: e })
                }
                _ => Ok(()),
            },
        };
        if let Err(e) = result {
            errors.push(e);
        }
    }
    errors
}

fn restore_affinity(pid: i32, cpus: &str) -> Result<()> {
    match crate::cpu::set_affinity_of(pid, &crate::cpu::parse_cpulist(cpus)?) {
        // ESRCH: the task is gone; nothing to restore.
        Err(e) if e.errno() == Some(libc::ESRCH) => Ok(()),
        other => other,
    }
}

fn remove_dir(path: &Path, parent_procs: Option<&Path>) -> Result<()> {
    if !path.exists() {
        return Ok(());
    }
    if let Some(parent) = parent_procs {
        crate::cgroup::evacuate(path, parent)?;
    }
    // A cgroup directory is removed with rmdir even though it lists files.
    let mut last = None;
    for _ in 0..50 {
        match std::fs::remove_dir(path) {
            Ok(()) => return Ok(()),
            // EBUSY: tasks still exiting; give them a moment.
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                last = Some(e);
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => return Err(Error::Write { path: path.to_path_buf(), value: "rmdir".into(), source: e }),
        }
    }
    Err(Error::Write { path: path.to_path_buf(), value: "rmdir".into(), source: last.expect("retried") })
}

fn install_signal_restorer() {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) else {
        return;
    };
    std::thread::Builder::new()
        .name("pagewise-guard-signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                restore_all_live_guards();
                // Die of the signal as we would have without a handler, so the parent sees it.
                let _ = signal_hook::low_level::emulate_default_handler(sig);
                std::process::exit(128 + sig);
            }
        })
        .ok();
}

/// Restore every live guard of this process (the signal path).
pub fn restore_all_live_guards() {
    let guards: Vec<Arc<Inner>> =
        REGISTRY.lock().unwrap_or_else(|e| e.into_inner()).iter().filter_map(Weak::upgrade).collect();
    for g in guards.iter().rev() {
        for err in restore_inner(g) {
            eprintln!("pagewise: settings guard could not restore: {err}");
        }
    }
}

fn pid_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence and permission.
    unsafe { libc::kill(pid, 0) == 0 || *libc::__errno_location() == libc::EPERM }
}

/// Restore what guards of processes that died without cleaning up (SIGKILL) left behind.
pub fn recover_dead_journals() -> Vec<Error> {
    let mut errors = Vec::new();
    let Ok(entries) = std::fs::read_dir(JOURNAL_DIR) else { return errors };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().to_string();
        let Some(pid) = name.split('-').next().and_then(|p| p.parse::<i32>().ok()) else { continue };
        if pid_alive(pid) {
            continue;
        }
        if let Ok(text) = std::fs::read_to_string(&path) {
            if let Ok(steps) = serde_json::from_str::<Vec<Undo>>(&text) {
                errors.extend(apply_undo(steps));
            }
        }
        let _ = std::fs::remove_file(&path);
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_picks_the_bracketed_choice() {
        assert_eq!(normalize_setting("always [madvise] never\n"), "madvise");
        assert_eq!(normalize_setting("[always] defer defer+madvise madvise never"), "always");
        assert_eq!(normalize_setting("  1024\n"), "1024");
    }

    #[test]
    fn restores_files_newest_first_to_the_first_value() {
        let scratch = crate::private_dir::PrivateDir::new("guard-test").unwrap();
        let dir = scratch.path().to_path_buf();
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("setting");
        std::fs::write(&f, "always [madvise] never\n").unwrap();
        {
            let g = SettingsGuard::new_without_signal_handler();
            g.write(&f, "always").unwrap();
            g.write(&f, "never").unwrap();
            assert_eq!(g.recorded().len(), 1);
            assert_eq!(std::fs::read_to_string(&f).unwrap(), "never");
        }
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "madvise");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn journal_of_a_dead_process_is_replayed() {
        let scratch = crate::private_dir::PrivateDir::new("journal-test").unwrap();
        let dir = scratch.path().to_path_buf();
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("value");
        std::fs::write(&f, "changed").unwrap();
        std::fs::create_dir_all(JOURNAL_DIR).unwrap();
        // pid 0x7ffffff0 does not exist (beyond pid_max).
        let journal = Path::new(JOURNAL_DIR).join("2147483632-0.json");
        let steps = vec![Undo::RestoreFile { path: f.clone(), original: "original".into() }];
        std::fs::write(&journal, serde_json::to_string(&steps).unwrap()).unwrap();
        assert!(recover_dead_journals().is_empty());
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "original");
        assert!(!journal.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
