//! The memory a cache server holds, one definition for kvcache (its `memory_bytes` stat) and
//! for the servers `pagewise eval hps-kvcache` compares it with (memcached, memcached under
//! `pagewise hps run`): every memfd the process maps counts with the pages the memfd holds,
//! mapped or not; everything else counts with its RSS.
//!
//! Why not VmRSS: HPS's tracker drops the page-table entries of tracked memory (MADV_DONTNEED
//! on the arena's shared memfd mapping) to see the next access fault. The pages stay in the
//! memfd (madvise(2): shared mappings are "repopulated from the underlying mapped file") and
//! still occupy memory, but they leave RSS until touched again; and a hugetlb memfd (HPS's hot
//! arena when the hugetlb pool has pages) is never in RSS. Charging a process under HPS with
//! VmRSS made it look smaller than it is, the more so the colder its memory.

use std::collections::BTreeSet;

use pagewise_kernel::procfs::{self, Pid};
use procfs_core::process::MMapPath;

/// One mapping of the process, as far as the definition needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vma {
    pub start: u64,
    pub end: u64,
    /// Resident bytes of the mapping (smaps `Rss`).
    pub rss: u64,
    /// The memfd behind the mapping, as (device, inode), if it is one.
    pub memfd: Option<(i32, i32, u64)>,
}

/// Memory of a process made of `vmas`: the RSS of every mapping that is not a memfd, plus, once
/// per memfd however many mappings it has, what `memfd_bytes` says the memfd holds.
pub fn memory_bytes<E>(vmas: &[Vma], mut memfd_bytes: impl FnMut(&Vma) -> Result<u64, E>) -> Result<u64, E> {
    let mut seen = BTreeSet::new();
    let mut total = 0;
    for v in vmas {
        match v.memfd {
            None => total += v.rss,
            Some(file) => {
                if seen.insert(file) {
                    total += memfd_bytes(v)?;
                }
            }
        }
    }
    Ok(total)
}

/// Whether a /proc/PID/maps path names a memfd ("/memfd:NAME (deleted)", also for hugetlb
/// memfds) or a file HPS keeps memory in like one (an arena of `pagewise hps run` on its
/// private tmpfs, "/pagewise-hps.N (deleted)").
pub fn is_memfd_path(path: &MMapPath) -> bool {
    let named = |s: &str| s.starts_with("/memfd:") || pagewise_track::is_arena_path(s, "pagewise-hps");
    match path {
        MMapPath::Path(p) => p.to_str().is_some_and(named),
        MMapPath::Other(s) => named(s),
        _ => false,
    }
}

/// [`memory_bytes`] of process `pid`, from its smaps and its memfds' allocated blocks
/// (/proc/PID/map_files, which needs CAP_SYS_ADMIN when the process maps a memfd).
pub fn process_memory_bytes(pid: Pid) -> anyhow::Result<u64> {
    let maps = procfs::read_smaps(pid)?;
    let vmas: Vec<Vma> = maps
        .0
        .iter()
        .map(|m| Vma {
            start: m.address.0,
            end: m.address.1,
            rss: m.extension.map.get("Rss").copied().unwrap_or(0),
            memfd: is_memfd_path(&m.pathname).then_some((m.dev.0, m.dev.1, m.inode)),
        })
        .collect();
    Ok(memory_bytes(&vmas, |v| procfs::mapped_file_bytes(pid, v.start, v.end))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vma(start: u64, rss: u64, memfd: Option<u64>) -> Vma {
        Vma { start, end: start + (1 << 21), rss, memfd: memfd.map(|ino| (0, 1, ino)) }
    }

    #[test]
    fn memfds_count_once_by_their_own_bytes_the_rest_by_rss() {
        // Two mappings of memfd 7 (an arena split in two VMAs) whose pages are mostly unmapped,
        // one of memfd 8 (hugetlb: no RSS at all), and anonymous memory.
        let vmas = [vma(0, 100, None), vma(1 << 21, 10, Some(7)), vma(2 << 21, 0, Some(8)), vma(3 << 21, 5, Some(7))];
        let bytes = |v: &Vma| -> Result<u64, ()> {
            Ok(match v.memfd {
                Some((_, _, 7)) => 1000,
                Some((_, _, 8)) => 4000,
                _ => unreachable!("only memfds are asked for"),
            })
        };
        assert_eq!(memory_bytes(&vmas, bytes), Ok(100 + 1000 + 4000));
        assert_eq!(memory_bytes(&vmas[..1], bytes), Ok(100));
        assert_eq!(memory_bytes(&vmas, |_| Err("no map_files")), Err("no map_files"));
    }

    #[test]
    fn memfd_paths_are_recognised() {
        assert!(is_memfd_path(&MMapPath::from("/memfd:pagewise-hps (deleted)").unwrap()));
        assert!(is_memfd_path(&MMapPath::Other("/memfd:pagewise-hps-compact (deleted)".into())));
        assert!(is_memfd_path(&MMapPath::from("/pagewise-hps.3 (deleted)").unwrap()));
        assert!(!is_memfd_path(&MMapPath::from("/usr/lib/libc.so.6").unwrap()));
        assert!(!is_memfd_path(&MMapPath::Anonymous));
    }
}
