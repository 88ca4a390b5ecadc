//! Free page reporting: a guest kernel handing its free memory back to the host.
//!
//! Under a hypervisor with virtio-balloon free page reporting (`VIRTIO_BALLOON_F_REPORTING`,
//! Documentation/mm/free_page_reporting.rst), the guest reports free blocks of at least
//! `page_reporting_order` pages (order 9, 2 MiB, on x86) to the host in passes about 2 s apart
//! (`PAGE_REPORTING_DELAY` in mm/page_reporting.c), and the host discards them. Memory allocated
//! from a reported block is backed again one host fault at a time on first touch. On this
//! machine kind (a Firecracker VM) that is what a memory measurement mostly sees:
//! first-touching 1 GiB of hugepages took 2.6 s from reported memory and 0.13 s from memory
//! freed a moment before; MADV_COLLAPSE took 3.9 ms a region against 0.6 ms (4 KiB pages suffer
//! too, less: 0.4–0.8 s a GiB against 0.39). Which one a run gets depends on how long ago the
//! memory it allocates was freed — by the previous run of an experiment, say — so back-to-back
//! runs alternate between the two, and a configuration's place in the run order becomes part of
//! its figure. Two states can be reached on purpose: [`settle`] waits until reporting is idle
//! (free memory returned to the host, as on a VM that has been idle), and [`back_free_memory`]
//! then has the host back a given amount of it again (as on bare metal, where there is no host
//! to fault: the state whose figures spread least).
//!
//! Read-only: reporting belongs to the machine's own management, and nothing here writes to it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{read_trimmed, read_u64, Result};
use crate::mem::{align_up, Advice, MapOptions, Mapping, HUGE_PMD};

/// The page reporting module's parameters (built in: CONFIG_PAGE_REPORTING).
const PARAMS: &str = "/sys/module/page_reporting/parameters";
/// virtio devices; a balloon is device id 5 (virtio spec 5.5).
const VIRTIO_DEVICES: &str = "/sys/bus/virtio/devices";
const VIRTIO_ID_BALLOON: &str = "0x0005";
/// Feature bit of free page reporting (virtio spec 5.5.3, include/uapi/linux/virtio_balloon.h).
const VIRTIO_BALLOON_F_REPORTING: usize = 5;
/// The kernel's delay between reporting passes (mm/page_reporting.c: `PAGE_REPORTING_DELAY`).
pub const REPORTING_DELAY: Duration = Duration::from_secs(2);

/// Free page reporting as this machine has it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PageReporting {
    /// Blocks of at least this order are reported.
    pub order: u32,
    /// A running count of reported KiB, where the kernel exports one (`reported_kib`: this
    /// machine kind's kernel does, mainline does not).
    #[serde(skip)]
    pub reported_kib_path: Option<PathBuf>,
}

/// Whether `features` (a virtio device's `features` file: one '0'/'1' per bit, bit 0 first)
/// has free page reporting.
pub fn balloon_reports(features: &str) -> bool {
    features.as_bytes().get(VIRTIO_BALLOON_F_REPORTING) == Some(&b'1')
}

/// Free page reporting, if a bound virtio balloon reports free pages; `None` otherwise (bare
/// metal, or a VM without it).
pub fn probe() -> Option<PageReporting> {
    let order = read_u64(Path::new(PARAMS).join("page_reporting_order")).ok()?;
    let reporting_balloon = std::fs::read_dir(VIRTIO_DEVICES).ok()?.flatten().any(|dev| {
        let dir = dev.path();
        read_trimmed(dir.join("device")).is_ok_and(|id| id == VIRTIO_ID_BALLOON)
            && dir.join("driver").exists()
            && read_trimmed(dir.join("features")).is_ok_and(|f| balloon_reports(&f))
    });
    let counter = Path::new(PARAMS).join("reported_kib");
    reporting_balloon.then(|| PageReporting {
        order: order as u32,
        reported_kib_path: read_u64(&counter).is_ok().then_some(counter),
    })
}

impl PageReporting {
    /// KiB reported so far, where the kernel counts them.
    pub fn reported_kib(&self) -> Option<u64> {
        self.reported_kib_path.as_ref().and_then(|p| read_u64(p).ok())
    }
}

/// When reporting counts as idle: the pure rule behind [`settle`].
#[derive(Clone, Copy, Debug)]
pub struct SettleRule {
    /// The counter unchanged for this long: a whole pass went by with nothing to report.
    pub quiet: Duration,
    /// Never wait longer than this.
    pub cap: Duration,
    /// Without a counter, wait this long: passes enough for what a run frees.
    pub blind: Duration,
}

impl Default for SettleRule {
    fn default() -> Self {
        // A pass every 2 s reported up to ~380 MiB here: 1 GiB freed is reported within 6–9 s.
        SettleRule {
            quiet: REPORTING_DELAY + Duration::from_millis(500),
            cap: Duration::from_secs(30),
            blind: 3 * REPORTING_DELAY,
        }
    }
}

/// What the rule says about the samples so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SettleStep {
    /// Sample again after this long.
    Wait(Duration),
    /// Reporting is idle.
    Idle,
    /// The cap was reached with reporting still at work.
    GaveUp,
}

impl SettleRule {
    /// Decide from `elapsed` since the wait began and, with a counter, how long it has stood
    /// still (`unchanged_for`); `None` means there is no counter.
    pub fn step(&self, elapsed: Duration, unchanged_for: Option<Duration>) -> SettleStep {
        let sample = Duration::from_millis(250);
        match unchanged_for {
            Some(still) if still >= self.quiet => SettleStep::Idle,
            _ if elapsed >= self.cap => SettleStep::GaveUp,
            Some(_) => SettleStep::Wait(sample),
            None if elapsed >= self.blind => SettleStep::Idle,
            None => SettleStep::Wait((self.blind - elapsed).min(self.cap - elapsed)),
        }
    }
}

/// What a [`settle`] did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Settled {
    pub waited: Duration,
    /// KiB reported while waiting (with a counter).
    pub reported_kib: Option<u64>,
    /// True when the cap ran out first.
    pub gave_up: bool,
}

/// Wait until free page reporting is idle (see the module doc); returns at once without it.
pub fn settle(reporting: Option<&PageReporting>, rule: SettleRule) -> Settled {
    let start = Instant::now();
    let Some(r) = reporting else {
        return Settled { waited: Duration::ZERO, reported_kib: None, gave_up: false };
    };
    let first = r.reported_kib();
    let (mut last, mut since) = (first, Instant::now());
    loop {
        let now = r.reported_kib();
        if now != last {
            (last, since) = (now, Instant::now());
        }
        let unchanged_for = last.map(|_| since.elapsed());
        match rule.step(start.elapsed(), unchanged_for) {
            SettleStep::Wait(d) => std::thread::sleep(d),
            end => {
                let reported_kib = first.zip(last).map(|(a, b)| b.saturating_sub(a));
                return Settled { waited: start.elapsed(), reported_kib, gave_up: end == SettleStep::GaveUp };
            }
        }
    }
}

/// Have the host back `bytes` of free memory again: fault in a private anonymous mapping of
/// that size (hugepages where the THP policy allows them) and unmap it. Its blocks go back to
/// the head of the free lists, where the next allocations find them, and stay backed until a
/// reporting pass takes them (one [`REPORTING_DELAY`] after they were freed, at the soonest):
/// a program started at once allocates memory that costs no host fault. Call it after
/// [`settle`], or a pass already under way may take the blocks first.
pub fn back_free_memory(bytes: usize) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    let len = align_up(bytes, HUGE_PMD);
    let m = Mapping::anonymous(len, &MapOptions { align: Some(HUGE_PMD), noreserve: true, ..Default::default() })?;
    // Hugepages fault the range in 512 times faster; where THP is off the advice fails and
    // the populate goes 4 KiB at a time, backing the same memory.
    let _ = m.advise(Advice::HugePage);
    m.advise(Advice::PopulateWrite)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn the_reporting_bit_is_bit_five_of_the_features_string() {
        // Read off this machine kind's balloon: stats, deflate-on-OOM, reporting, bit 7.
        assert!(balloon_reports("01100101000000000000000000000000100000000000"));
        assert!(!balloon_reports("01100001000000000000000000000000100000000000"));
        assert!(!balloon_reports("0110"));
        assert!(!balloon_reports(""));
    }

    #[test]
    fn a_counter_that_stands_still_for_a_pass_is_idle_and_a_moving_one_waits_to_the_cap() {
        let rule = SettleRule::default();
        assert_eq!(rule.step(S(0), Some(S(0))), SettleStep::Wait(S(250)));
        assert_eq!(rule.step(S(2400), Some(S(2400))), SettleStep::Wait(S(250)));
        assert_eq!(rule.step(S(2500), Some(S(2500))), SettleStep::Idle);
        assert_eq!(rule.step(S(9000), Some(S(2600))), SettleStep::Idle);
        assert_eq!(rule.step(S(29_000), Some(S(100))), SettleStep::Wait(S(250)));
        assert_eq!(rule.step(S(30_000), Some(S(100))), SettleStep::GaveUp);
        // Idle wins over the cap when both hold.
        assert_eq!(rule.step(S(31_000), Some(S(3000))), SettleStep::Idle);
    }

    #[test]
    fn without_a_counter_the_wait_is_blind_and_bounded() {
        let rule = SettleRule::default();
        assert_eq!(rule.step(S(0), None), SettleStep::Wait(S(6000)));
        assert_eq!(rule.step(S(4000), None), SettleStep::Wait(S(2000)));
        assert_eq!(rule.step(S(6000), None), SettleStep::Idle);
        let short_cap = SettleRule { cap: S(1000), ..rule };
        assert_eq!(short_cap.step(S(0), None), SettleStep::Wait(S(1000)));
        assert_eq!(short_cap.step(S(1000), None), SettleStep::GaveUp);
    }

    #[test]
    fn backing_free_memory_leaves_nothing_mapped() {
        let rss = || crate::procfs::read_status(crate::procfs::Pid::SelfProcess).unwrap().vmrss.unwrap();
        let before = rss();
        back_free_memory(64 << 20).unwrap();
        back_free_memory(0).unwrap();
        // The 64 MiB were resident for a moment and are unmapped again: RSS is back within
        // what other test threads may have allocated meanwhile.
        assert!(rss() < before + 32 * 1024, "{} KiB resident after, {before} KiB before", rss());
    }

    #[test]
    fn no_reporting_means_no_wait() {
        let s = settle(None, SettleRule::default());
        assert_eq!(s, Settled { waited: Duration::ZERO, reported_kib: None, gave_up: false });
    }
}
