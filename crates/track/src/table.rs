//! Per-page tables in their own anonymous mappings.
//!
//! A tracked range keeps a few atomics per 4 KiB page (12 bytes: 0.3% of what it tracks), and
//! most of a large range is never observed. In an anonymous mapping a table page costs memory
//! only once written; zero is every entry's start. `calloc` gives no such promise: below
//! malloc's mmap threshold — which glibc raises as the program frees large blocks, so a numpy
//! process soon has it at several MiB — it clears heap memory, and every page of the table is
//! populated at once.

use std::marker::PhantomData;

use pagewise_kernel::mem::{MapOptions, Mapping};

/// Types whose all-zero bit pattern is a valid value (0 / false).
///
/// # Safety
/// Implement only for types for which all-zero bytes are a valid value.
pub(crate) unsafe trait ZeroIsDefault {}
// SAFETY: the atomic integers and bool are valid (0 / false) as all-zero bytes.
unsafe impl ZeroIsDefault for std::sync::atomic::AtomicU32 {}
// SAFETY: as above.
unsafe impl ZeroIsDefault for std::sync::atomic::AtomicBool {}

/// `len` entries of `T`, all zero to begin with.
pub(crate) struct Table<T> {
    map: Mapping,
    len: usize,
    _entries: PhantomData<T>,
}

impl<T: ZeroIsDefault> Table<T> {
    pub(crate) fn zeroed(len: usize) -> pagewise_kernel::Result<Self> {
        let page = pagewise_kernel::mem::page_size();
        let bytes = (len * std::mem::size_of::<T>()).max(1).next_multiple_of(page);
        Ok(Table { map: Mapping::anonymous(bytes, &MapOptions::default())?, len, _entries: PhantomData })
    }
}

impl<T> std::ops::Deref for Table<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: the mapping holds `len` entries of T, page aligned (so aligned for T), all
        // valid from the start (zero, ZeroIsDefault) and only changed through &T (atomics); it
        // lives as long as self.
        unsafe { std::slice::from_raw_parts(self.map.addr() as *const T, self.len) }
    }
}

impl<T> std::fmt::Debug for Table<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Table({} entries at {:#x})", self.len, self.map.addr())
    }
}
