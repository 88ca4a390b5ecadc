//! A cgroup-v1 usage threshold the reclaim worker moves without waiting for it.
//!
//! Registering a threshold (a write to `cgroup.event_control`) waits for an RCU grace period
//! in the kernel (mm/memcontrol-v1.c `__mem_cgroup_usage_register_event()` calls
//! `synchronize_rcu()` before it returns): 11–27 ms on this VM, measured with strace. A worker
//! that moved its threshold itself reclaimed nothing for that long, while the file-server load
//! charged 13 MiB more than any headroom it kept; its own reaction time, which sizes the
//! headroom, read 20 ms for a pass of 2 (issue 23). So the threshold is moved by a helper
//! thread, and the worker keeps waiting on the old one (and its timer) until the new one is in
//! place. Dropping the old one is cheap: the kernel unregisters it from a workqueue.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use pagewise_kernel::cgroup::{MemCgroup, UsageThreshold};

/// What the helper hands back: the threshold at the requested position, or why not.
type Armed = pagewise_kernel::Result<UsageThreshold>;

/// A usage threshold on one group, moved asynchronously.
pub struct MovingThreshold {
    current: Option<UsageThreshold>,
    /// The position asked of the helper and not yet in place.
    pending: Option<u64>,
    requests: Option<Sender<u64>>,
    done: Arc<Mutex<Option<Armed>>>,
    helper: Option<JoinHandle<()>>,
}

impl MovingThreshold {
    /// A threshold on `group` (none armed yet); `name` names the helper thread.
    pub fn new(group: MemCgroup, name: String) -> std::io::Result<Self> {
        let (tx, rx) = channel();
        let done = Arc::new(Mutex::new(None));
        let slot = done.clone();
        let helper = std::thread::Builder::new().name(name).spawn(move || arm_requests(&group, &rx, &slot))?;
        Ok(MovingThreshold { current: None, pending: None, requests: Some(tx), done, helper: Some(helper) })
    }

    /// Ask for the threshold at `at` bytes of usage, unless the armed one (or the one being
    /// armed) is within `slack` bytes of it: every move costs the helper a grace period.
    pub fn want(&mut self, at: u64, slack: u64) {
        let near = |b: u64| b.abs_diff(at) <= slack;
        if self.pending.map_or_else(|| self.current.as_ref().is_some_and(|t| near(t.bytes())), near) {
            return;
        }
        if let Some(tx) = &self.requests {
            if tx.send(at).is_ok() {
                self.pending = Some(at);
            }
        }
    }

    /// Put a threshold the helper finished in place of the old one. An error the helper met
    /// is returned once; the old threshold (if any) stays.
    pub fn settle(&mut self) -> pagewise_kernel::Result<()> {
        let Some(armed) = self.done.lock().unwrap_or_else(|e| e.into_inner()).take() else { return Ok(()) };
        // The helper arms requests in order and only reports the newest it has seen, so a
        // result whose position is not the pending one is followed by another.
        match armed {
            Ok(t) => {
                if self.pending == Some(t.bytes()) {
                    self.pending = None;
                }
                self.current = Some(t);
                Ok(())
            }
            Err(e) => {
                self.pending = None;
                Err(e)
            }
        }
    }

    /// The position of the threshold in place, if any.
    pub fn armed_at(&self) -> Option<u64> {
        self.current.as_ref().map(UsageThreshold::bytes)
    }

    /// Wait up to `timeout` for a crossing of the threshold in place (a plain sleep when none
    /// is); true when one happened.
    pub fn wait(&self, timeout: Duration) -> pagewise_kernel::Result<bool> {
        match &self.current {
            Some(t) => t.wait(timeout),
            None => {
                std::thread::sleep(timeout);
                Ok(false)
            }
        }
    }
}

impl Drop for MovingThreshold {
    fn drop(&mut self) {
        // Closing the channel ends the helper after the registration it may be in.
        self.requests = None;
        if let Some(h) = self.helper.take() {
            let _ = h.join();
        }
    }
}

/// The helper: arm the newest request, hand it over, repeat until the worker is gone.
fn arm_requests(group: &MemCgroup, rx: &Receiver<u64>, slot: &Mutex<Option<Armed>>) {
    while let Ok(mut at) = rx.recv() {
        // Requests that came in meanwhile are stale but for the last.
        while let Ok(newer) = rx.try_recv() {
            at = newer;
        }
        let armed = group.usage_threshold(at);
        *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(armed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagewise_kernel::cgroup::v1_memory_root;
    use pagewise_kernel::SettingsGuard;
    use std::time::Instant;

    /// The threshold asked for last is the one put in place (by the helper, when the caller
    /// settles), asking again near it arms nothing new, and a crossing of it is seen.
    #[test]
    fn the_newest_threshold_asked_for_is_armed_and_fires() {
        if v1_memory_root().is_none() {
            pagewise_kernel::testing::skip("usage thresholds need the cgroup v1 memory controller");
            return;
        }
        let guard = SettingsGuard::new_without_signal_handler();
        let cg = MemCgroup::create(&guard, &format!("test-threshold-{}", std::process::id())).unwrap();
        cg.set_limit(Some(256 << 20)).unwrap();
        let mut t = MovingThreshold::new(cg.clone(), "test-arm".into()).unwrap();
        let at = cg.usage().unwrap() + (4 << 20);
        t.want(at + (64 << 20), 0);
        t.want(at, 0);
        assert_eq!(t.armed_at(), None, "nothing is in place before the caller settles");
        let deadline = Instant::now() + Duration::from_secs(10);
        while t.armed_at() != Some(at) && Instant::now() < deadline {
            t.settle().unwrap();
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(t.armed_at(), Some(at), "the newest request is the one armed");
        assert_eq!(t.pending, None);
        t.want(at + 4096, 8192);
        assert_eq!(t.pending, None, "a position within the slack is not armed again");
        // A task of the group writes 8 MiB of page cache: usage crosses the threshold.
        let dir = pagewise_kernel::private_dir::PrivateDir::new_in("/var/tmp", "threshold-test").unwrap();
        let file = dir.join("fill");
        let mut writer = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("sleep 0.2; head -c 8388608 /dev/zero > '{}'", file.display()))
            .spawn()
            .unwrap();
        cg.add_process(writer.id()).unwrap();
        assert!(writer.wait().unwrap().success());
        assert!(t.wait(Duration::from_secs(2)).unwrap(), "no crossing seen at {at} bytes");
    }
}
