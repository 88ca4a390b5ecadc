//! Swap: swap files and swap on zram ([`zram`]), swapon(2)/swapoff(2), and /proc/swaps.
//!
//! Both kinds of swap space Pagewise sets up implement [`SwapSpace`] (on, off, is it on), so a
//! baseline that runs a program under a memory cgroup limit with swap on takes either.
//!
//! A swap file is a system setting like any other: [`SwapFile::create`] records it in the
//! settings guard *before* the file exists, and the guard's undo swaps it off (if it is on)
//! and deletes it — on drop, on panic, on SIGINT/SIGTERM and, through the guard's journal,
//! after a SIGKILL. So a test or an experiment never leaves swap on.
//!
//! # How the file is made, and why not with mkswap(8)
//! The file is preallocated with fallocate(2) (falling back to writing zeros where the
//! filesystem has no fallocate) — never sparse: swapon(2) refuses files with holes
//! (mm/swapfile.c, "swapfile has holes"), and ext4/XFS accept preallocated (unwritten) extents
//! (swapon(8): "fallocate(1) can be used on filesystems that support preallocated files
//! properly, like XFS or ext4"). Its first page holds the swap header, written here: the
//! layout is four fields and a magic string (`union swap_header`, include/linux/swap.h), so
//! writing it is shorter than finding, running and parsing the output of util-linux's mkswap,
//! which may not be installed, and keeps the error convention of this crate (the failing
//! syscall and errno) instead of a child's stderr.
//!
//! swapon(2) and swapoff(2) need CAP_SYS_ADMIN. A swap file on tmpfs is refused by the kernel
//! (tmpfs has no `swap_activate`); [`SwapFile::create`] says so before trying.

use std::ffi::CString;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::error::{read_file, Error, Result};
use crate::guard::SettingsGuard;

pub mod zram;
pub use zram::ZramSwap;

/// The magic string at the end of the header page (version 2 swap space, include/linux/swap.h).
pub const SWAP_MAGIC: &[u8; 10] = b"SWAPSPACE2";
/// `info.version` of the header.
pub const SWAP_VERSION: u32 = 1;
/// mkswap(8)'s lower bound: a header page and at least nine pages of swap.
pub const MIN_PAGES: u64 = 10;
/// TMPFS_MAGIC (include/uapi/linux/magic.h).
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// The system's page size (sysconf(_SC_PAGESIZE)).
pub fn page_size() -> usize {
    // SAFETY: sysconf takes no pointers.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// The header page of a swap area of `pages` pages of `page_size` bytes (the header page
/// included), native-endian as the kernel reads it:
///
/// ```text
/// offset 0     bootbits[1024]      zero
/// 1024         u32 version         1
/// 1028         u32 last_page       pages - 1 (the last usable page index)
/// 1032         u32 nr_badpages     0
/// 1036         u8  uuid[16]
/// 1052         u8  volume_name[16] zero
/// page - 10    "SWAPSPACE2"
/// ```
pub fn swap_header(pages: u64, page_size: usize, uuid: [u8; 16]) -> Result<Vec<u8>> {
    if !page_size.is_power_of_two() || page_size < 4096 {
        return Err(Error::Invalid(format!("page size {page_size} is not a power of two ≥ 4096")));
    }
    if pages < MIN_PAGES {
        return Err(Error::Invalid(format!("a swap area needs at least {MIN_PAGES} pages, not {pages}")));
    }
    let last_page = u32::try_from(pages - 1)
        .map_err(|_| Error::Invalid(format!("{pages} pages: the header's last_page field is 32 bits")))?;
    let mut page = vec![0u8; page_size];
    page[1024..1028].copy_from_slice(&SWAP_VERSION.to_ne_bytes());
    page[1028..1032].copy_from_slice(&last_page.to_ne_bytes());
    page[1032..1036].copy_from_slice(&0u32.to_ne_bytes());
    page[1036..1052].copy_from_slice(&uuid);
    page[page_size - SWAP_MAGIC.len()..].copy_from_slice(SWAP_MAGIC);
    Ok(page)
}

/// One line of /proc/swaps.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SwapArea {
    /// The file or device, as the kernel prints it (d_path; octal escapes undone).
    pub path: PathBuf,
    /// `file` or `partition`.
    pub kind: String,
    pub size_kib: u64,
    pub used_kib: u64,
    pub priority: i64,
}

/// Undo the octal escapes /proc/swaps uses for white space and backslashes in paths
/// (seq_file's `seq_path(m, path, " \t\n\\")`).
fn unescape(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// Parse /proc/swaps (a header line, then `Filename Type Size Used Priority`).
pub fn parse_swaps(text: &str) -> Result<Vec<SwapArea>> {
    let mut out = Vec::new();
    for line in text.lines().skip(1).filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() != 5 {
            return Err(Error::parse("/proc/swaps", format!("bad line {line:?}")));
        }
        let num =
            |s: &str| s.parse::<u64>().map_err(|_| Error::parse("/proc/swaps", format!("bad number in {line:?}")));
        out.push(SwapArea {
            path: PathBuf::from(std::ffi::OsStr::from_bytes(&unescape(f[0]))),
            kind: f[1].to_string(),
            size_kib: num(f[2])?,
            used_kib: num(f[3])?,
            priority: f[4].parse().map_err(|_| Error::parse("/proc/swaps", format!("bad priority in {line:?}")))?,
        });
    }
    Ok(out)
}

/// The swap areas in use now.
pub fn active_swaps() -> Result<Vec<SwapArea>> {
    parse_swaps(&read_file("/proc/swaps")?)
}

/// The swap area of `path`, if it is on. `path` must be absolute and canonical (as the kernel
/// prints it).
pub fn swap_area(path: &Path) -> Result<Option<SwapArea>> {
    Ok(active_swaps()?.into_iter().find(|a| a.path == path))
}

fn cpath(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| Error::Invalid(format!("path {} contains a NUL byte", path.display())))
}

/// swapon(2) with no flags (the kernel picks a priority below every existing area's).
pub fn swap_on(path: &Path) -> Result<()> {
    let c = cpath(path)?;
    // SAFETY: c is a valid NUL-terminated string for the duration of the call.
    if unsafe { libc::swapon(c.as_ptr(), 0) } != 0 {
        return Err(Error::last_os("swapon"));
    }
    Ok(())
}

/// swapoff(2): the kernel reads every page still in the area back into memory first.
pub fn swap_off(path: &Path) -> Result<()> {
    let c = cpath(path)?;
    // SAFETY: c is a valid NUL-terminated string for the duration of the call.
    if unsafe { libc::swapoff(c.as_ptr()) } != 0 {
        return Err(Error::last_os("swapoff"));
    }
    Ok(())
}

/// The guard's undo of a swap file: swap it off if it is on, then delete it. Either may
/// already have happened.
pub fn remove_swap_file(path: &Path) -> Result<()> {
    if swap_area(path)?.is_some() {
        swap_off(path)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(Error::Write { path: path.to_path_buf(), value: "unlink".into(), source }),
    }
}

/// The filesystem type (statfs f_type) of the filesystem holding `path`.
pub fn filesystem_type(path: &Path) -> Result<i64> {
    let c = cpath(path)?;
    // SAFETY: plain data, filled by statfs.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is a valid string and st a valid out pointer.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(Error::last_os("statfs"));
    }
    Ok(st.f_type as i64)
}

fn random_uuid() -> [u8; 16] {
    let mut u = [0u8; 16];
    // SAFETY: u is a valid 16-byte buffer. A short or failed read leaves zeros, which the
    // kernel accepts (the uuid is only a label).
    unsafe { libc::getrandom(u.as_mut_ptr().cast(), u.len(), 0) };
    // RFC 4122 version 4, variant 1, as mkswap writes.
    u[6] = (u[6] & 0x0f) | 0x40;
    u[8] = (u[8] & 0x3f) | 0x80;
    u
}

/// Swap space Pagewise set up — a [`SwapFile`] or a [`ZramSwap`] — which a run turns on only
/// while it needs it, so that nothing else on the machine pages to it.
pub trait SwapSpace: std::fmt::Debug + Sync {
    /// The file or device, canonical, as /proc/swaps lists it.
    fn path(&self) -> &Path;

    /// One line for a report: what it is, where, how large.
    fn describe(&self) -> String;

    /// swapon(2).
    fn on(&self) -> Result<()> {
        swap_on(self.path())
    }

    /// swapoff(2) (the kernel reads every page still in it back into memory first); nothing
    /// to do if it is off.
    fn off(&self) -> Result<()> {
        if self.is_on()? {
            swap_off(self.path())?;
        }
        Ok(())
    }

    /// Whether /proc/swaps lists it.
    fn is_on(&self) -> Result<bool> {
        Ok(swap_area(self.path())?.is_some())
    }

    /// Its line of /proc/swaps, when on.
    fn area(&self) -> Result<Option<SwapArea>> {
        swap_area(self.path())
    }

    /// The most RAM the swap space itself took since [`SwapSpace::reset_ram_peak`]: a zram
    /// device's compressed pool; None for a swap file, whose pages go to disk.
    fn ram_peak(&self) -> Result<Option<u64>> {
        Ok(None)
    }

    /// Start a new [`SwapSpace::ram_peak`].
    fn reset_ram_peak(&self) -> Result<()> {
        Ok(())
    }
}

/// A swap file Pagewise created, owned by a settings guard: swapped off and deleted when the
/// guard restores.
#[derive(Debug)]
pub struct SwapFile {
    path: PathBuf,
    bytes: u64,
}

impl SwapFile {
    /// Create a swap file of `bytes` (a multiple of the page size, at least [`MIN_PAGES`]
    /// pages) at `path`, which must not exist, on a filesystem that can hold swap (not tmpfs).
    /// The file is not yet on: see [`SwapFile::on`].
    pub fn create(guard: &SettingsGuard, path: impl AsRef<Path>, bytes: u64) -> Result<Self> {
        let page = page_size() as u64;
        if !bytes.is_multiple_of(page) || bytes / page < MIN_PAGES {
            return Err(Error::Invalid(format!(
                "swap file size {bytes} must be a multiple of the page size {page} and at least {MIN_PAGES} pages"
            )));
        }
        let path = path.as_ref();
        let name = path.file_name().ok_or_else(|| Error::Invalid(format!("{} names no file", path.display())))?;
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        // The kernel lists the area under its canonical path: build it so the guard's undo
        // and `is_on` find it.
        let dir = parent.canonicalize().map_err(|source| Error::Read { path: parent.to_path_buf(), source })?;
        if filesystem_type(&dir)? == TMPFS_MAGIC {
            return Err(Error::Invalid(format!(
                "{} is on tmpfs, which cannot hold a swap file (swapon(2) would fail with EINVAL): put it on a disk",
                dir.display()
            )));
        }
        let path = dir.join(name);
        let header = swap_header(bytes / page, page as usize, random_uuid())?;
        // Recorded before the file exists: a crash from here on still removes it (journal).
        guard.record_swap_file(path.clone());
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|source| Error::Write { path: path.clone(), value: "create".into(), source })?;
        // SAFETY: a valid open file descriptor; no pointers.
        let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, bytes as libc::off_t) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EOPNOTSUPP) {
                return Err(Error::Syscall { call: "fallocate(swap file)", source: err });
            }
            // No fallocate here: write the zeros (swapon refuses holes).
            let zeros = vec![0u8; 1 << 20];
            let mut left = bytes;
            while left > 0 {
                let n = left.min(zeros.len() as u64) as usize;
                file.write_all(&zeros[..n]).map_err(|source| Error::Write {
                    path: path.clone(),
                    value: "zeros".into(),
                    source,
                })?;
                left -= n as u64;
            }
        }
        std::os::unix::fs::FileExt::write_all_at(&file, &header, 0).map_err(|source| Error::Write {
            path: path.clone(),
            value: "swap header".into(),
            source,
        })?;
        file.sync_all().map_err(|source| Error::Write { path: path.clone(), value: "fsync".into(), source })?;
        Ok(SwapFile { path, bytes })
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl SwapSpace for SwapFile {
    fn path(&self) -> &Path {
        &self.path
    }

    fn describe(&self) -> String {
        format!("swap file {} ({} MiB)", self.path.display(), self.bytes >> 20)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_layout_matches_include_linux_swap_h() {
        let uuid = [7u8; 16];
        let h = swap_header(2560, 4096, uuid).unwrap();
        assert_eq!(h.len(), 4096);
        assert!(h[..1024].iter().all(|&b| b == 0), "bootbits are zero");
        assert_eq!(u32::from_ne_bytes(h[1024..1028].try_into().unwrap()), 1);
        assert_eq!(u32::from_ne_bytes(h[1028..1032].try_into().unwrap()), 2559);
        assert_eq!(u32::from_ne_bytes(h[1032..1036].try_into().unwrap()), 0);
        assert_eq!(&h[1036..1052], &uuid);
        assert_eq!(&h[4086..], b"SWAPSPACE2");
        assert!(h[1052..4086].iter().all(|&b| b == 0));
        let big = swap_header(16, 65536, uuid).unwrap();
        assert_eq!(&big[65526..], b"SWAPSPACE2");
    }

    #[test]
    fn header_rejects_impossible_sizes() {
        assert!(swap_header(9, 4096, [0; 16]).is_err());
        assert!(swap_header(100, 3000, [0; 16]).is_err());
        assert!(swap_header(1 << 33, 4096, [0; 16]).is_err());
    }

    #[test]
    fn proc_swaps_fixture() {
        let text = include_str!("../fixtures/swaps-6.18-firecracker.txt");
        let areas = parse_swaps(text).unwrap();
        assert_eq!(areas.len(), 2);
        assert_eq!(areas[0].path, Path::new("/tmp/swapproto/swapfile"));
        assert_eq!((areas[0].kind.as_str(), areas[0].size_kib, areas[0].used_kib), ("file", 262140, 0));
        assert_eq!(areas[0].priority, -2);
        assert_eq!(areas[1].path, Path::new("/tmp/swapproto/a dir/swap\\file"));
        assert_eq!((areas[1].size_kib, areas[1].priority), (65532, -3));
        assert!(parse_swaps("Filename Type Size Used Priority\n").unwrap().is_empty());
        assert!(parse_swaps("Filename Type Size Used Priority\n/x file big 0 -2\n").is_err());
    }

    #[test]
    fn a_swap_file_is_refused_on_tmpfs_and_for_bad_sizes() {
        let guard = SettingsGuard::new_without_signal_handler();
        let scratch = crate::private_dir::PrivateDir::new("swap-test").unwrap();
        assert!(SwapFile::create(&guard, scratch.join("bad-size"), 12345).is_err());
        assert!(SwapFile::create(&guard, scratch.join("too-small"), 4096 * 4).is_err());
        if filesystem_type(Path::new("/dev/shm")).ok() == Some(TMPFS_MAGIC) {
            let e = SwapFile::create(&guard, "/dev/shm/pw-swap-test", 1 << 20).unwrap_err();
            assert!(e.to_string().contains("tmpfs"), "{e}");
            assert!(!Path::new("/dev/shm/pw-swap-test").exists());
        }
    }
}
