//! A private tmpfs whose files get hugepages at first touch where a mapping asks for them.
//!
//! memfd_create(2) files live on the kernel's internal shmem mount, whose hugepage policy is
//! `/sys/kernel/mm/transparent_hugepage/shmem_enabled` — `never` on most machines, this one
//! included, and a system setting no program should change for itself. A tmpfs instance has a
//! policy of its own (`huge=advise`: a hugepage at the first touch of a 2 MiB range of a file
//! mapped with MADV_HUGEPAGE, Documentation/admin-guide/mm/transhuge.rst, "hugepages in
//! tmpfs/shmem"). Mounted with the new mount API and never attached anywhere (fsopen(2),
//! fsconfig(2), fsmount(2)), it has no path, nobody else can reach it, and it disappears with
//! its last descriptor: nothing to clean up after a crash. Mounting needs CAP_SYS_ADMIN;
//! without it [`HugeTmpfs::new`] fails and the caller keeps to memfds.
//!
//! Files are created under a name and unlinked at once, so /proc/PID/maps shows
//! `/NAME.N (deleted)`, and they are charged to the memory cgroup like a memfd's pages.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{Error, Result};

// include/uapi/linux/mount.h
const FSOPEN_CLOEXEC: libc::c_uint = 1;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const FSMOUNT_CLOEXEC: libc::c_uint = 1;
const MOUNT_ATTR_NOSUID: libc::c_uint = 0x2;
const MOUNT_ATTR_NODEV: libc::c_uint = 0x4;
const MOUNT_ATTR_NOEXEC: libc::c_uint = 0x8;

/// A detached tmpfs mount with `huge=advise` and no size limit (as the internal shmem mount
/// memfds live on: the memory cgroup is the limit).
#[derive(Debug)]
pub struct HugeTmpfs {
    root: OwnedFd,
    files: AtomicU64,
}

impl HugeTmpfs {
    pub fn new() -> Result<HugeTmpfs> {
        let fstype = CString::new("tmpfs").expect("no NUL");
        // SAFETY: fstype is a valid C string for the call's duration.
        let fs = unsafe { libc::syscall(libc::SYS_fsopen, fstype.as_ptr(), FSOPEN_CLOEXEC) };
        if fs < 0 {
            return Err(Error::last_os("fsopen(tmpfs)"));
        }
        // SAFETY: a fresh descriptor we own.
        let fs = unsafe { OwnedFd::from_raw_fd(fs as RawFd) };
        for (key, value) in [("huge", "advise"), ("size", "0"), ("nr_inodes", "0"), ("mode", "0700")] {
            set_string(&fs, key, value)?;
        }
        // SAFETY: plain fd syscall; no pointers.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                fs.as_raw_fd(),
                FSCONFIG_CMD_CREATE,
                std::ptr::null::<u8>(),
                std::ptr::null::<u8>(),
                0,
            )
        };
        if rc < 0 {
            return Err(Error::last_os("fsconfig(FSCONFIG_CMD_CREATE)"));
        }
        let attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC;
        // SAFETY: plain fd syscall; no pointers.
        let root = unsafe { libc::syscall(libc::SYS_fsmount, fs.as_raw_fd(), FSMOUNT_CLOEXEC, attrs) };
        if root < 0 {
            return Err(Error::last_os("fsmount(tmpfs)"));
        }
        // SAFETY: a fresh descriptor we own.
        Ok(HugeTmpfs { root: unsafe { OwnedFd::from_raw_fd(root as RawFd) }, files: AtomicU64::new(0) })
    }

    /// A new file of `len` bytes, already unlinked: `NAME.N`, read-write, close-on-exec.
    pub fn create(&self, name: &str, len: u64) -> Result<OwnedFd> {
        if name.is_empty() || name.contains('/') {
            return Err(Error::Invalid(format!("tmpfs file name {name:?} is empty or has a '/'")));
        }
        let n = self.files.fetch_add(1, Ordering::Relaxed);
        let path = CString::new(format!("{name}.{n}")).map_err(|_| Error::Invalid("file name contains NUL".into()))?;
        let flags = libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOFOLLOW;
        // SAFETY: path is a valid C string for the call's duration.
        let fd = unsafe { libc::openat(self.root.as_raw_fd(), path.as_ptr(), flags, 0o600) };
        if fd < 0 {
            return Err(Error::last_os("openat(tmpfs file)"));
        }
        // SAFETY: a fresh descriptor we own.
        let file = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: as above.
        if unsafe { libc::unlinkat(self.root.as_raw_fd(), path.as_ptr(), 0) } != 0 {
            return Err(Error::last_os("unlinkat(tmpfs file)"));
        }
        crate::mem::ftruncate(&file, len)?;
        Ok(file)
    }
}

fn set_string(fs: &OwnedFd, key: &str, value: &str) -> Result<()> {
    let (k, v) = (CString::new(key).expect("no NUL"), CString::new(value).expect("no NUL"));
    // SAFETY: k and v are valid C strings for the call's duration.
    let rc =
        unsafe { libc::syscall(libc::SYS_fsconfig, fs.as_raw_fd(), FSCONFIG_SET_STRING, k.as_ptr(), v.as_ptr(), 0) };
    if rc < 0 {
        return Err(Error::last_os("fsconfig(FSCONFIG_SET_STRING)"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::{self, Advice, MapOptions, Mapping, HUGE_PMD};

    /// Bytes of the mapping at `addr` that smaps shows PMD-mapped from shmem.
    fn shmem_pmd_mapped(addr: usize) -> u64 {
        let maps = crate::procfs::read_smaps(crate::procfs::Pid::SelfProcess).unwrap();
        maps.0
            .iter()
            .filter(|m| m.address.0 as usize <= addr && addr < m.address.1 as usize)
            .map(|m| m.extension.map.get("ShmemPmdMapped").copied().unwrap_or(0))
            .sum()
    }

    #[test]
    fn a_file_mapped_with_madv_hugepage_gets_hugepages_at_first_touch_and_one_without_does_not() {
        let fs = HugeTmpfs::new().expect("fsopen needs CAP_SYS_ADMIN: the tests run as root");
        let opts = MapOptions { shared: true, align: Some(HUGE_PMD), ..Default::default() };
        let advised = Mapping::of_fd(&fs.create("pw-test", 4 << 20).unwrap(), 4 << 20, 0, &opts).unwrap();
        advised.advise(Advice::HugePage).unwrap();
        let plain = Mapping::of_fd(&fs.create("pw-test", 4 << 20).unwrap(), 4 << 20, 0, &opts).unwrap();
        // SAFETY: our own shared mappings.
        unsafe {
            mem::touch_pages(advised.addr(), 4 << 20);
            mem::touch_pages(plain.addr(), 4 << 20);
        }
        assert_eq!(shmem_pmd_mapped(advised.addr()), 4 << 20);
        assert_eq!(shmem_pmd_mapped(plain.addr()), 0);
        assert!(fs.create("a/b", 1).is_err());
    }
}
