//! tracefs: mount it if absent, run a private trace instance, enable events, and read events
//! with the CPU each fired on.
//!
//! Pagewise traces in its own instance (`instances/pagewise-<pid>-<n>`), never in the global
//! buffer: another tracer's settings stay untouched, and removing the instance (the guard does)
//! disables its events and frees its buffers in one step.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use serde::Serialize;

use crate::error::{read_file, write_file, Error, Result};
use crate::guard::SettingsGuard;

/// Where tracefs lives on current kernels.
pub const TRACEFS: &str = "/sys/kernel/tracing";
/// The old place, under debugfs.
pub const DEBUGFS_TRACING: &str = "/sys/kernel/debug/tracing";

/// The mounted tracefs, if any.
pub fn mounted() -> Option<PathBuf> {
    [TRACEFS, DEBUGFS_TRACING].iter().map(PathBuf::from).find(|p| p.join("events").is_dir())
}

/// Whether the kernel can mount tracefs at all.
pub fn supported() -> bool {
    read_file("/proc/filesystems").map(|t| t.lines().any(|l| l.trim_end().ends_with("tracefs"))).unwrap_or(false)
}

/// Marks a tracefs mount made by Pagewise, so the last Pagewise user unmounts it and a mount
/// made by someone else is never touched.
pub const MOUNT_MARKER: &str = "/run/pagewise/tracefs-mounted-by-pagewise";

/// Mount tracefs at /sys/kernel/tracing when no tracefs is mounted. Every guard that uses a
/// Pagewise-made mount records an unmount; the one that finds no trace instances left when it
/// undoes performs it, so concurrent Pagewise tracers never pull the mount from under each
/// other.
pub fn mount_if_absent(guard: &SettingsGuard) -> Result<PathBuf> {
    if let Some(p) = mounted() {
        if Path::new(MOUNT_MARKER).exists() {
            guard.record_mount(&p);
        }
        return Ok(p);
    }
    let target = std::ffi::CString::new(TRACEFS).expect("static path");
    let fstype = std::ffi::CString::new("tracefs").expect("static");
    // SAFETY: valid C strings; mounting changes the namespace only.
    let rc = unsafe { libc::mount(fstype.as_ptr(), target.as_ptr(), fstype.as_ptr(), 0, std::ptr::null()) };
    if rc != 0 {
        return Err(Error::last_os("mount(tracefs, /sys/kernel/tracing)"));
    }
    if let Some(dir) = Path::new(MOUNT_MARKER).parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let _ = std::fs::write(MOUNT_MARKER, std::process::id().to_string());
    guard.record_mount(TRACEFS);
    Ok(PathBuf::from(TRACEFS))
}

/// Unmount a Pagewise-made tracefs (the guard's undo step), unless trace instances remain:
/// then another Pagewise tracer still uses it and its guard unmounts later.
pub fn unmount(path: &Path) -> Result<()> {
    let in_use = std::fs::read_dir(path.join("instances")).map(|mut d| d.next().is_some()).unwrap_or(false);
    if in_use || !Path::new(MOUNT_MARKER).exists() {
        return Ok(());
    }
    let target = std::ffi::CString::new(path.as_os_str().to_string_lossy().as_bytes())
        .map_err(|_| Error::Invalid("path with NUL".into()))?;
    // SAFETY: valid C string. MNT_DETACH: an open trace_pipe elsewhere must not block undo.
    if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINVAL) {
            return Err(Error::Syscall { call: "umount2(tracefs)", source: err });
        }
        // EINVAL: not mounted any more.
    }
    let _ = std::fs::remove_file(MOUNT_MARKER);
    Ok(())
}

/// Whether an event exists (`vmscan`, `mm_vmscan_direct_reclaim_begin`) in a mounted tracefs.
pub fn event_exists(root: &Path, system: &str, event: &str) -> bool {
    root.join("events").join(system).join(event).is_dir()
}

static NEXT_INSTANCE: AtomicU32 = AtomicU32::new(0);

/// The process an instance name made by [`Instance::create`] (`pagewise-<pid>-<n>`) belongs to.
fn instance_owner(name: &str) -> Option<i32> {
    let (pid, n) = name.strip_prefix("pagewise-")?.split_once('-')?;
    n.parse::<u32>().ok()?;
    pid.parse().ok().filter(|&p| p > 0)
}

/// Remove the instances under `instances` whose pagewise process is gone (best effort: an
/// instance busy in another reader stays).
fn remove_orphans(instances: &Path) {
    let Ok(dir) = std::fs::read_dir(instances) else { return };
    for entry in dir.flatten() {
        let owner = instance_owner(&entry.file_name().to_string_lossy());
        if owner.is_some_and(|pid| !crate::signal::process_alive(pid)) {
            let _ = std::fs::remove_dir(entry.path());
        }
    }
}

/// A private trace instance, removed by the guard that created it.
pub struct Instance {
    dir: PathBuf,
}

impl Instance {
    /// Create an instance (mounting tracefs first if needed). Instances of pagewise processes
    /// that no longer exist are removed first: a process killed before its guard ran leaves
    /// its instance recording, with its buffers allocated, until someone does.
    pub fn create(guard: &SettingsGuard) -> Result<Self> {
        let root = mount_if_absent(guard)?;
        remove_orphans(&root.join("instances"));
        let name = format!("pagewise-{}-{}", std::process::id(), NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed));
        let dir = root.join("instances").join(name);
        std::fs::create_dir(&dir).map_err(|source| Error::Write {
            path: dir.clone(),
            value: "mkdir".into(),
            source,
        })?;
        guard.record_created_dir(dir.clone(), None);
        Ok(Instance { dir })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn event_dir(&self, system: &str, event: &str) -> Result<PathBuf> {
        let ok = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok(system) || !ok(event) {
            return Err(Error::Invalid(format!("bad trace event name {system}:{event}")));
        }
        let dir = self.dir.join("events").join(system).join(event);
        if !dir.is_dir() {
            return Err(Error::Invalid(format!("this kernel has no trace event {system}:{event}")));
        }
        Ok(dir)
    }

    /// Enable one event in this instance.
    pub fn enable(&self, system: &str, event: &str) -> Result<()> {
        write_file(self.event_dir(system, event)?.join("enable"), "1")
    }

    /// Disable one event in this instance.
    pub fn disable(&self, system: &str, event: &str) -> Result<()> {
        write_file(self.event_dir(system, event)?.join("enable"), "0")
    }

    /// Per-CPU buffer size in KiB.
    pub fn set_buffer_kb(&self, kb: u64) -> Result<()> {
        write_file(self.dir.join("buffer_size_kb"), &kb.to_string())
    }

    /// Start or stop recording.
    pub fn set_tracing_on(&self, on: bool) -> Result<()> {
        write_file(self.dir.join("tracing_on"), if on { "1" } else { "0" })
    }

    /// The buffered events, without consuming them.
    pub fn snapshot(&self) -> Result<Vec<TraceEvent>> {
        Ok(parse_trace(&read_file(self.dir.join("trace"))?))
    }

    /// Clear the buffer.
    pub fn clear(&self) -> Result<()> {
        write_file(self.dir.join("trace"), "")
    }

    /// Consume what is buffered now, without blocking (trace_pipe opened non-blocking).
    pub fn drain(&self) -> Result<Vec<TraceEvent>> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.dir.join("trace_pipe");
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .map_err(|source| Error::Read { path: path.clone(), source })?;
        let mut text = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            match f.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => text.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(source) => return Err(Error::Read { path, source }),
            }
        }
        Ok(parse_trace(&String::from_utf8_lossy(&text)))
    }
}

/// One event line of the text trace format.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TraceEvent {
    pub task: String,
    pub pid: i32,
    pub cpu: usize,
    /// Seconds since boot (trace clock "local").
    pub timestamp: f64,
    pub name: String,
    /// Everything after `name: `.
    pub body: String,
}

impl TraceEvent {
    /// `key=value` fields of the body.
    pub fn fields(&self) -> BTreeMap<&str, &str> {
        self.body.split_whitespace().filter_map(|kv| kv.split_once('=')).collect()
    }

    /// A numeric field.
    pub fn field_u64(&self, key: &str) -> Option<u64> {
        self.fields().get(key).and_then(|v| v.parse().ok())
    }
}

/// Parse one trace line: `  kswapd0-48  [001] d..1.  1234.567890: mm_vmscan_kswapd_wake: nid=0 order=0`.
pub fn parse_trace_line(line: &str) -> Option<TraceEvent> {
    if line.starts_with('#') {
        return None;
    }
    let open = line.find("] ")?;
    let cpu_start = line[..open].rfind('[')?;
    let cpu: usize = line[cpu_start + 1..open].trim().parse().ok()?;
    let head = line[..cpu_start].trim();
    let (task, pid) = head.rsplit_once('-')?;
    let pid: i32 = pid.trim().parse().ok()?;
    // After "] ": optional irq-flags field, then "TIMESTAMP: NAME: BODY".
    let rest = line[open + 2..].trim_start();
    let (before, after) = rest.split_once(": ")?;
    let timestamp: f64 = before.split_whitespace().last()?.parse().ok()?;
    let (name, body) = after.split_once(": ").unwrap_or((after.trim_end_matches(':'), ""));
    Some(TraceEvent {
        task: task.trim().to_string(),
        pid,
        cpu,
        timestamp,
        name: name.trim().to_string(),
        body: body.trim().to_string(),
    })
}

/// Parse a whole trace buffer, skipping comments and lines that are not events.
pub fn parse_trace(text: &str) -> Vec<TraceEvent> {
    text.lines().filter_map(parse_trace_line).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_names_name_their_process() {
        assert_eq!(instance_owner("pagewise-24258-2"), Some(24258));
        assert_eq!(instance_owner("pagewise-1-0"), Some(1));
        for other in ["pagewise-24258", "pagewise-x-2", "pagewise-0-1", "pagewise-12-y", "perf-12-3", "pagewise--1-2"] {
            assert_eq!(instance_owner(other), None, "{other}");
        }
    }

    #[test]
    fn parses_event_lines() {
        let e =
            parse_trace_line("         kswapd0-48      [001] d..1.   123.456789: mm_vmscan_kswapd_wake: nid=0 order=0")
                .unwrap();
        assert_eq!((e.task.as_str(), e.pid, e.cpu), ("kswapd0", 48, 1));
        assert_eq!(e.name, "mm_vmscan_kswapd_wake");
        assert_eq!(e.field_u64("order"), Some(0));
        assert!((e.timestamp - 123.456789).abs() < 1e-9);
        let e = parse_trace_line(
            "   my-task-name-1234  [000] .....  5.000001: mm_vmscan_direct_reclaim_end: nr_reclaimed=32",
        )
        .unwrap();
        assert_eq!((e.task.as_str(), e.pid, e.cpu), ("my-task-name", 1234, 0));
        assert_eq!(e.field_u64("nr_reclaimed"), Some(32));
        // Kernels before 5.x had no irq-flags column.
        let e = parse_trace_line("  dd-77 [003] 9.5: mm_shrink_slab_start: objects=5").unwrap();
        assert_eq!(e.cpu, 3);
        assert!(parse_trace_line("# tracer: nop").is_none());
        assert!(parse_trace_line("garbage").is_none());
    }

    /// The two tests share this process's tracefs mount: one at a time. Run together, one saw
    /// its instance without events/vmscan (a clean-clone `make test`, once in four runs); the
    /// cause in the mount's sharing is not yet known.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// A new instance under `guard`, or None (said as a skip) where tracefs cannot give one.
    fn instance_or_skip(guard: &SettingsGuard) -> Option<Instance> {
        if !supported() {
            crate::testing::skip("no tracefs");
            return None;
        }
        Instance::create(guard).map_err(|e| crate::testing::skip(format!("cannot create a trace instance: {e}"))).ok()
    }

    #[test]
    fn instance_records_vmscan_events_with_cpu() {
        let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let guard = SettingsGuard::new_without_signal_handler();
        let Some(inst) = instance_or_skip(&guard) else { return };
        let dir = inst.dir().to_path_buf();
        // mm_vmscan_memcg_* and shrink events need pressure; an enable/disable round trip and
        // an empty drain must work without it.
        inst.enable("vmscan", "mm_vmscan_kswapd_wake").unwrap();
        inst.disable("vmscan", "mm_vmscan_kswapd_wake").unwrap();
        assert!(inst.enable("vmscan", "no_such_event").is_err());
        assert!(inst.drain().unwrap().is_empty());
        drop(guard);
        assert!(!dir.exists(), "instance removed by the guard");
    }

    #[test]
    fn instance_of_a_dead_process_is_removed_and_a_live_ones_kept() {
        let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let guard = SettingsGuard::new_without_signal_handler();
        let Some(live) = instance_or_skip(&guard) else { return };
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let orphan = live.dir().parent().unwrap().join(format!("pagewise-{dead}-0"));
        std::fs::create_dir(&orphan).unwrap();
        let second = Instance::create(&guard).unwrap();
        let gone = !orphan.exists();
        let _ = std::fs::remove_dir(&orphan);
        assert!(gone, "the dead process's instance is still there");
        assert!(live.dir().is_dir() && second.dir().is_dir());
    }

    #[test]
    fn concurrent_users_keep_the_mount_until_the_last_leaves() {
        let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        if !supported() {
            crate::testing::skip("no tracefs");
            return;
        }
        let first = SettingsGuard::new_without_signal_handler();
        let second = SettingsGuard::new_without_signal_handler();
        let (Ok(a), Ok(b)) = (Instance::create(&first), Instance::create(&second)) else {
            crate::testing::skip("cannot create trace instances");
            return;
        };
        let b_dir = b.dir().to_path_buf();
        drop(first);
        assert!(!a.dir().exists());
        assert!(b_dir.is_dir(), "the second user's instance survives the first guard");
        b.enable("vmscan", "mm_vmscan_kswapd_wake").unwrap();
        drop(second);
        assert!(!b_dir.exists());
    }
}
