//! Virtual memory: mappings, advice, locking, memfd and process_madvise.
//!
//! Preconditions shared by every function here: lengths are non-zero and addresses are
//! page-aligned; both are checked before the syscall and rejected with [`Error::Invalid`].
//!
//! mmap, munmap, mremap, mprotect and madvise are made as raw system calls (`sys`), never
//! through libc's wrappers: under `pagewise run` and `pagewise hps run` those wrappers are the
//! preload shim's (preload/shim.c), which gives calls on Pagewise's areas the meaning Linux
//! gives them for the program — and Pagewise's own calls on the memory behind those areas must
//! reach the kernel as they are.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;

use crate::error::{Error, Result};

/// The base page size of this machine (4 KiB on x86-64).
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size <= 0 {
        4096
    } else {
        size as usize
    }
}

/// The PMD (transparent hugepage) size: 2 MiB on x86-64.
pub const HUGE_PMD: usize = 2 << 20;

/// Round `value` up to a multiple of `align` (a power of two).
pub fn align_up(value: usize, align: usize) -> usize {
    debug_assert!(align.is_power_of_two());
    (value + align - 1) & !(align - 1)
}

/// Round `value` down to a multiple of `align` (a power of two).
pub fn align_down(value: usize, align: usize) -> usize {
    debug_assert!(align.is_power_of_two());
    value & !(align - 1)
}

/// madvise(2) advice values Pagewise uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Advice {
    Normal,
    Random,
    Sequential,
    WillNeed,
    /// Drop the pages; anonymous private memory reads back as zero, shared memory keeps its data.
    DontNeed,
    /// Free the backing store of shared memory (punch a hole).
    Remove,
    HugePage,
    NoHugePage,
    /// Synchronous collapse into PMD hugepages (Linux 6.1).
    Collapse,
    /// Deactivate the pages (Linux 5.4).
    Cold,
    /// Reclaim the pages now (Linux 5.4).
    PageOut,
    /// Populate page tables, readable (Linux 5.14).
    PopulateRead,
    /// Populate page tables, writable (Linux 5.14).
    PopulateWrite,
    /// MADV_DONTFORK: a child made by fork(2) does not get the range.
    DontFork,
    /// MADV_DOFORK: undo MADV_DONTFORK.
    DoFork,
}

/// `MADV_COLLAPSE`; libc may not carry it yet. From include/uapi/asm-generic/mman-common.h.
pub const MADV_COLLAPSE: libc::c_int = 25;

impl Advice {
    /// The raw `MADV_*` value.
    pub fn raw(self) -> libc::c_int {
        match self {
            Advice::Normal => libc::MADV_NORMAL,
            Advice::Random => libc::MADV_RANDOM,
            Advice::Sequential => libc::MADV_SEQUENTIAL,
            Advice::WillNeed => libc::MADV_WILLNEED,
            Advice::DontNeed => libc::MADV_DONTNEED,
            Advice::Remove => libc::MADV_REMOVE,
            Advice::HugePage => libc::MADV_HUGEPAGE,
            Advice::NoHugePage => libc::MADV_NOHUGEPAGE,
            Advice::Collapse => MADV_COLLAPSE,
            Advice::Cold => 20,
            Advice::PageOut => 21,
            Advice::PopulateRead => 22,
            Advice::PopulateWrite => 23,
            Advice::DontFork => libc::MADV_DONTFORK,
            Advice::DoFork => libc::MADV_DOFORK,
        }
    }

    fn call_name(self) -> &'static str {
        match self {
            Advice::Normal => "madvise(MADV_NORMAL)",
            Advice::Random => "madvise(MADV_RANDOM)",
            Advice::Sequential => "madvise(MADV_SEQUENTIAL)",
            Advice::WillNeed => "madvise(MADV_WILLNEED)",
            Advice::DontNeed => "madvise(MADV_DONTNEED)",
            Advice::Remove => "madvise(MADV_REMOVE)",
            Advice::HugePage => "madvise(MADV_HUGEPAGE)",
            Advice::NoHugePage => "madvise(MADV_NOHUGEPAGE)",
            Advice::Collapse => "madvise(MADV_COLLAPSE)",
            Advice::Cold => "madvise(MADV_COLD)",
            Advice::PageOut => "madvise(MADV_PAGEOUT)",
            Advice::PopulateRead => "madvise(MADV_POPULATE_READ)",
            Advice::PopulateWrite => "madvise(MADV_POPULATE_WRITE)",
            Advice::DontFork => "madvise(MADV_DONTFORK)",
            Advice::DoFork => "madvise(MADV_DOFORK)",
        }
    }
}

fn check_range(addr: usize, len: usize) -> Result<()> {
    if len == 0 {
        return Err(Error::Invalid("zero-length memory range".into()));
    }
    if !addr.is_multiple_of(page_size()) {
        return Err(Error::Invalid(format!("address {addr:#x} is not page-aligned")));
    }
    Ok(())
}

/// madvise(2) on a range of this process.
///
/// Advice never invalidates Rust references by itself, except `DontNeed`/`Remove` which change
/// the contents the range reads back; callers own that contract for the memory they pass.
pub fn madvise(addr: usize, len: usize, advice: Advice) -> Result<()> {
    check_range(addr, len)?;
    // SAFETY: madvise only changes kernel bookkeeping for [addr, addr+len); an unmapped range
    // gives ENOMEM, not undefined behaviour. Content-changing advice is the caller's contract.
    let rc = unsafe { sys::madvise(addr, len, advice.raw()) };
    if rc != 0 {
        return Err(Error::last_os(advice.call_name()));
    }
    Ok(())
}

/// mprotect(2) protections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protection {
    None,
    Read,
    ReadWrite,
}

impl Protection {
    fn raw(self) -> libc::c_int {
        match self {
            Protection::None => libc::PROT_NONE,
            Protection::Read => libc::PROT_READ,
            Protection::ReadWrite => libc::PROT_READ | libc::PROT_WRITE,
        }
    }
}

/// mprotect(2) on a range of this process.
pub fn mprotect(addr: usize, len: usize, prot: Protection) -> Result<()> {
    check_range(addr, len)?;
    // SAFETY: changes only access rights; misuse faults, it does not corrupt memory.
    let rc = unsafe { sys::mprotect(addr, len, prot.raw()) };
    if rc != 0 {
        return Err(Error::last_os("mprotect"));
    }
    Ok(())
}

/// munmap(2) of a range of this process.
///
/// # Safety
/// Nothing may use `[addr, addr + len)` afterwards, and no [`Mapping`] may own any of it (its
/// drop would unmap whatever is mapped there later).
pub unsafe fn munmap(addr: usize, len: usize) -> Result<()> {
    check_range(addr, len)?;
    // SAFETY: the caller gives up the range.
    if unsafe { sys::munmap(addr, len) } != 0 {
        return Err(Error::last_os("munmap"));
    }
    Ok(())
}

/// Move the pages and page tables of `[from, from + len)` to `[to, to + len)`, replacing what
/// was mapped there, in one step (mremap(2) with MREMAP_MAYMOVE | MREMAP_FIXED): a thread
/// touching the target sees the old mapping or the new one, never a gap. `from` is left
/// unmapped.
///
/// # Safety
/// The caller owns both ranges: `from` is a mapping nothing else uses (and no [`Mapping`]
/// owns any more), `to` is theirs to replace.
pub unsafe fn move_mapping(from: usize, to: usize, len: usize) -> Result<()> {
    check_range(from, len)?;
    check_range(to, len)?;
    // SAFETY: upheld by the caller.
    if unsafe { sys::mremap(from, len, len, libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED, to) } == libc::MAP_FAILED {
        return Err(Error::last_os("mremap(MREMAP_FIXED)"));
    }
    Ok(())
}

/// Map the shared pages of `[from, from + len)` a second time at `[to, to + len)`, replacing
/// what was mapped there, in one step (mremap(2) with an old size of zero: "a new mapping of
/// the same pages"): a thread touching the target sees the old mapping or the new one, never a
/// gap. `from` stays mapped. Private memory cannot be mapped twice (EINVAL).
///
/// # Safety
/// `from` is a MAP_SHARED mapping of the caller's; `to` is theirs to replace.
pub unsafe fn map_shared_again(from: usize, to: usize, len: usize) -> Result<()> {
    check_range(from, len)?;
    check_range(to, len)?;
    // SAFETY: upheld by the caller.
    if unsafe { sys::mremap(from, 0, len, libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED, to) } == libc::MAP_FAILED {
        return Err(Error::last_os("mremap(old size 0, MREMAP_FIXED)"));
    }
    Ok(())
}

/// The memory system calls, made directly (module doc: why not libc's wrappers).
mod sys {
    // SAFETY (all): thin system-call wrappers with the system calls' own contracts, which
    // their callers uphold.
    pub(super) unsafe fn mmap(
        addr: *mut libc::c_void,
        len: usize,
        prot: libc::c_int,
        flags: libc::c_int,
        fd: libc::c_int,
        off: libc::off_t,
    ) -> *mut libc::c_void {
        // SAFETY: see the module.
        unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) as *mut libc::c_void }
    }

    pub(super) unsafe fn munmap(addr: usize, len: usize) -> libc::c_int {
        // SAFETY: see the module.
        unsafe { libc::syscall(libc::SYS_munmap, addr, len) as libc::c_int }
    }

    pub(super) unsafe fn mremap(
        old: usize,
        old_len: usize,
        new_len: usize,
        flags: libc::c_int,
        new: usize,
    ) -> *mut libc::c_void {
        // SAFETY: see the module.
        unsafe { libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, new) as *mut libc::c_void }
    }

    pub(super) unsafe fn madvise(addr: usize, len: usize, advice: libc::c_int) -> libc::c_int {
        // SAFETY: see the module.
        unsafe { libc::syscall(libc::SYS_madvise, addr, len, advice) as libc::c_int }
    }

    pub(super) unsafe fn mprotect(addr: usize, len: usize, prot: libc::c_int) -> libc::c_int {
        // SAFETY: see the module.
        unsafe { libc::syscall(libc::SYS_mprotect, addr, len, prot) as libc::c_int }
    }
}

/// Options of a new mapping.
#[derive(Clone, Debug, Default)]
pub struct MapOptions {
    /// MAP_SHARED instead of MAP_PRIVATE.
    pub shared: bool,
    /// MAP_POPULATE: fault everything in now.
    pub populate: bool,
    /// MAP_NORESERVE.
    pub noreserve: bool,
    /// MAP_HUGETLB with this page size in bytes (2 MiB, 1 GiB).
    pub hugetlb: Option<usize>,
    /// Start address aligned to this power of two (over-map and trim).
    pub align: Option<usize>,
    /// Start with PROT_NONE instead of read/write.
    pub no_access: bool,
}

/// An owned mapping, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a Mapping is plain memory owned by the process; it has no thread affinity.
unsafe impl Send for Mapping {}
// SAFETY: shared access goes through raw pointers whose synchronisation is the user's.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// An anonymous mapping of `len` bytes.
    pub fn anonymous(len: usize, opts: &MapOptions) -> Result<Self> {
        Self::map(len, opts, None, 0, None)
    }

    /// An anonymous mapping of `len` bytes at `addr` (MAP_FIXED), replacing whatever is mapped
    /// there; `opts.align` is ignored.
    ///
    /// # Safety
    /// The caller owns `[addr, addr+len)`: nothing else in the process uses or will unmap what
    /// is mapped there now (e.g. the program's own zero-initialised data, handed over whole).
    pub unsafe fn anonymous_at(addr: usize, len: usize, opts: &MapOptions) -> Result<Self> {
        Self::map(len, opts, None, 0, Some(addr))
    }

    /// A mapping of `len` bytes of `fd` from `offset`.
    pub fn of_fd(fd: &impl AsRawFd, len: usize, offset: u64, opts: &MapOptions) -> Result<Self> {
        Self::map(len, opts, Some(fd.as_raw_fd()), offset, None)
    }

    /// A mapping of `len` bytes of `fd` from `offset` at `addr` (MAP_FIXED), replacing whatever
    /// is mapped there; `opts.align` is ignored.
    ///
    /// # Safety
    /// As [`Mapping::anonymous_at`]: the caller owns `[addr, addr+len)`.
    pub unsafe fn of_fd_at(fd: &impl AsRawFd, addr: usize, len: usize, offset: u64, opts: &MapOptions) -> Result<Self> {
        Self::map(len, opts, Some(fd.as_raw_fd()), offset, Some(addr))
    }

    fn map(len: usize, opts: &MapOptions, fd: Option<RawFd>, offset: u64, fixed: Option<usize>) -> Result<Self> {
        if len == 0 {
            return Err(Error::Invalid("cannot map zero bytes".into()));
        }
        let unit = opts.hugetlb.unwrap_or_else(page_size);
        if !unit.is_power_of_two() || !len.is_multiple_of(unit) {
            return Err(Error::Invalid(format!("length {len} is not a multiple of the page size {unit}")));
        }
        let align = opts.align.unwrap_or(unit).max(unit);
        if !align.is_power_of_two() {
            return Err(Error::Invalid(format!("alignment {align} is not a power of two")));
        }
        let prot = if opts.no_access { libc::PROT_NONE } else { libc::PROT_READ | libc::PROT_WRITE };
        let mut flags = if opts.shared { libc::MAP_SHARED } else { libc::MAP_PRIVATE };
        if fd.is_none() {
            flags |= libc::MAP_ANONYMOUS;
        }
        if opts.noreserve {
            flags |= libc::MAP_NORESERVE;
        }
        if let Some(huge) = opts.hugetlb {
            flags |= libc::MAP_HUGETLB | ((huge.trailing_zeros() as libc::c_int) << libc::MAP_HUGE_SHIFT);
        }
        // Alignment beyond what the kernel guarantees: reserve len+align of address space with
        // PROT_NONE, then map the real thing with MAP_FIXED inside the reservation.
        let over = if align > unit && fixed.is_none() { align } else { 0 };
        let base = if let Some(at) = fixed {
            if at == 0 || !at.is_multiple_of(unit) {
                return Err(Error::Invalid(format!("fixed address {at:#x} is not aligned to {unit}")));
            }
            flags |= libc::MAP_FIXED;
            at as *mut libc::c_void
        } else if over > 0 {
            // SAFETY: a fresh PROT_NONE reservation; no existing mapping is touched.
            let r = unsafe {
                sys::mmap(
                    std::ptr::null_mut(),
                    len + over,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if r == libc::MAP_FAILED {
                return Err(Error::last_os("mmap(reserve)"));
            }
            let start = align_up(r as usize, align);
            let head = start - r as usize;
            let tail = over - head;
            // SAFETY: head and tail lie inside the reservation just made and are ours to drop.
            unsafe {
                if head > 0 {
                    sys::munmap(r as usize, head);
                }
                if tail > 0 {
                    sys::munmap(start + len, tail);
                }
            }
            flags |= libc::MAP_FIXED;
            start as *mut libc::c_void
        } else {
            std::ptr::null_mut()
        };
        if opts.populate {
            flags |= libc::MAP_POPULATE;
        }
        // SAFETY: either a fresh mapping chosen by the kernel, MAP_FIXED over the reservation
        // this function owns exclusively, or MAP_FIXED at `fixed`, which the caller owns
        // (`anonymous_at`'s contract).
        let ptr = unsafe { sys::mmap(base, len, prot, flags, fd.unwrap_or(-1), offset as libc::off_t) };
        if ptr == libc::MAP_FAILED {
            let err = Error::last_os("mmap");
            if !base.is_null() && fixed.is_none() {
                // SAFETY: releasing our own reservation.
                unsafe { sys::munmap(base as usize, len) };
            }
            return Err(err);
        }
        Ok(Mapping { ptr: NonNull::new(ptr as *mut u8).expect("mmap returned null"), len })
    }

    /// Take ownership of a mapping made elsewhere.
    ///
    /// # Safety
    /// `[ptr, ptr+len)` must be a mapping that nothing else will unmap.
    pub unsafe fn from_raw(ptr: *mut u8, len: usize) -> Self {
        Mapping { ptr: NonNull::new(ptr).expect("null mapping"), len }
    }

    /// Give up ownership without unmapping.
    pub fn into_raw(self) -> (*mut u8, usize) {
        let parts = (self.ptr.as_ptr(), self.len);
        std::mem::forget(self);
        parts
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The mapping as bytes.
    ///
    /// # Safety
    /// No other thread or mapping may write the range while the slice lives, and every page
    /// must be readable (not PROT_NONE, not an unresolved userfaultfd range).
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: upheld by the caller.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The mapping as mutable bytes.
    ///
    /// # Safety
    /// As for [`Mapping::as_slice`], and no other reference to the range may exist.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice(&self) -> &mut [u8] {
        // SAFETY: upheld by the caller.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// madvise over the whole mapping.
    pub fn advise(&self, advice: Advice) -> Result<()> {
        madvise(self.addr(), self.len, advice)
    }

    /// Grow or shrink in place or by moving (mremap with MREMAP_MAYMOVE).
    pub fn remap(&mut self, new_len: usize) -> Result<()> {
        if new_len == 0 || !new_len.is_multiple_of(page_size()) {
            return Err(Error::Invalid(format!("new length {new_len} is not a positive page multiple")));
        }
        // SAFETY: we own the mapping; MAYMOVE lets the kernel pick a new place and we update ptr.
        let p = unsafe { sys::mremap(self.addr(), self.len, new_len, libc::MREMAP_MAYMOVE, 0) };
        if p == libc::MAP_FAILED {
            return Err(Error::last_os("mremap"));
        }
        self.ptr = NonNull::new(p as *mut u8).expect("mremap returned null");
        self.len = new_len;
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: we own [ptr, ptr+len) and nothing borrows it past our lifetime.
        unsafe { sys::munmap(self.addr(), self.len) };
    }
}

/// mlock(2) a range.
pub fn mlock(addr: usize, len: usize) -> Result<()> {
    check_range(addr, len)?;
    // SAFETY: pins pages; no memory-safety effect.
    if unsafe { libc::mlock(addr as *const libc::c_void, len) } != 0 {
        return Err(Error::last_os("mlock"));
    }
    Ok(())
}

/// munlock(2) a range.
pub fn munlock(addr: usize, len: usize) -> Result<()> {
    check_range(addr, len)?;
    // SAFETY: unpins pages; no memory-safety effect.
    if unsafe { libc::munlock(addr as *const libc::c_void, len) } != 0 {
        return Err(Error::last_os("munlock"));
    }
    Ok(())
}

/// mlockall(MCL_CURRENT | MCL_FUTURE): lock the whole process, as latency-critical tasks do.
pub fn mlockall_current_and_future() -> Result<()> {
    // SAFETY: no memory-safety effect.
    if unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) } != 0 {
        return Err(Error::last_os("mlockall"));
    }
    Ok(())
}

/// munlockall(2).
pub fn munlockall() -> Result<()> {
    // SAFETY: no memory-safety effect.
    if unsafe { libc::munlockall() } != 0 {
        return Err(Error::last_os("munlockall"));
    }
    Ok(())
}

/// memfd_create(2) with close-on-exec; `hugetlb` selects MFD_HUGETLB with that page size.
pub fn memfd_create(name: &str, hugetlb: Option<usize>) -> Result<OwnedFd> {
    let cname = CString::new(name).map_err(|_| Error::Invalid("memfd name contains NUL".into()))?;
    let mut flags = libc::MFD_CLOEXEC;
    if let Some(size) = hugetlb {
        if !size.is_power_of_two() {
            return Err(Error::Invalid(format!("hugetlb size {size} is not a power of two")));
        }
        flags |= libc::MFD_HUGETLB | ((size.trailing_zeros()) << libc::MFD_HUGE_SHIFT);
    }
    // SAFETY: cname is a valid C string for the call's duration.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), flags) };
    if fd < 0 {
        return Err(Error::last_os("memfd_create"));
    }
    // SAFETY: fd is a fresh descriptor we own. Out of a program's way: a runtime keeps some
    // open as long as their memory (crate::fd::out_of_the_way).
    Ok(crate::fd::out_of_the_way(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// ftruncate(2): set a memfd's size.
pub fn ftruncate(fd: &impl AsRawFd, len: u64) -> Result<()> {
    // SAFETY: plain fd syscall.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
        return Err(Error::last_os("ftruncate"));
    }
    Ok(())
}

/// pidfd_open(2).
pub fn pidfd_open(pid: i32) -> Result<OwnedFd> {
    // SAFETY: plain syscall returning a new fd.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(Error::last_os("pidfd_open"));
    }
    // SAFETY: fd is a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// process_madvise(2): advise ranges of another process (MADV_COLD, PAGEOUT, WILLNEED,
/// COLLAPSE since 6.1). Returns the number of bytes advised.
pub fn process_madvise(pidfd: &impl AsRawFd, ranges: &[(usize, usize)], advice: Advice) -> Result<usize> {
    let iov: Vec<libc::iovec> =
        ranges.iter().map(|&(a, l)| libc::iovec { iov_base: a as *mut libc::c_void, iov_len: l }).collect();
    // SAFETY: iov is valid for the call; the kernel reads the vector and acts on the target.
    let n = unsafe {
        libc::syscall(libc::SYS_process_madvise, pidfd.as_raw_fd(), iov.as_ptr(), iov.len(), advice.raw(), 0)
    };
    if n < 0 {
        return Err(Error::last_os("process_madvise"));
    }
    Ok(n as usize)
}

/// mincore(2): for each page of `[addr, addr+len)`, whether it is resident. For a shared file
/// (memfd) mapping this is page-cache residency, so it stays true after MADV_DONTNEED dropped
/// the mapping. Writes one byte per page into `out` (bit 0 = resident).
pub fn mincore(addr: usize, len: usize, out: &mut [u8]) -> Result<()> {
    check_range(addr, len)?;
    let pages = len.div_ceil(page_size());
    if out.len() < pages {
        return Err(Error::Invalid(format!("mincore needs {pages} bytes of output, got {}", out.len())));
    }
    // SAFETY: out holds at least one byte per page of the range; the kernel only writes there.
    if unsafe { libc::mincore(addr as *mut libc::c_void, len, out.as_mut_ptr()) } != 0 {
        return Err(Error::last_os("mincore"));
    }
    Ok(())
}

/// Touch one byte per page so every page of `[addr, addr+len)` is faulted in writable.
///
/// # Safety
/// The range must be mapped writable and owned by the caller.
pub unsafe fn touch_pages(addr: usize, len: usize) {
    let ps = page_size();
    let mut p = addr;
    while p < addr + len {
        // SAFETY: upheld by the caller.
        unsafe { std::ptr::write_volatile(p as *mut u8, std::ptr::read_volatile(p as *const u8)) };
        p += ps;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_anonymous_mapping_is_aligned_and_usable() {
        let m = Mapping::anonymous(4 << 20, &MapOptions { align: Some(HUGE_PMD), ..Default::default() }).unwrap();
        assert_eq!(m.addr() % HUGE_PMD, 0);
        // SAFETY: fresh private mapping owned by this test.
        unsafe {
            m.as_mut_slice()[12345] = 7;
            assert_eq!(m.as_slice()[12345], 7);
        }
    }

    #[test]
    fn rejects_unaligned_and_empty_ranges_before_the_syscall() {
        assert!(matches!(madvise(1, 4096, Advice::DontNeed), Err(Error::Invalid(_))));
        assert!(matches!(madvise(4096, 0, Advice::DontNeed), Err(Error::Invalid(_))));
        assert!(matches!(Mapping::anonymous(0, &MapOptions::default()), Err(Error::Invalid(_))));
        assert!(matches!(Mapping::anonymous(100, &MapOptions::default()), Err(Error::Invalid(_))));
    }

    #[test]
    fn dontneed_on_shared_memfd_keeps_data() {
        let fd = memfd_create("pw-test", None).unwrap();
        ftruncate(&fd, 1 << 20).unwrap();
        let m = Mapping::of_fd(&fd, 1 << 20, 0, &MapOptions { shared: true, ..Default::default() }).unwrap();
        // SAFETY: our own mapping.
        unsafe { m.as_mut_slice()[5000] = 42 };
        m.advise(Advice::DontNeed).unwrap();
        // SAFETY: our own mapping.
        assert_eq!(unsafe { m.as_slice()[5000] }, 42);
    }

    #[test]
    fn mincore_sees_memfd_pages_after_dontneed() {
        let fd = memfd_create("pw-mincore", None).unwrap();
        ftruncate(&fd, 1 << 16).unwrap();
        let m = Mapping::of_fd(&fd, 1 << 16, 0, &MapOptions { shared: true, ..Default::default() }).unwrap();
        // SAFETY: our own mapping.
        unsafe { m.as_mut_slice()[3 * 4096] = 1 };
        m.advise(Advice::DontNeed).unwrap();
        let mut v = vec![0u8; 16];
        mincore(m.addr(), m.len(), &mut v).unwrap();
        assert_eq!(v.iter().map(|b| b & 1).collect::<Vec<_>>(), (0..16).map(|i| (i == 3) as u8).collect::<Vec<_>>());
        assert!(mincore(m.addr(), m.len(), &mut [0u8; 2]).is_err());
    }

    #[test]
    fn shared_pages_mapped_again_replace_the_target_and_stay_one_memory() {
        let fd = memfd_create("pw-again", None).unwrap();
        ftruncate(&fd, 1 << 16).unwrap();
        let shared = Mapping::of_fd(&fd, 1 << 16, 0, &MapOptions { shared: true, ..Default::default() }).unwrap();
        let target = Mapping::anonymous(1 << 16, &MapOptions::default()).unwrap();
        // SAFETY: our own mappings.
        unsafe {
            shared.as_mut_slice()[4096 + 7] = 3;
            target.as_mut_slice()[7] = 9;
        }
        // SAFETY: `shared` is a shared mapping of ours; `target` ours to replace (and released
        // to the new mapping, which `again` owns from here).
        unsafe { map_shared_again(shared.addr() + 4096, target.addr(), 4096) }.unwrap();
        let (t, n) = target.into_raw();
        // SAFETY: the first page of the old target is the new mapping now; the rest still ours.
        let (again, _rest) = unsafe { (Mapping::from_raw(t, 4096), Mapping::from_raw(t.add(4096), n - 4096)) };
        // SAFETY: our own mappings.
        unsafe {
            assert_eq!(again.as_slice()[7], 3, "the target shows the shared page");
            again.as_mut_slice()[8] = 5;
            assert_eq!(shared.as_slice()[4096 + 8], 5, "one memory, two mappings");
        }
        let private = Mapping::anonymous(4096, &MapOptions::default()).unwrap();
        // SAFETY: as above; private memory cannot be mapped twice, so nothing changes.
        assert!(unsafe { map_shared_again(private.addr(), again.addr(), 4096) }.is_err());
    }

    #[test]
    fn remap_grows_and_keeps_contents() {
        let mut m = Mapping::anonymous(1 << 16, &MapOptions::default()).unwrap();
        // SAFETY: our own mapping.
        unsafe { m.as_mut_slice()[100] = 9 };
        m.remap(1 << 20).unwrap();
        assert_eq!(m.len(), 1 << 20);
        // SAFETY: our own mapping.
        assert_eq!(unsafe { m.as_slice()[100] }, 9);
    }

    #[test]
    fn errors_name_the_syscall_and_errno() {
        let err = madvise(0x1000, 0x1000, Advice::Collapse).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("madvise(MADV_COLLAPSE)"), "{text}");
        assert!(err.errno().is_some());
    }

    proptest::proptest! {
        #[test]
        fn align_up_down_bracket_the_value(v in 0usize..1 << 40, shift in 0u32..31) {
            let a = 1usize << shift;
            let up = align_up(v, a);
            let down = align_down(v, a);
            proptest::prop_assert!(down <= v && v <= up);
            proptest::prop_assert_eq!(up % a, 0);
            proptest::prop_assert_eq!(down % a, 0);
            proptest::prop_assert!(up - down == 0 || up - down == a);
        }
    }
}
