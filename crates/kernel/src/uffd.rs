//! userfaultfd(2): the API handshake, registration, and the resolving ioctls.
//!
//! Pagewise keeps its own thin binding rather than the `userfaultfd` crate because it needs
//! features that crate does not expose (UFFD_FEATURE_WP_ASYNC, MINOR_SHMEM with CONTINUE,
//! SIGBUS delivery chosen per descriptor) and because that crate folds errors of a partial copy
//! into a byte count (see STYLE.md, item 2). Constants and layouts are from
//! include/uapi/linux/userfaultfd.h; every ioctl error carries its errno.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use serde::Serialize;

use crate::error::{Error, Result};

const UFFD_API: u64 = 0xAA;
const UFFDIO: u64 = 0xAA;

const fn iowr(nr: u64, size: u64) -> u64 {
    (3 << 30) | (size << 16) | (UFFDIO << 8) | nr
}
const fn ior(nr: u64, size: u64) -> u64 {
    (2 << 30) | (size << 16) | (UFFDIO << 8) | nr
}

const UFFDIO_API: u64 = iowr(0x3F, 24);
const UFFDIO_REGISTER: u64 = iowr(0x00, 32);
const UFFDIO_UNREGISTER: u64 = ior(0x01, 16);
const UFFDIO_WAKE: u64 = ior(0x02, 16);
const UFFDIO_COPY: u64 = iowr(0x03, 40);
const UFFDIO_ZEROPAGE: u64 = iowr(0x04, 32);
const UFFDIO_WRITEPROTECT: u64 = iowr(0x06, 24);
const UFFDIO_CONTINUE: u64 = iowr(0x07, 32);
const UFFDIO_MOVE: u64 = iowr(0x05, 40);
/// `_IO(0xAA, 0x00)` on /dev/userfaultfd.
const USERFAULTFD_IOC_NEW: u64 = UFFDIO << 8;

/// Feature bits of the API handshake.
pub mod feature {
    pub const PAGEFAULT_FLAG_WP: u64 = 1 << 0;
    pub const EVENT_FORK: u64 = 1 << 1;
    pub const EVENT_REMAP: u64 = 1 << 2;
    pub const EVENT_REMOVE: u64 = 1 << 3;
    pub const MISSING_HUGETLBFS: u64 = 1 << 4;
    pub const MISSING_SHMEM: u64 = 1 << 5;
    pub const EVENT_UNMAP: u64 = 1 << 6;
    /// Deliver SIGBUS to the faulting thread instead of queueing a message (Linux 4.14).
    pub const SIGBUS: u64 = 1 << 7;
    pub const THREAD_ID: u64 = 1 << 8;
    pub const MINOR_HUGETLBFS: u64 = 1 << 9;
    /// Minor faults on shmem, resolved with UFFDIO_CONTINUE (Linux 5.14).
    pub const MINOR_SHMEM: u64 = 1 << 10;
    pub const EXACT_ADDRESS: u64 = 1 << 11;
    pub const WP_HUGETLBFS_SHMEM: u64 = 1 << 12;
    pub const WP_UNPOPULATED: u64 = 1 << 13;
    pub const POISON: u64 = 1 << 14;
    /// Write-protect faults resolved by the kernel, readable through PAGEMAP_SCAN (Linux 6.7).
    pub const WP_ASYNC: u64 = 1 << 15;
    /// UFFDIO_MOVE: move anonymous pages between registered ranges of one process without
    /// copying them (Linux 6.8).
    pub const MOVE: u64 = 1 << 16;

    /// Names of the bits, for reports.
    pub const NAMES: [(u64, &str); 17] = [
        (PAGEFAULT_FLAG_WP, "pagefault_flag_wp"),
        (EVENT_FORK, "event_fork"),
        (EVENT_REMAP, "event_remap"),
        (EVENT_REMOVE, "event_remove"),
        (MISSING_HUGETLBFS, "missing_hugetlbfs"),
        (MISSING_SHMEM, "missing_shmem"),
        (EVENT_UNMAP, "event_unmap"),
        (SIGBUS, "sigbus"),
        (THREAD_ID, "thread_id"),
        (MINOR_HUGETLBFS, "minor_hugetlbfs"),
        (MINOR_SHMEM, "minor_shmem"),
        (EXACT_ADDRESS, "exact_address"),
        (WP_HUGETLBFS_SHMEM, "wp_hugetlbfs_shmem"),
        (WP_UNPOPULATED, "wp_unpopulated"),
        (POISON, "poison"),
        (WP_ASYNC, "wp_async"),
        (MOVE, "move"),
    ];

    /// The names of the bits set in `bits`.
    pub fn names(bits: u64) -> Vec<&'static str> {
        NAMES.iter().filter(|(b, _)| bits & b != 0).map(|(_, n)| *n).collect()
    }
}

/// Registration modes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegisterMode {
    pub missing: bool,
    pub write_protect: bool,
    pub minor: bool,
}

impl RegisterMode {
    fn raw(self) -> u64 {
        (self.missing as u64) | ((self.write_protect as u64) << 1) | ((self.minor as u64) << 2)
    }
}

#[repr(C)]
#[derive(Default)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

/// Same layout as UffdioCopy (`move` in place of `copy`).
type UffdioMove = UffdioCopy;

#[repr(C)]
#[derive(Default)]
struct UffdioZeropage {
    range: UffdioRange,
    mode: u64,
    zeropage: i64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioContinue {
    range: UffdioRange,
    mode: u64,
    mapped: i64,
}

/// `struct uffd_msg`: 32 bytes.
#[repr(C)]
#[derive(Clone, Copy)]
struct UffdMsg {
    event: u8,
    reserved1: u8,
    reserved2: u16,
    reserved3: u32,
    arg: [u64; 3],
}

const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
const UFFD_EVENT_FORK: u8 = 0x13;
const UFFD_EVENT_REMAP: u8 = 0x14;
const UFFD_EVENT_REMOVE: u8 = 0x15;
const UFFD_EVENT_UNMAP: u8 = 0x16;

const FLAG_WRITE: u64 = 1;
const FLAG_WP: u64 = 2;
const FLAG_MINOR: u64 = 4;

/// An event read from a userfaultfd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    Pagefault { addr: usize, write: bool, wp: bool, minor: bool, thread_id: u32 },
    Fork { uffd: RawFd },
    Remap { from: usize, to: usize, len: usize },
    Remove { start: usize, end: usize },
    Unmap { start: usize, end: usize },
    Unknown(u8),
}

/// What the kernel offers, from an API handshake with no features requested.
#[derive(Clone, Debug, Serialize)]
pub struct ApiInfo {
    pub features: u64,
    pub ioctls: u64,
    pub feature_names: Vec<&'static str>,
}

/// An open, handshaken userfaultfd.
#[derive(Debug)]
pub struct Uffd {
    fd: OwnedFd,
    features: u64,
}

/// How to open a userfaultfd.
#[derive(Clone, Copy, Debug, Default)]
pub struct UffdBuilder {
    features: u64,
    nonblocking: bool,
    user_mode_only: bool,
}

impl UffdBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Require these `feature::*` bits; [`UffdBuilder::open`] fails naming any the kernel lacks.
    pub fn require(mut self, features: u64) -> Self {
        self.features |= features;
        self
    }

    /// Ask for these `feature::*` bits where the kernel has them ([`Uffd::has`] tells).
    pub fn want(mut self, features: u64) -> Self {
        self.features |= features & api_info().map_or(0, |i| i.features);
        self
    }

    pub fn nonblocking(mut self, yes: bool) -> Self {
        self.nonblocking = yes;
        self
    }

    /// Handle user-mode faults only (needed for unprivileged use when
    /// vm.unprivileged_userfaultfd=0 but the process lacks CAP_SYS_PTRACE).
    pub fn user_mode_only(mut self, yes: bool) -> Self {
        self.user_mode_only = yes;
        self
    }

    pub fn open(self) -> Result<Uffd> {
        let fd = open_raw(self.nonblocking, self.user_mode_only)?;
        let mut api = UffdioApi { api: UFFD_API, features: self.features, ioctls: 0 };
        // SAFETY: fd is a fresh userfaultfd; api is a properly sized uffdio_api.
        if unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API as _, &mut api) } != 0 {
            let err = Error::last_os("ioctl(UFFDIO_API)");
            // EINVAL here means a requested feature is missing: say which.
            if let Ok(info) = api_info() {
                let missing = self.features & !info.features;
                if missing != 0 {
                    return Err(Error::Invalid(format!(
                        "userfaultfd lacks required features: {}",
                        feature::names(missing).join(", ")
                    )));
                }
            }
            return Err(err);
        }
        Ok(Uffd { fd, features: api.features })
    }
}

fn open_raw(nonblocking: bool, user_mode_only: bool) -> Result<OwnedFd> {
    let mut flags = libc::O_CLOEXEC;
    if nonblocking {
        flags |= libc::O_NONBLOCK;
    }
    if user_mode_only {
        flags |= 1; // UFFD_USER_MODE_ONLY
    }
    // SAFETY: plain syscall returning a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
    if fd >= 0 {
        // SAFETY: fd is fresh and ours.
        return Ok(crate::fd::out_of_the_way(unsafe { OwnedFd::from_raw_fd(fd as RawFd) }));
    }
    let syscall_err = Error::last_os("userfaultfd");
    // /dev/userfaultfd (Linux 6.1) is the other way in, governed by file permissions.
    let Ok(dev) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/userfaultfd") else {
        return Err(syscall_err);
    };
    // SAFETY: USERFAULTFD_IOC_NEW takes the flags by value and returns a new fd.
    let fd = unsafe { libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW as _, flags) };
    if fd < 0 {
        return Err(Error::last_os("ioctl(/dev/userfaultfd, USERFAULTFD_IOC_NEW)"));
    }
    // SAFETY: fd is fresh and ours.
    Ok(crate::fd::out_of_the_way(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Whether this process may open a userfaultfd that also serves the faults the kernel takes on
/// its behalf (a read(2) into a registered range): one without UFFD_USER_MODE_ONLY. With
/// vm.unprivileged_userfaultfd = 0 that takes CAP_SYS_PTRACE, or read-write access to
/// /dev/userfaultfd (Linux 6.1); otherwise only a user-mode-only descriptor opens, and the
/// kernel's own accesses to a missing page fail with EFAULT.
pub fn serves_kernel_faults() -> Result<()> {
    open_raw(false, false).map(drop)
}

/// The features and ioctls this kernel's userfaultfd offers (a handshake on a throwaway fd).
pub fn api_info() -> Result<ApiInfo> {
    let fd = open_raw(false, false)?;
    let mut api = UffdioApi { api: UFFD_API, features: 0, ioctls: 0 };
    // SAFETY: as in UffdBuilder::open.
    if unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API as _, &mut api) } != 0 {
        return Err(Error::last_os("ioctl(UFFDIO_API)"));
    }
    Ok(ApiInfo { features: api.features, ioctls: api.ioctls, feature_names: feature::names(api.features) })
}

fn check(rc: libc::c_int, call: &'static str) -> Result<()> {
    if rc != 0 {
        return Err(Error::last_os(call));
    }
    Ok(())
}

/// Moves the kernel refused with EEXIST after making them (`Uffd::move_pages`), in this process.
static MOVES_REFUSED_YET_MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many UFFDIO_MOVE calls in this process the kernel refused (EEXIST) after moving their
/// pages, which [`Uffd::move_pages`] then counted as moved.
pub fn moves_refused_yet_made() -> u64 {
    MOVES_REFUSED_YET_MADE.load(std::sync::atomic::Ordering::Relaxed)
}

/// Bytes at the start of a refused move `[src, src + len)` → `[dst, dst + len)` whose pages are
/// at the destination and gone from the source (mincore(2) of both, 256 pages at a time, on
/// the stack: a move may be made in a signal handler), up to where either range is not mapped
/// (mincore's ENOMEM): from there the refusal stands.
fn moved_though_refused(dst: usize, src: usize, len: usize) -> usize {
    let page = crate::mem::page_size();
    let (mut at_dst, mut at_src) = ([0u8; 256], [0u8; 256]);
    let mut moved = 0;
    while moved < len {
        let n = ((len - moved) / page).clamp(1, 256);
        let (d, s) = (&mut at_dst[..n], &mut at_src[..n]);
        if crate::mem::mincore(dst + moved, n * page, d).is_err()
            || crate::mem::mincore(src + moved, n * page, s).is_err()
        {
            break;
        }
        let pages = moved_pages(s, d);
        moved += pages * page;
        if pages < n {
            break;
        }
    }
    moved
}

/// Pages at the start of a range that are present at the destination and absent at the
/// source, given mincore(2)'s vectors of both.
fn moved_pages(at_src: &[u8], at_dst: &[u8]) -> usize {
    at_src.iter().zip(at_dst).take_while(|&(s, d)| s & 1 == 0 && d & 1 != 0).count()
}

impl Uffd {
    /// The features granted by the handshake.
    pub fn features(&self) -> u64 {
        self.features
    }

    pub fn has(&self, feature: u64) -> bool {
        self.features & feature == feature
    }

    /// Register `[addr, addr+len)`; returns the ioctl bitmask allowed on it.
    pub fn register(&self, addr: usize, len: usize, mode: RegisterMode) -> Result<u64> {
        let mut reg =
            UffdioRegister { range: UffdioRange { start: addr as u64, len: len as u64 }, mode: mode.raw(), ioctls: 0 };
        // SAFETY: reg is a valid uffdio_register; registration changes fault behaviour only.
        check(unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_REGISTER as _, &mut reg) }, "ioctl(UFFDIO_REGISTER)")?;
        Ok(reg.ioctls)
    }

    pub fn unregister(&self, addr: usize, len: usize) -> Result<()> {
        let mut range = UffdioRange { start: addr as u64, len: len as u64 };
        // SAFETY: valid uffdio_range.
        check(
            unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_UNREGISTER as _, &mut range) },
            "ioctl(UFFDIO_UNREGISTER)",
        )
    }

    /// Wake threads waiting on faults in the range (after resolving with DONTWAKE).
    pub fn wake(&self, addr: usize, len: usize) -> Result<()> {
        let mut range = UffdioRange { start: addr as u64, len: len as u64 };
        // SAFETY: valid uffdio_range.
        check(unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_WAKE as _, &mut range) }, "ioctl(UFFDIO_WAKE)")
    }

    /// Atomically fill missing pages `[dst, dst+len)` with a copy of `src`.
    /// `write_protect` installs the pages write-protected (dirty tracking); `wake` wakes the
    /// faulting threads. EEXIST (already filled by a racing copy) is returned as an error;
    /// callers that race decide whether that is fine.
    ///
    /// # Safety
    /// `src` must be readable for `len` bytes.
    pub unsafe fn copy(
        &self,
        dst: usize,
        src: *const u8,
        len: usize,
        write_protect: bool,
        wake: bool,
    ) -> Result<usize> {
        let mut c = UffdioCopy {
            dst: dst as u64,
            src: src as u64,
            len: len as u64,
            mode: (!wake as u64) | ((write_protect as u64) << 1),
            copy: 0,
        };
        // SAFETY: c is a valid uffdio_copy and the caller guarantees src is readable.
        check(unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_COPY as _, &mut c) }, "ioctl(UFFDIO_COPY)")?;
        Ok(c.copy as usize)
    }

    /// Move the anonymous pages of `[src, src+len)` to the missing range `[dst, dst+len)`
    /// without copying them (UFFDIO_MOVE, needs [`feature::MOVE`]); `dst` must be registered
    /// with this userfaultfd, both ranges private anonymous and writable, and the pages not
    /// shared (a fork's copy-on-write pages fail with EBUSY). The pages arrive writable
    /// (mm/userfaultfd.c builds the new entry with pte_mkwrite): write-protect them after, if
    /// needed. `allow_src_holes`: pages missing in the source leave holes (else ENOENT).
    /// EAGAIN (a page briefly locked) is retried for the rest of the range.
    ///
    /// Pages found at the destination and gone from the source after the kernel refused with
    /// EEXIST count as moved (`moved_though_refused`): Linux 6.18 has been seen to move pages
    /// and then refuse them — the same page frames at the destination (/proc/self/pagemap),
    /// EEXIST, nothing counted moved — rarely, under load (once in three or four 7-Zip runs
    /// paging through DLM with two more beside them; docs/dlm.md). A caller moving with holes
    /// allowed clears the destination first, or a hole over a page already there counts as
    /// moved too.
    pub fn move_pages(&self, dst: usize, src: usize, len: usize, wake: bool, allow_src_holes: bool) -> Result<()> {
        self.move_pages_reporting(dst, src, len, wake, allow_src_holes).map_err(|(_, err)| err)
    }

    /// [`Uffd::move_pages`], telling on failure how many bytes from the start of the range
    /// were moved before it: those pages are at their destination, the rest at their source.
    pub fn move_pages_reporting(
        &self,
        dst: usize,
        src: usize,
        len: usize,
        wake: bool,
        allow_src_holes: bool,
    ) -> std::result::Result<(), (usize, Error)> {
        let mut done = 0;
        let mut retries = 0;
        while done < len {
            let mut m = UffdioMove {
                dst: (dst + done) as u64,
                src: (src + done) as u64,
                len: (len - done) as u64,
                mode: (!wake as u64) | ((allow_src_holes as u64) << 1),
                copy: 0,
            };
            // SAFETY: m is a valid uffdio_move; the kernel checks both ranges.
            if unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_MOVE as _, &mut m) } == 0 {
                return Ok(());
            }
            let err = Error::last_os("ioctl(UFFDIO_MOVE)");
            if err.errno() == Some(libc::EEXIST) {
                let moved = moved_though_refused(dst + done, src + done, len - done);
                if moved > 0 {
                    // A refusal wakes nobody (fs/userfaultfd.c wakes only what it counts moved).
                    if wake {
                        self.wake(dst + done, moved).map_err(|e| (done, e))?;
                    }
                    MOVES_REFUSED_YET_MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    done += moved;
                    continue;
                }
            }
            retries += 1;
            if err.errno() != Some(libc::EAGAIN) || retries > 1000 {
                return Err((done, err));
            }
            // A call that moved part of the range before meeting a failure returns EAGAIN
            // with the bytes moved (mm/userfaultfd.c, move_pages); the next call meets it.
            done += m.copy.max(0) as usize;
        }
        Ok(())
    }

    /// Map zero pages into a missing range.
    pub fn zeropage(&self, addr: usize, len: usize, wake: bool) -> Result<()> {
        let mut z = UffdioZeropage {
            range: UffdioRange { start: addr as u64, len: len as u64 },
            mode: !wake as u64,
            zeropage: 0,
        };
        // SAFETY: valid uffdio_zeropage.
        check(unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_ZEROPAGE as _, &mut z) }, "ioctl(UFFDIO_ZEROPAGE)")
    }

    /// Resolve minor faults: map the page-cache pages already backing the range.
    pub fn continue_range(&self, addr: usize, len: usize, wake: bool) -> Result<()> {
        let mut c = UffdioContinue {
            range: UffdioRange { start: addr as u64, len: len as u64 },
            mode: !wake as u64,
            mapped: 0,
        };
        // SAFETY: valid uffdio_continue.
        check(unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_CONTINUE as _, &mut c) }, "ioctl(UFFDIO_CONTINUE)")
    }

    /// Like [`Uffd::continue_range`], optionally mapping the pages write-protected
    /// (UFFDIO_CONTINUE_MODE_WP, Linux 6.4; the range must be registered for MINOR and WP).
    pub fn continue_wp(&self, addr: usize, len: usize, write_protect: bool, wake: bool) -> Result<()> {
        let mut c = UffdioContinue {
            range: UffdioRange { start: addr as u64, len: len as u64 },
            mode: (!wake as u64) | ((write_protect as u64) << 1),
            mapped: 0,
        };
        // SAFETY: valid uffdio_continue.
        check(unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_CONTINUE as _, &mut c) }, "ioctl(UFFDIO_CONTINUE)")
    }

    /// Set (`protect`) or clear write protection on a registered range.
    pub fn write_protect(&self, addr: usize, len: usize, protect: bool, wake: bool) -> Result<()> {
        let mut w = UffdioWriteprotect {
            range: UffdioRange { start: addr as u64, len: len as u64 },
            mode: (protect as u64) | ((!wake as u64) << 1),
        };
        // SAFETY: valid uffdio_writeprotect.
        check(
            unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_WRITEPROTECT as _, &mut w) },
            "ioctl(UFFDIO_WRITEPROTECT)",
        )
    }

    /// Read one event; `Ok(None)` when the descriptor is non-blocking and nothing is queued.
    pub fn read_event(&self) -> Result<Option<Event>> {
        let mut msg = std::mem::MaybeUninit::<UffdMsg>::uninit();
        let size = std::mem::size_of::<UffdMsg>();
        // SAFETY: reading at most size bytes into msg's storage.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), msg.as_mut_ptr() as *mut libc::c_void, size) };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EAGAIN) {
                return Ok(None);
            }
            return Err(Error::Syscall { call: "read(userfaultfd)", source: err });
        }
        if n as usize != size {
            return Err(Error::parse("uffd_msg", format!("short read of {n} bytes")));
        }
        // SAFETY: the kernel wrote a whole uffd_msg.
        let msg = unsafe { msg.assume_init() };
        Ok(Some(decode(&msg)))
    }
}

fn decode(msg: &UffdMsg) -> Event {
    match msg.event {
        UFFD_EVENT_PAGEFAULT => Event::Pagefault {
            addr: msg.arg[1] as usize,
            write: msg.arg[0] & FLAG_WRITE != 0,
            wp: msg.arg[0] & FLAG_WP != 0,
            minor: msg.arg[0] & FLAG_MINOR != 0,
            thread_id: msg.arg[2] as u32,
        },
        UFFD_EVENT_FORK => Event::Fork { uffd: msg.arg[0] as u32 as RawFd },
        UFFD_EVENT_REMAP => {
            Event::Remap { from: msg.arg[0] as usize, to: msg.arg[1] as usize, len: msg.arg[2] as usize }
        }
        UFFD_EVENT_REMOVE => Event::Remove { start: msg.arg[0] as usize, end: msg.arg[1] as usize },
        UFFD_EVENT_UNMAP => Event::Unmap { start: msg.arg[0] as usize, end: msg.arg[1] as usize },
        other => Event::Unknown(other),
    }
}

/// UFFDIO_CONTINUE on a raw userfaultfd descriptor, for use inside a signal handler
/// (UFFD_FEATURE_SIGBUS delivery): no allocation, no locks, returns 0 or the errno.
pub fn continue_raw(fd: RawFd, addr: usize, len: usize, wake: bool) -> i32 {
    let mut c =
        UffdioContinue { range: UffdioRange { start: addr as u64, len: len as u64 }, mode: !wake as u64, mapped: 0 };
    // SAFETY: c is a valid uffdio_continue; ioctl(2) is async-signal-safe.
    if unsafe { libc::ioctl(fd, UFFDIO_CONTINUE as _, &mut c) } == 0 {
        return 0;
    }
    // SAFETY: reading this thread's errno right after the call.
    unsafe { *libc::__errno_location() }
}

impl AsRawFd for Uffd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for Uffd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::{MapOptions, Mapping};

    fn uffd_or_skip(features: u64) -> Option<Uffd> {
        match UffdBuilder::new().require(features).open() {
            Ok(u) => Some(u),
            Err(e) => {
                crate::testing::skip(format!("userfaultfd unavailable: {e}"));
                None
            }
        }
    }

    #[test]
    fn struct_sizes_match_the_uapi() {
        assert_eq!(std::mem::size_of::<UffdMsg>(), 32);
        assert_eq!(std::mem::size_of::<UffdioCopy>(), 40);
        assert_eq!(std::mem::size_of::<UffdioRegister>(), 32);
        assert_eq!(std::mem::size_of::<UffdioContinue>(), 32);
    }

    #[test]
    fn missing_fault_served_by_a_handler_thread() {
        let Some(uffd) = uffd_or_skip(0) else { return };
        let len = 16 * 4096;
        let m = Mapping::anonymous(len, &MapOptions::default()).unwrap();
        uffd.register(m.addr(), len, RegisterMode { missing: true, ..Default::default() }).unwrap();
        let base = m.addr();
        let handler = std::thread::spawn(move || {
            let page = vec![0xABu8; 4096];
            let Some(Event::Pagefault { addr, .. }) = uffd.read_event().unwrap() else { panic!("not a fault") };
            let page_addr = addr & !4095;
            // SAFETY: page is 4096 readable bytes.
            unsafe { uffd.copy(page_addr, page.as_ptr(), 4096, false, true).unwrap() };
            page_addr - base
        });
        // SAFETY: reading our own mapping; the fault is served by the handler.
        let v = unsafe { std::ptr::read_volatile((base + 5 * 4096 + 10) as *const u8) };
        assert_eq!(v, 0xAB);
        assert_eq!(handler.join().unwrap(), 5 * 4096);
    }

    #[test]
    fn minor_fault_continued_write_protected() {
        let Some(uffd) = uffd_or_skip(feature::MINOR_SHMEM | feature::WP_HUGETLBFS_SHMEM | feature::PAGEFAULT_FLAG_WP)
        else {
            return;
        };
        let len = 4 * 4096;
        let fd = crate::mem::memfd_create("continue-wp-test", None).unwrap();
        crate::mem::ftruncate(&fd, len as u64).unwrap();
        let shared = MapOptions { shared: true, ..Default::default() };
        let view = Mapping::of_fd(&fd, len, 0, &shared).unwrap();
        let alias = Mapping::of_fd(&fd, len, 0, &shared).unwrap();
        let mode = RegisterMode { missing: true, write_protect: true, minor: true };
        uffd.register(view.addr(), len, mode).unwrap();
        // Fill the page cache through the unregistered alias, then map it in the view, protected.
        // SAFETY: the alias is ours and read-write.
        unsafe { std::ptr::write_bytes((alias.addr() + 4096) as *mut u8, 0x5A, 4096) };
        uffd.continue_wp(view.addr() + 4096, 4096, true, true).unwrap();
        // SAFETY: mapped above: no fault.
        assert_eq!(unsafe { std::ptr::read_volatile((view.addr() + 4096 + 7) as *const u8) }, 0x5A);
        let target = view.addr() + 4096 + 9;
        let writer = std::thread::spawn(move || {
            // SAFETY: the view is ours; the write waits for the WP fault to be resolved.
            unsafe { std::ptr::write_volatile(target as *mut u8, 0x11) };
        });
        let Some(Event::Pagefault { addr, wp, .. }) = uffd.read_event().unwrap() else { panic!("not a fault") };
        assert!(wp, "a write to a page continued with MODE_WP is a WP fault");
        assert_eq!(addr & !4095, view.addr() + 4096);
        uffd.write_protect(view.addr() + 4096, 4096, false, true).unwrap();
        writer.join().unwrap();
        // SAFETY: the alias maps the same page.
        assert_eq!(unsafe { std::ptr::read_volatile((alias.addr() + 4096 + 9) as *const u8) }, 0x11);
    }

    /// For the UFFDIO_MOVE tests: a userfaultfd, a source of `len` bytes filled with `fill`, and
    /// an empty destination registered with it (None: skipped).
    fn move_source_and_destination(len: usize, fill: u8) -> Option<(Uffd, Mapping, Mapping)> {
        let uffd = uffd_or_skip(feature::MOVE | feature::PAGEFAULT_FLAG_WP)?;
        let opts = MapOptions::default();
        let src = Mapping::anonymous(len, &opts).unwrap();
        let dst = Mapping::anonymous(len, &opts).unwrap();
        uffd.register(dst.addr(), len, RegisterMode { missing: true, write_protect: true, minor: false }).unwrap();
        // SAFETY: src is ours and read-write.
        unsafe { std::ptr::write_bytes(src.addr() as *mut u8, fill, len) };
        Some((uffd, src, dst))
    }

    #[test]
    fn moved_pages_keep_their_bytes_and_leave_the_source_empty() {
        let len = 4 * 4096;
        let Some((uffd, src, dst)) = move_source_and_destination(len, 0x3C) else {
            return;
        };
        uffd.move_pages(dst.addr(), src.addr(), len, true, false).unwrap();
        // SAFETY: dst now maps the moved pages: no fault.
        assert_eq!(unsafe { std::ptr::read_volatile((dst.addr() + len - 1) as *const u8) }, 0x3C);
        // The source is empty: its next touch is a fresh zero page.
        // SAFETY: src is ours (not registered: an ordinary fault).
        assert_eq!(unsafe { std::ptr::read_volatile((src.addr() + 5) as *const u8) }, 0);
        // Moving onto a present page is refused.
        let err = uffd.move_pages(dst.addr(), src.addr(), 4096, true, true).unwrap_err();
        assert!(err.to_string().contains("UFFDIO_MOVE"), "{err}");
    }

    #[test]
    fn a_move_whose_pages_are_already_at_the_destination_is_done() {
        let len = 4 * 4096;
        let Some((uffd, src, dst)) = move_source_and_destination(len, 0x5A) else {
            return;
        };
        // The first half moved already (what the kernel does before refusing, see move_pages).
        uffd.move_pages(dst.addr(), src.addr(), len / 2, true, false).unwrap();
        let before = moves_refused_yet_made();
        uffd.move_pages(dst.addr(), src.addr(), len, true, false).unwrap();
        // More than one where the kernel misreported a move of another test meanwhile.
        assert!(moves_refused_yet_made() > before);
        let mut present = [0u8; 4];
        crate::mem::mincore(src.addr(), len, &mut present).unwrap();
        assert_eq!(present.map(|p| p & 1), [0; 4], "the source is empty");
        // SAFETY: dst maps the moved pages.
        assert_eq!(unsafe { std::ptr::read_volatile((dst.addr() + len - 1) as *const u8) }, 0x5A);
    }

    #[test]
    fn only_the_leading_pages_at_the_destination_and_gone_from_the_source_count_as_moved() {
        assert_eq!(moved_pages(&[0, 0, 1], &[1, 1, 0]), 2);
        assert_eq!(moved_pages(&[1, 0], &[1, 1]), 0, "at both: a genuine refusal");
        assert_eq!(moved_pages(&[0, 0], &[0, 1]), 0, "at neither");
        assert_eq!(moved_pages(&[0, 0], &[1, 0]), 1);
        assert_eq!(moved_pages(&[], &[]), 0);
    }

    #[test]
    fn api_info_lists_features_by_name() {
        let info = match api_info() {
            Ok(i) => i,
            Err(e) => return crate::testing::skip(format!("userfaultfd unavailable: {e}")),
        };
        assert_eq!(
            info.feature_names.len(),
            info.features.count_ones() as usize - (info.features >> 17).count_ones() as usize
        );
    }

    #[test]
    fn unknown_feature_request_names_it() {
        let err = UffdBuilder::new().require(1 << 62).open().unwrap_err();
        assert!(err.to_string().contains("userfaultfd"), "{err}");
    }
}
