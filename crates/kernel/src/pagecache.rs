//! Page cache control from user space: drop one file's cached pages (posix_fadvise
//! POSIX_FADV_DONTNEED) and, as the last resort, the kernel-wide /proc/sys/vm/drop_caches.
//!
//! Both reclaim in the caller's context, so on the CPU of the calling thread: a reclaim worker
//! pinned to a reclaim core does the work there and nowhere else.

use std::os::fd::AsRawFd;
use std::path::Path;

use crate::error::{write_file, Error, Result};

/// Drop the clean cached pages of the file at `path` (posix_fadvise(2), POSIX_FADV_DONTNEED
/// over the whole file). Dirty pages are written back first by the kernel only when they are
/// not under writeback already; what cannot be dropped stays cached. Returns the file's size.
pub fn drop_file_cache(path: &Path) -> Result<u64> {
    let file = std::fs::File::open(path).map_err(|source| Error::Read { path: path.to_path_buf(), source })?;
    let len = file.metadata().map_err(|source| Error::Read { path: path.to_path_buf(), source })?.len();
    // SAFETY: a valid open fd; offset 0, len 0 means "to the end of the file" (posix_fadvise(2)).
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    // posix_fadvise returns the error number instead of setting errno.
    if rc != 0 {
        return Err(Error::Syscall {
            call: "posix_fadvise(POSIX_FADV_DONTNEED)",
            source: std::io::Error::from_raw_os_error(rc),
        });
    }
    Ok(len)
}

/// How many bytes of the file at `path` are in the page cache now (mmap(2) + mincore(2), as
/// fincore(1) does). Mapping the file does not read it.
pub fn cached_bytes(path: &Path) -> Result<u64> {
    let file = std::fs::File::open(path).map_err(|source| Error::Read { path: path.to_path_buf(), source })?;
    let len = file.metadata().map_err(|source| Error::Read { path: path.to_path_buf(), source })?.len() as usize;
    if len == 0 {
        return Ok(0);
    }
    let page = crate::mem::page_size();
    // SAFETY: a fresh read-only shared mapping of an open file; unmapped below.
    let addr = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0) };
    if addr == libc::MAP_FAILED {
        return Err(Error::last_os("mmap(file for mincore)"));
    }
    let mut vec = vec![0u8; len.div_ceil(page)];
    // SAFETY: addr..addr+len is our mapping; vec has one byte per page of it.
    let rc = unsafe { libc::mincore(addr, len, vec.as_mut_ptr()) };
    let err = (rc != 0).then(|| Error::last_os("mincore"));
    // SAFETY: unmapping exactly what was mapped above.
    unsafe { libc::munmap(addr, len) };
    if let Some(e) = err {
        return Err(e);
    }
    Ok(vec.iter().filter(|&&b| b & 1 != 0).count() as u64 * page as u64)
}

/// What /proc/sys/vm/drop_caches frees (Documentation/admin-guide/sysctl/vm.rst).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropCaches {
    /// 1: the page cache.
    PageCache,
    /// 2: reclaimable slab objects (dentries and inodes).
    Slab,
    /// 3: both.
    Both,
}

/// Write /proc/sys/vm/drop_caches: a one-shot action, not a setting (nothing to restore).
/// Global: it frees clean cache of every cgroup, in the writer's context.
pub fn drop_caches(what: DropCaches) -> Result<()> {
    let v = match what {
        DropCaches::PageCache => "1",
        DropCaches::Slab => "2",
        DropCaches::Both => "3",
    };
    write_file("/proc/sys/vm/drop_caches", v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_a_files_cache() {
        let scratch = crate::private_dir::PrivateDir::new("pagecache-test").unwrap();
        let path = scratch.join("data");
        std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
        std::fs::File::open(&path).unwrap().sync_all().unwrap();
        let _ = std::fs::read(&path).unwrap();
        assert_eq!(cached_bytes(&path).unwrap(), 1 << 20);
        assert_eq!(drop_file_cache(&path).unwrap(), 1 << 20);
        assert_eq!(cached_bytes(&path).unwrap(), 0, "clean pages dropped");
        std::fs::remove_file(&path).unwrap();
        let err = drop_file_cache(Path::new("/nonexistent/pw")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/pw"));
    }
}
