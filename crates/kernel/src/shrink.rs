//! Shrinking a process about to wait a long time: the file pages it mapped on its way there,
//! and its heap's free memory.
//!
//! A wrapper (`pagewise run`, `pagewise hps run`) starts a program and then only waits for it.
//! Starting it touched code all over its own executable and its libraries, and the kernel maps
//! a file's cached pages 64 KiB around each page touched: `pagewise hps run` waiting for a
//! program held 5.3 MiB, 4.9 MiB of it pages of files (3.2 MiB of its executable, 1.3 MiB of
//! libc) it does not touch again before the program ends. A program of its own that only
//! waited would hold about 1 MiB; exec'ing one leaves the same pages cached and unmapped,
//! which is what unmapping them here does, without a second program.
//!
//! Only pages that are the file's, unchanged, are given back: a private mapping that cannot be
//! written and holds no anonymous page (no copy the dynamic linker wrote, as RELRO's
//! relocated pages are) reads back the same bytes from the file after MADV_DONTNEED. The
//! pages stay in the page cache; the next touch maps them again.

use procfs_core::process::{MMPermissions, MMapPath, MemoryMap, MemoryMaps, VmFlags};

use crate::mem::{madvise, Advice};
use crate::procfs::{read_smaps, Pid};
use crate::Result;

/// The mappings of `maps` (from smaps) whose resident pages are all the file's own: private,
/// not writable, file-backed, not locked, resident, and without an anonymous page.
fn unchanged_file_maps(maps: &MemoryMaps) -> impl Iterator<Item = &MemoryMap> {
    maps.iter()
        .filter(|m| matches!(m.pathname, MMapPath::Path(_)))
        .filter(|m| m.perms.contains(MMPermissions::PRIVATE) && !m.perms.contains(MMPermissions::WRITE))
        .filter(|m| !m.extension.vm_flags.contains(VmFlags::LO))
        .filter(|m| m.extension.map.get("Anonymous") == Some(&0))
        .filter(|m| m.extension.map.get("Rss").is_some_and(|&rss| rss > 0))
}

/// (address, length) of each mapping [`unchanged_file_maps`] gives back.
pub fn unchanged_file_ranges(maps: &MemoryMaps) -> Vec<(usize, usize)> {
    unchanged_file_maps(maps).map(|m| (m.address.0 as usize, (m.address.1 - m.address.0) as usize)).collect()
}

/// Unmap this process's unchanged file pages (module doc); the bytes that were mapped there.
/// Only for a process whose threads do not map, write or re-protect files meanwhile (a
/// wrapper about to wait): a range read from smaps is advised as it was then. Fails only
/// where /proc/self/smaps cannot be read.
pub fn unmap_unchanged_file_pages() -> Result<u64> {
    let maps = read_smaps(Pid::SelfProcess)?;
    let mut unmapped = 0;
    for m in unchanged_file_maps(&maps) {
        let (addr, end) = (m.address.0 as usize, m.address.1 as usize);
        // Private and read-only, with no anonymous page: every resident page is the file's
        // page-cache page, and the next touch maps the same bytes again. A range the kernel
        // refuses (a device's pages) stays mapped as it was; the others are still given back.
        if madvise(addr, end - addr, Advice::DontNeed).is_ok() {
            unmapped += m.extension.map.get("Rss").copied().unwrap_or(0);
        }
    }
    Ok(unmapped)
}

/// Return the free memory of the C heap (glibc's malloc) to the kernel: malloc_trim(3).
pub fn trim_heap() {
    // SAFETY: malloc_trim takes no pointer; it only releases memory malloc holds free.
    unsafe { libc::malloc_trim(0) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use procfs_core::FromBufRead;

    const WRAPPER: &str = include_str!("../fixtures/smaps-wrapper-6.18.txt");

    fn maps(text: &str) -> MemoryMaps {
        MemoryMaps::from_buf_read(text.as_bytes()).expect("smaps fixture")
    }

    #[test]
    fn a_waiting_wrapper_gives_back_its_code_and_read_only_data_but_not_relocated_pages() {
        let maps = maps(WRAPPER);
        let ranges = unchanged_file_ranges(&maps);
        let path_of = |addr: usize| {
            let m = maps.iter().find(|m| m.address.0 as usize == addr).expect("range of a mapping");
            (m.perms, m.pathname.clone())
        };
        let exe = MMapPath::Path("/work/main/target/release/pagewise".into());
        let kept: Vec<_> = ranges.iter().map(|&(a, _)| path_of(a)).collect();
        // The executable's headers and read-only data, and its code.
        assert!(kept.contains(&(MMPermissions::READ | MMPermissions::PRIVATE, exe.clone())));
        assert!(kept.contains(&(MMPermissions::READ | MMPermissions::EXECUTE | MMPermissions::PRIVATE, exe.clone())));
        // libc's code and the dynamic linker's are given back too.
        assert!(ranges.contains(&(0x7f4388b26000, 0x7f4388c7c000 - 0x7f4388b26000)), "libc's code");
        assert!(ranges.contains(&(0x7f4388df7000, 0x7f4388e1d000 - 0x7f4388df7000)), "ld.so's code");
        // RELRO: read-only now, but relocated by the dynamic linker (anonymous copies).
        assert!(!ranges.contains(&(0x563fb72b2000, 0x563fb72e7000 - 0x563fb72b2000)), "the executable's RELRO");
        for &(addr, _) in &ranges {
            let (perms, path) = path_of(addr);
            assert!(!perms.contains(MMPermissions::WRITE), "{path:?} is writable");
            assert!(matches!(path, MMapPath::Path(_)), "{path:?} is not a file");
        }
        // Heap, stacks, vdso and writable data stay.
        assert!(ranges.iter().all(|&(a, _)| a != 0x563fefbac000 && a != 0x7f4388df4000 && a != 0x7ffd607cf000));
    }

    #[test]
    fn locked_or_unresident_mappings_are_left_alone() {
        let locked = WRAPPER.replacen("VmFlags: rd ex mr mw me \n", "VmFlags: rd ex mr mw me lo \n", 1);
        let code = (0x563fb6e0d000, 0x563fb72b2000 - 0x563fb6e0d000);
        assert!(unchanged_file_ranges(&maps(WRAPPER)).contains(&code));
        assert!(!unchanged_file_ranges(&maps(&locked)).contains(&code), "mlocked");
        let unresident = WRAPPER.replacen("Rss:                1832 kB", "Rss:                   0 kB", 1);
        assert!(!unchanged_file_ranges(&maps(&unresident)).contains(&code), "nothing to give back");
    }
}
