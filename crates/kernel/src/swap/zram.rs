//! Swap on zram: a compressed block device in RAM (Documentation/admin-guide/blockdev/zram.rst).
//!
//! What a one-host user picks when memory runs short: the pages Linux swaps out stay in the
//! same RAM, compressed, so a swap-in is a decompression, not a disk read. That makes it the
//! like-for-like baseline of DLM, whose pages also stay in RAM (the servers').
//!
//! Setting a device up is four system-setting changes, all recorded in the settings guard so
//! that a test or an experiment never leaves the device initialised or the swap on — on drop,
//! panic, SIGINT/SIGTERM and, through the guard's journal, after SIGKILL:
//! 1. `comp_algorithm` (only while the device is uninitialised; restored by the guard to the
//!    value it had, after the reset below, which needs that order: undo runs newest first);
//! 2. `disksize` (initialises the device; undone by writing `reset`, which frees its memory);
//! 3. the swap header on the device's first page (the layout [`super::swap_header`] writes for
//!    swap files: mkswap(8) is not needed);
//! 4. swapon(2), on only while a run needs it ([`ZramSwap::on`]); the guard's undo swaps off
//!    first, since a device in use refuses `reset` with EBUSY.
//!
//! Only an unused device is taken: one already initialised (`initstate` 1) belongs to someone
//! else and is refused with a clear error, never reset.
//!
//! Memory: zram's pool (zsmalloc) is not charged to the memory cgroup of the task whose pages
//! are swapped out, so a program limited by a cgroup uses that limit plus the compressed pool,
//! which [`ZramSwap::mm_stat`] reports (`mem_used_max`: the pool's peak, reset with
//! [`ZramSwap::reset_peak`]).

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::error::{read_file, read_u64, write_file, Error, Result};
use crate::guard::SettingsGuard;

use super::{page_size, random_uuid, swap_area, swap_header, swap_off, SwapSpace, MIN_PAGES};

/// The algorithms a device offers, from its `comp_algorithm` file (`lzo [lzo-rle] lz4`), and
/// the one selected (in brackets).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Algorithms {
    pub available: Vec<String>,
    pub selected: Option<String>,
}

/// Parse a `comp_algorithm` file.
pub fn parse_algorithms(text: &str) -> Algorithms {
    let mut available = Vec::new();
    let mut selected = None;
    for word in text.split_whitespace() {
        match word.strip_prefix('[').and_then(|w| w.strip_suffix(']')) {
            Some(w) => {
                selected = Some(w.to_string());
                available.push(w.to_string());
            }
            None => available.push(word.to_string()),
        }
    }
    Algorithms { available, selected }
}

/// A device's `mm_stat` (zram.rst, "mm_stat"), in bytes except the page counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MmStat {
    /// Uncompressed size of the data stored.
    pub orig_data_size: u64,
    /// Compressed size of the data stored.
    pub compr_data_size: u64,
    /// Memory the device uses now, allocator overhead included.
    pub mem_used_total: u64,
    /// The most memory it used since initialisation or the last write of 0 to `mem_used_max`.
    pub mem_used_max: u64,
    /// Pages stored as a single repeated word (zero pages, mostly), without data.
    pub same_pages: u64,
    /// Pages that did not compress and are stored whole. Since Linux 4.19.
    pub huge_pages: Option<u64>,
}

/// Parse an `mm_stat` line (8 or more numbers; older kernels print 7).
pub fn parse_mm_stat(text: &str) -> Result<MmStat> {
    let nums: Vec<u64> = text
        .split_whitespace()
        .map(|w| w.parse().map_err(|_| Error::parse("zram mm_stat", format!("not a number: {w:?} in {text:?}"))))
        .collect::<Result<_>>()?;
    if nums.len() < 7 {
        return Err(Error::parse("zram mm_stat", format!("{} fields, expected at least 7: {text:?}", nums.len())));
    }
    Ok(MmStat {
        orig_data_size: nums[0],
        compr_data_size: nums[1],
        mem_used_total: nums[2],
        mem_used_max: nums[4],
        same_pages: nums[5],
        huge_pages: nums.get(7).copied(),
    })
}

/// `zram` followed by digits: the only names accepted, so no path can be built from anything
/// else.
fn valid_name(name: &str) -> bool {
    name.strip_prefix("zram").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The guard's undo of a zram swap device: swap it off if it is on, then reset it (frees its
/// memory and makes its disksize 0). Either may already have happened.
pub fn reset_zram(sysfs: &Path, device: &Path) -> Result<()> {
    if swap_area(device)?.is_some() {
        swap_off(device)?;
    }
    if read_u64(sysfs.join("initstate"))? == 0 {
        return Ok(());
    }
    // The swap code closes the device in swapoff(2) itself; a reader such as udev's blkid,
    // woken by the device's change event, can still hold it open for a moment (EBUSY).
    let mut last = None;
    for _ in 0..50 {
        match write_file(sysfs.join("reset"), "1") {
            Err(e) if e.errno() == Some(libc::EBUSY) => {
                last = Some(e);
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other,
        }
    }
    Err(last.expect("retried"))
}

/// A zram device Pagewise set up as swap, owned by a settings guard: swapped off and reset
/// (and its algorithm put back) when the guard restores.
#[derive(Debug)]
pub struct ZramSwap {
    sysfs: PathBuf,
    device: PathBuf,
    bytes: u64,
    algorithm: String,
}

impl ZramSwap {
    /// The algorithms `name` (e.g. `zram0`) offers.
    pub fn algorithms(name: &str) -> Result<Algorithms> {
        if !valid_name(name) {
            return Err(Error::Invalid(format!("{name:?} is not a zram device name (zram0, zram1, …)")));
        }
        Ok(parse_algorithms(&read_file(Path::new("/sys/block").join(name).join("comp_algorithm"))?))
    }

    /// Set up the unused device `name` (e.g. `zram0`) as a swap area of `bytes` of
    /// uncompressed data (a multiple of the page size, at least [`MIN_PAGES`] pages),
    /// compressing with `algorithm` (None: the device's current one). Not on yet: see
    /// [`SwapSpace::on`].
    pub fn create(guard: &SettingsGuard, name: &str, bytes: u64, algorithm: Option<&str>) -> Result<Self> {
        if !valid_name(name) {
            return Err(Error::Invalid(format!("{name:?} is not a zram device name (zram0, zram1, …)")));
        }
        let page = page_size() as u64;
        if !bytes.is_multiple_of(page) || bytes / page < MIN_PAGES {
            return Err(Error::Invalid(format!(
                "zram swap size {bytes} must be a multiple of the page size {page} and at least {MIN_PAGES} pages"
            )));
        }
        let sysfs = Path::new("/sys/block").join(name);
        let device = Path::new("/dev").join(name);
        if !sysfs.exists() || !device.exists() {
            return Err(Error::Invalid(format!(
                "no zram device {name} ({} or {} missing): load the module with `modprobe zram`",
                sysfs.display(),
                device.display()
            )));
        }
        let initstate = read_u64(sysfs.join("initstate"))?;
        if initstate != 0 || swap_area(&device)?.is_some() {
            return Err(Error::Invalid(format!(
                "{name} is already set up (initstate {initstate}, disksize {}): it belongs to someone else, \
                 and Pagewise uses only an unused zram device",
                read_u64(sysfs.join("disksize")).unwrap_or(0)
            )));
        }
        let offered = parse_algorithms(&read_file(sysfs.join("comp_algorithm"))?);
        let algorithm = match algorithm {
            Some(a) if !offered.available.iter().any(|x| x == a) => {
                return Err(Error::Invalid(format!(
                    "{name} offers no algorithm {a:?} (it offers: {})",
                    offered.available.join(", ")
                )))
            }
            Some(a) => {
                if offered.selected.as_deref() != Some(a) {
                    // Recorded first, so it is restored last, after the reset that allows it.
                    guard.write(sysfs.join("comp_algorithm"), a)?;
                }
                a.to_string()
            }
            None => offered.selected.clone().unwrap_or_default(),
        };
        // Recorded before the device is initialised: a crash from here on still resets it.
        guard.record_zram(sysfs.clone(), device.clone());
        write_file(sysfs.join("disksize"), &bytes.to_string())?;
        let header = swap_header(bytes / page, page as usize, random_uuid())?;
        let dev = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&device)
            .map_err(|source| Error::Write { path: device.clone(), value: "open".into(), source })?;
        std::os::unix::fs::FileExt::write_all_at(&dev, &header, 0).map_err(|source| Error::Write {
            path: device.clone(),
            value: "swap header".into(),
            source,
        })?;
        dev.sync_all().map_err(|source| Error::Write { path: device.clone(), value: "fsync".into(), source })?;
        Ok(ZramSwap { sysfs, device, bytes, algorithm })
    }

    /// Uncompressed capacity in bytes (the device's disksize).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The compression algorithm in use.
    pub fn algorithm(&self) -> &str {
        &self.algorithm
    }

    /// The device's memory statistics now.
    pub fn mm_stat(&self) -> Result<MmStat> {
        parse_mm_stat(&read_file(self.sysfs.join("mm_stat"))?)
    }

    /// Start a new peak: `mem_used_max` counts from now (zram.rst: writing 0 resets it).
    pub fn reset_peak(&self) -> Result<()> {
        write_file(self.sysfs.join("mem_used_max"), "0")
    }
}

impl SwapSpace for ZramSwap {
    fn path(&self) -> &Path {
        &self.device
    }

    fn describe(&self) -> String {
        format!("zram swap {} ({}, {} MiB)", self.device.display(), self.algorithm, self.bytes >> 20)
    }

    fn ram_peak(&self) -> Result<Option<u64>> {
        Ok(Some(self.mm_stat()?.mem_used_max))
    }

    fn reset_ram_peak(&self) -> Result<()> {
        self.reset_peak()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn algorithms_parse_with_the_selected_one() {
        let a = parse_algorithms("[lzo-rle] lzo lz4 \n");
        assert_eq!(a.available, ["lzo-rle", "lzo", "lz4"]);
        assert_eq!(a.selected.as_deref(), Some("lzo-rle"));
        assert_eq!(parse_algorithms("lzo lz4 [zstd]").selected.as_deref(), Some("zstd"));
        assert_eq!(parse_algorithms("").selected, None);
    }

    #[test]
    fn mm_stat_fixtures() {
        let s = parse_mm_stat(include_str!("../../fixtures/zram-mm_stat-6.18-firecracker.txt")).unwrap();
        assert!(s.orig_data_size > s.compr_data_size && s.mem_used_max >= s.mem_used_total, "{s:?}");
        assert!(s.huge_pages.is_some());
        let idle = parse_mm_stat("       0        0        0        0        0        0        0        0        0\n")
            .unwrap();
        assert_eq!(idle, MmStat { huge_pages: Some(0), ..MmStat::default() });
        // Linux 4.14 prints 7 fields (no huge_pages).
        let old = parse_mm_stat("4096 64 8192 0 8192 1 0").unwrap();
        assert_eq!((old.orig_data_size, old.mem_used_max, old.same_pages, old.huge_pages), (4096, 8192, 1, None));
        assert!(parse_mm_stat("1 2 3").is_err());
        assert!(parse_mm_stat("1 2 3 4 5 6 x").is_err());
    }

    #[test]
    fn names_and_sizes_are_checked_before_anything_is_touched() {
        let guard = SettingsGuard::new_without_signal_handler();
        for bad in ["zram", "zram0/../sda", "sda", "zramx", "../zram0"] {
            let e = ZramSwap::create(&guard, bad, 1 << 20, None).unwrap_err();
            assert!(e.to_string().contains("not a zram device name"), "{bad}: {e}");
        }
        assert!(ZramSwap::create(&guard, "zram0", 12345, None).is_err());
        assert!(ZramSwap::create(&guard, "zram0", 4096 * 4, None).is_err());
        assert!(guard.recorded().is_empty(), "nothing recorded for refused arguments");
    }
}
