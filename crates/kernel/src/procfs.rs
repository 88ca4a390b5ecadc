//! /proc readers: meminfo, vmstat, zoneinfo, maps/smaps/smaps_rollup, status, io, pagemap,
//! kpageflags and /proc/sys/vm.
//!
//! Parsing is pure (functions over text, tested on fixtures from real kernels); the `read_*`
//! functions bind a parser to its path. `procfs-core` parses what it covers (meminfo, vmstat,
//! maps/smaps, status, pagemap entries); zoneinfo, which it does not cover, is parsed here.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;

use procfs_core::process::{Io, MemoryMaps, PageInfo, SmapsRollup, Status};
use procfs_core::{FromBufRead, Meminfo};
use serde::Serialize;

use crate::error::{read_file, read_trimmed, Error, Result};
use crate::guard::SettingsGuard;

fn open(path: &str) -> Result<File> {
    File::open(path).map_err(|source| Error::Read { path: path.into(), source })
}

fn parse_with<T: FromBufRead>(what: &str, text: &str) -> Result<T> {
    T::from_buf_read(text.as_bytes()).map_err(|e| Error::parse(what, e.to_string()))
}

/// Which process a reader looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pid {
    SelfProcess,
    Id(i32),
}

impl Pid {
    fn path(self, file: &str) -> String {
        match self {
            Pid::SelfProcess => format!("/proc/self/{file}"),
            Pid::Id(p) => format!("/proc/{p}/{file}"),
        }
    }
}

/// /proc/PID/io: what the process (all its threads) read and wrote, `read_bytes` being what
/// it made the kernel fetch from storage (its page-cache misses, readahead included).
pub fn read_io(pid: Pid) -> Result<Io> {
    let path = pid.path("io");
    parse_with(&path, &read_file(&path)?)
}

/// /proc/meminfo (values in bytes, as procfs-core reports them).
pub fn read_meminfo() -> Result<Meminfo> {
    parse_with("/proc/meminfo", &read_file("/proc/meminfo")?)
}

/// Parse /proc/vmstat text.
pub fn parse_vmstat(text: &str) -> Result<BTreeMap<String, i64>> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        if let (Some(k), Some(v)) = (it.next(), it.next()) {
            let v = v.parse().map_err(|_| Error::parse("/proc/vmstat", format!("bad value in {line:?}")))?;
            out.insert(k.to_string(), v);
        }
    }
    Ok(out)
}

/// /proc/vmstat as name -> value.
pub fn read_vmstat() -> Result<BTreeMap<String, i64>> {
    parse_vmstat(&read_file("/proc/vmstat")?)
}

/// One zone of /proc/zoneinfo. Counts are in pages.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Zone {
    pub node: u32,
    pub name: String,
    pub free: u64,
    pub min: u64,
    pub low: u64,
    pub high: u64,
    /// Since Linux 6.1 (memory tiering).
    pub promo: Option<u64>,
    /// Since Linux 5.11.
    pub boost: Option<u64>,
    pub spanned: u64,
    pub present: u64,
    pub managed: u64,
    /// lowmem_reserve against allocations that could use higher zones.
    pub protection: Vec<u64>,
    /// The zone's own counters (`nr_free_pages`, `nr_zone_active_file`, ...).
    pub stats: BTreeMap<String, u64>,
    /// The node's counters, printed once per node before its first zone.
    pub node_stats: BTreeMap<String, u64>,
}

impl Zone {
    /// Zones with no memory (Movable, Device on most machines) still print watermarks.
    pub fn is_populated(&self) -> bool {
        self.managed > 0
    }
}

/// Parse /proc/zoneinfo.
pub fn parse_zoneinfo(text: &str) -> Result<Vec<Zone>> {
    let bad = |line: &str| Error::parse("/proc/zoneinfo", format!("unexpected line {line:?}"));
    let mut zones: Vec<Zone> = Vec::new();
    #[derive(PartialEq)]
    enum Section {
        NodeStats,
        Zone,
        Pagesets,
    }
    let mut section = Section::Zone;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("Node ") {
            let (node, zone) = rest.split_once(", zone").ok_or_else(|| bad(line))?;
            zones.push(Zone {
                node: node.trim().parse().map_err(|_| bad(line))?,
                name: zone.trim().to_string(),
                ..Default::default()
            });
            section = Section::Zone;
            continue;
        }
        let Some(zone) = zones.last_mut() else {
            if line.trim().is_empty() {
                continue;
            }
            return Err(bad(line));
        };
        let trimmed = line.trim();
        if trimmed == "per-node stats" {
            section = Section::NodeStats;
            continue;
        }
        if trimmed == "pagesets" {
            section = Section::Pagesets;
            continue;
        }
        if let Some(prot) = trimmed.strip_prefix("protection:") {
            zone.protection = prot
                .trim()
                .trim_matches(|c| c == '(' || c == ')')
                .split(',')
                .map(|v| v.trim().parse().map_err(|_| bad(line)))
                .collect::<Result<_>>()?;
            continue;
        }
        if let Some(free) = trimmed.strip_prefix("pages free") {
            zone.free = free.trim().parse().map_err(|_| bad(line))?;
            section = Section::Zone;
            continue;
        }
        if section == Section::Pagesets {
            continue;
        }
        let mut it = trimmed.split_whitespace();
        let (Some(key), Some(value)) = (it.next(), it.next()) else { continue };
        let Ok(value) = value.parse::<u64>() else { continue };
        match (key, &section) {
            (_, Section::NodeStats) => {
                zone.node_stats.insert(key.to_string(), value);
            }
            ("min", _) => zone.min = value,
            ("low", _) => zone.low = value,
            ("high", _) => zone.high = value,
            ("promo", _) => zone.promo = Some(value),
            ("boost", _) => zone.boost = Some(value),
            ("spanned", _) => zone.spanned = value,
            ("present", _) => zone.present = value,
            ("managed", _) => zone.managed = value,
            (k, _) if k.ends_with(':') => {}
            (k, _) => {
                zone.stats.insert(k.to_string(), value);
            }
        }
    }
    Ok(zones)
}

/// /proc/zoneinfo.
pub fn read_zoneinfo() -> Result<Vec<Zone>> {
    parse_zoneinfo(&read_file("/proc/zoneinfo")?)
}

/// /proc/PID/maps.
pub fn read_maps(pid: Pid) -> Result<MemoryMaps> {
    let path = pid.path("maps");
    parse_with(&path, &read_file(path.clone())?)
}

/// /proc/PID/smaps (maps with per-VMA counters in bytes).
pub fn read_smaps(pid: Pid) -> Result<MemoryMaps> {
    let path = pid.path("smaps");
    parse_with(&path, &read_file(path.clone())?)
}

/// Bytes of memory the file mapped at `[start, end)` in process `pid` holds: its allocated
/// blocks, whether its pages are mapped now or not. stat(2) of /proc/PID/map_files/START-END,
/// which follows the link to the file itself (proc(5): needs CAP_SYS_ADMIN or
/// CAP_CHECKPOINT_RESTORE); it works after the process closed its descriptor. For a memfd or
/// a hugetlbfs file this is the memory behind it: shmem and hugetlbfs count every allocated
/// page in the inode's blocks.
pub fn mapped_file_bytes(pid: Pid, start: u64, end: u64) -> Result<u64> {
    let path = pid.path(&format!("map_files/{start:x}-{end:x}"));
    std::fs::metadata(&path).map(|m| m.blocks() * 512).map_err(|source| Error::Read { path: path.into(), source })
}

/// The memory figures experiments sample from smaps_rollup, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MemUsage {
    pub rss: u64,
    pub pss: u64,
    pub anon: u64,
    pub anon_huge: u64,
    pub shmem_pmd_mapped: u64,
    pub file_pmd_mapped: u64,
    pub shared_hugetlb: u64,
    pub private_hugetlb: u64,
}

impl MemUsage {
    /// Memory mapped by huge entries: anonymous THP, shmem and file hugepages, hugetlb.
    pub fn pmd_mapped(&self) -> u64 {
        self.anon_huge + self.shmem_pmd_mapped + self.file_pmd_mapped + self.shared_hugetlb + self.private_hugetlb
    }
}

/// Parse /proc/PID/smaps_rollup.
pub fn parse_smaps_rollup(text: &str) -> Result<MemUsage> {
    let rollup: SmapsRollup = parse_with("smaps_rollup", text)?;
    let map = rollup
        .memory_map_rollup
        .0
        .first()
        .map(|m| m.extension.map.clone())
        .ok_or_else(|| Error::parse("smaps_rollup", "no rollup entry"))?;
    let get = |k: &str| map.get(k).copied().unwrap_or(0);
    Ok(MemUsage {
        rss: get("Rss"),
        pss: get("Pss"),
        anon: get("Anonymous"),
        anon_huge: get("AnonHugePages"),
        shmem_pmd_mapped: get("ShmemPmdMapped"),
        file_pmd_mapped: get("FilePmdMapped"),
        shared_hugetlb: get("Shared_Hugetlb"),
        private_hugetlb: get("Private_Hugetlb"),
    })
}

/// /proc/PID/smaps_rollup.
pub fn read_mem_usage(pid: Pid) -> Result<MemUsage> {
    parse_smaps_rollup(&read_file(pid.path("smaps_rollup"))?)
}

/// /proc/PID/status.
pub fn read_status(pid: Pid) -> Result<Status> {
    let path = pid.path("status");
    parse_with(&path, &read_file(path.clone())?)
}

/// Random access to /proc/PID/pagemap: one 64-bit entry per virtual page.
pub struct Pagemap {
    file: File,
}

impl Pagemap {
    pub fn open(pid: Pid) -> Result<Self> {
        Ok(Pagemap { file: open(&pid.path("pagemap"))? })
    }

    /// Raw entries for `count` pages starting at virtual address `addr`.
    pub fn read_raw(&self, addr: usize, count: usize) -> Result<Vec<u64>> {
        let ps = crate::mem::page_size();
        let mut buf = vec![0u8; count * 8];
        self.file
            .read_exact_at(&mut buf, (addr / ps * 8) as u64)
            .map_err(|source| Error::Read { path: "pagemap".into(), source })?;
        Ok(buf.chunks_exact(8).map(|c| u64::from_ne_bytes(c.try_into().expect("8 bytes"))).collect())
    }

    /// Decoded entries (present/swapped, PFN when root, soft-dirty, exclusive, ...).
    pub fn read(&self, addr: usize, count: usize) -> Result<Vec<PageInfo>> {
        Ok(self.read_raw(addr, count)?.into_iter().map(PageInfo::parse_info).collect())
    }
}

/// Bit 55 of a pagemap entry: the page is soft-dirty.
pub const PAGEMAP_SOFT_DIRTY: u64 = 1 << 55;
/// Bit 63 of a pagemap entry: the page is present in RAM.
pub const PAGEMAP_PRESENT: u64 = 1 << 63;
/// The PFN bits of a pagemap entry (zero without CAP_SYS_ADMIN).
pub const PAGEMAP_PFN_MASK: u64 = (1 << 55) - 1;

/// /proc/kpageflags: flags of physical pages by PFN (root only).
pub struct KpageFlags {
    file: File,
}

/// KPF_THP: the page is part of a transparent hugepage (Documentation/admin-guide/mm/pagemap.rst).
pub const KPF_THP: u64 = 1 << 22;
/// KPF_HUGE: the page is part of a hugetlb page.
pub const KPF_HUGE: u64 = 1 << 17;

impl KpageFlags {
    pub fn open() -> Result<Self> {
        Ok(KpageFlags { file: open("/proc/kpageflags")? })
    }

    /// Flags of `pfn`.
    pub fn flags(&mut self, pfn: u64) -> Result<u64> {
        let mut buf = [0u8; 8];
        self.file
            .seek(SeekFrom::Start(pfn * 8))
            .and_then(|_| self.file.read_exact(&mut buf))
            .map_err(|source| Error::Read { path: "/proc/kpageflags".into(), source })?;
        Ok(u64::from_ne_bytes(buf))
    }
}

/// A tunable under /proc/sys/vm.
pub fn vm_sysctl_path(name: &str) -> Result<PathBuf> {
    if name.is_empty() || name.contains('/') || name.contains("..") {
        return Err(Error::Invalid(format!("bad vm sysctl name {name:?}")));
    }
    Ok(PathBuf::from("/proc/sys/vm").join(name))
}

/// Read /proc/sys/vm/NAME.
pub fn read_vm_sysctl(name: &str) -> Result<String> {
    read_trimmed(vm_sysctl_path(name)?)
}

/// Write /proc/sys/vm/NAME under `guard`.
pub fn set_vm_sysctl(guard: &SettingsGuard, name: &str, value: &str) -> Result<()> {
    guard.write(vm_sysctl_path(name)?, value)
}

/// Read any /proc file whole (for callers that only need a buffered reader).
pub fn reader(path: &str) -> Result<BufReader<File>> {
    Ok(BufReader::new(open(path)?))
}

/// The number of bytes a whole /proc file holds right now.
pub fn slurp(path: &str) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    open(path)?.read_to_end(&mut out).map_err(|source| Error::Read { path: path.into(), source })?;
    Ok(out)
}

/// The pids whose /proc/PID/cmdline contains `needle` (arguments joined by spaces), ascending.
/// Processes that exit while the scan runs are skipped.
pub fn pids_with_cmdline(needle: &str) -> Result<Vec<i32>> {
    let dir = std::fs::read_dir("/proc").map_err(|source| Error::Read { path: "/proc".into(), source })?;
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        if let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            let text: String = String::from_utf8_lossy(&raw).replace('\0', " ");
            if text.contains(needle) {
                out.push(pid);
            }
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// This process's thread count, read without allocating (usable in a signal handler): the
/// link count of /proc/self/task, opened once, by fstat(2). procfs reports that directory's
/// link count as 2 plus the number of threads (`proc_task_getattr`); reading it costs a fraction
/// of formatting and parsing /proc/self/stat, which the DLM fault path paid on every install.
/// The directory is this process's at `open`: a forked child opens its own.
#[derive(Debug)]
pub struct ThreadCount {
    task_dir: File,
}

impl ThreadCount {
    pub fn open() -> Result<Self> {
        // Kept open while the program runs: out of its way (crate::fd::out_of_the_way).
        let task_dir = crate::fd::out_of_the_way(open("/proc/self/task")?.into());
        Ok(ThreadCount { task_dir: task_dir.into() })
    }

    pub fn get(&self) -> Result<u32> {
        let meta =
            self.task_dir.metadata().map_err(|e| Error::Syscall { call: "fstat(/proc/self/task)", source: e })?;
        thread_count_from_task_links(meta.nlink())
            .ok_or_else(|| Error::parse("/proc/self/task", format!("link count {} below 3", meta.nlink())))
    }
}

/// Steal time of one CPU from /proc/stat text, in USER_HZ ticks: the eighth value of its
/// `cpuN` line, time the hypervisor ran something else while this CPU had work.
pub fn parse_cpu_steal_ticks(text: &str, cpu: usize) -> Result<u64> {
    let name = format!("cpu{cpu}");
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name.as_str()))
        .ok_or_else(|| Error::parse("/proc/stat", format!("no {name} line")))?;
    line.split_whitespace()
        .nth(8)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| Error::parse("/proc/stat", format!("no steal value in {line:?}")))
}

/// Steal time of one CPU so far (/proc/stat).
pub fn read_cpu_steal(cpu: usize) -> Result<std::time::Duration> {
    let ticks = parse_cpu_steal_ticks(&read_file("/proc/stat")?, cpu)?;
    // SAFETY: sysconf has no memory-safety preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as u64 } else { 100 };
    Ok(std::time::Duration::from_nanos(ticks.saturating_mul(1_000_000_000 / hz)))
}

/// Threads of a process from the link count of its /proc/PID/task (2 + threads; a live process
/// has at least one thread).
pub fn thread_count_from_task_links(nlink: u64) -> Option<u32> {
    nlink.checked_sub(2).filter(|&n| n >= 1).and_then(|n| u32::try_from(n).ok())
}

#[cfg(test)]
mod tests {

    #[test]
    fn steal_is_the_eighth_value_of_the_cpus_own_line() {
        let text = "cpu  3782908 0 985481 1202515 99792 0 163729 183687 0 0\n\
                    cpu0 1891454 0 492740 601257 49896 0 81864 91843 0 0\n\
                    cpu1 1891454 0 492741 601258 49896 0 81865 91844 0 0\n\
                    cpu10 1 0 1 1 1 0 1 7 0 0\n\
                    intr 12345 0 0\n";
        assert_eq!(super::parse_cpu_steal_ticks(text, 0).unwrap(), 91843);
        assert_eq!(super::parse_cpu_steal_ticks(text, 1).unwrap(), 91844);
        assert_eq!(super::parse_cpu_steal_ticks(text, 10).unwrap(), 7);
        assert!(super::parse_cpu_steal_ticks(text, 2).is_err());
        // Kernels before 2.6.11 had no steal column.
        assert!(super::parse_cpu_steal_ticks("cpu0 1 2 3 4 5 6 7\n", 0).is_err());
    }

    #[test]
    fn a_read_shows_in_the_process_io_counters() {
        let dir = crate::private_dir::PrivateDir::new("procfs-io").unwrap();
        let file = dir.join("data");
        std::fs::write(&file, vec![7u8; 1 << 16]).unwrap();
        let before = read_io(Pid::SelfProcess).unwrap();
        assert_eq!(std::fs::read(&file).unwrap().len(), 1 << 16);
        let after = read_io(Pid::Id(std::process::id() as i32)).unwrap();
        assert!(after.rchar >= before.rchar + (1 << 16), "{before:?} -> {after:?}");
        assert!(after.read_bytes >= before.read_bytes);
    }

    #[test]
    fn this_cpus_steal_can_be_read() {
        super::read_cpu_steal(crate::cpu::current_cpu()).unwrap();
    }

    #[test]
    fn thread_count_is_the_task_link_count_less_two() {
        assert_eq!(super::thread_count_from_task_links(3), Some(1));
        assert_eq!(super::thread_count_from_task_links(7), Some(5));
        assert_eq!(super::thread_count_from_task_links(2), None);
        assert_eq!(super::thread_count_from_task_links(0), None);
    }

    #[test]
    fn thread_count_counts_exactly_in_a_single_threaded_child() {
        // This test process has other tests' threads: count exactly in a forked child, where
        // only the calling thread exists. ThreadCount opens and fstats, both async-signal-safe
        // (the path fits std's on-stack buffer: no allocation on success).
        // SAFETY: the closure opens a file, fstats it and writes into its buffer; an error
        // (which would allocate) is turned into 0 without being formatted.
        let counts = unsafe {
            crate::fork::in_single_threaded_child(1, |buf| {
                buf[0] = super::ThreadCount::open().ok().and_then(|tc| tc.get().ok()).unwrap_or(0) as u8;
                1
            })
        }
        .unwrap();
        assert_eq!(counts, [1]);
    }

    #[test]
    fn thread_count_sees_a_new_thread() {
        // Other tests run in threads of this process too: only a lower bound holds.
        let tc = super::ThreadCount::open().unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || rx.recv().unwrap());
        assert!(tc.get().unwrap() >= 2);
        tx.send(()).unwrap();
        t.join().unwrap();
        assert!(tc.get().unwrap() >= 1);
    }

    #[test]
    fn a_memfds_bytes_include_pages_whose_mapping_was_dropped() {
        use crate::mem::{self, Advice, MapOptions, Mapping};
        let fd = mem::memfd_create("procfs-map-files-test", None).unwrap();
        mem::ftruncate(&fd, 64 << 10).unwrap();
        let map = Mapping::of_fd(&fd, 64 << 10, 0, &MapOptions { shared: true, ..Default::default() }).unwrap();
        let (start, end) = (map.addr() as u64, (map.addr() + map.len()) as u64);
        let page = mem::page_size();
        // SAFETY: the mapping is 64 KiB long and owned by this test; 4 pages are written.
        unsafe { std::ptr::write_bytes(map.as_ptr(), 1, 4 * page) };
        assert_eq!(mapped_file_bytes(Pid::SelfProcess, start, end).unwrap(), 4 * page as u64);
        // MADV_DONTNEED on a shared mapping drops the page-table entries, not the pages.
        mem::madvise(map.addr(), map.len(), Advice::DontNeed).unwrap();
        assert_eq!(mapped_file_bytes(Pid::SelfProcess, start, end).unwrap(), 4 * page as u64);
        assert!(mapped_file_bytes(Pid::SelfProcess, start, end + page as u64).is_err());
    }

    #[test]
    fn finds_this_process_by_its_command_line() {
        let me = std::env::args().next().unwrap();
        assert!(pids_with_cmdline(&me).unwrap().contains(&(std::process::id() as i32)));
        assert!(pids_with_cmdline("no-such-command-line-\u{1}").unwrap().is_empty());
    }

    use super::*;

    const ZONEINFO_HERE: &str = include_str!("../fixtures/zoneinfo-6.18-firecracker.txt");
    const ZONEINFO_2NODE: &str = include_str!("../fixtures/zoneinfo-5.15-2node.txt");

    #[test]
    fn zoneinfo_of_this_vm() {
        let zones = parse_zoneinfo(ZONEINFO_HERE).unwrap();
        let names: Vec<&str> = zones.iter().map(|z| z.name.as_str()).collect();
        assert_eq!(names, ["DMA", "DMA32", "Normal", "Movable", "Device"]);
        let dma = &zones[0];
        assert_eq!((dma.free, dma.min, dma.low, dma.high), (3840, 55, 68, 81));
        assert_eq!(dma.promo, Some(94));
        assert_eq!(dma.protection.len(), 5);
        assert!(dma.node_stats.contains_key("nr_inactive_file"));
        assert_eq!(dma.stats["nr_free_pages"], 3840);
        // pagesets' "high:" must not overwrite the watermark.
        assert_eq!(zones[1].high, 16741);
        assert!(!zones[3].is_populated());
    }

    #[test]
    fn zoneinfo_with_two_nodes() {
        let zones = parse_zoneinfo(ZONEINFO_2NODE).unwrap();
        assert_eq!(zones.len(), 6);
        let n1 = zones.iter().find(|z| z.node == 1 && z.name == "Normal").unwrap();
        assert_eq!((n1.free, n1.min, n1.low, n1.high), (204511, 16883, 21103, 25323));
        assert_eq!(n1.promo, None);
        assert_eq!(n1.node_stats["nr_active_file"], 701221);
        let n0 = zones.iter().find(|z| z.node == 0 && z.name == "Normal").unwrap();
        assert_eq!(n0.high, 18950);
        assert_eq!(n0.managed, 7712805);
        assert_eq!(zones.iter().filter(|z| z.is_populated()).count(), 4);
    }

    #[test]
    fn zoneinfo_rejects_garbage() {
        assert!(parse_zoneinfo("hello world\n").is_err());
        assert!(parse_zoneinfo("Node x, zone Normal\n").is_err());
    }

    #[test]
    fn zoneinfo_of_the_live_kernel_parses() {
        let zones = read_zoneinfo().unwrap();
        assert!(zones.iter().any(|z| z.is_populated() && z.low >= z.min && z.high >= z.low));
    }

    #[test]
    fn vmstat_fixture_and_live() {
        let v = parse_vmstat(include_str!("../fixtures/vmstat-6.18-firecracker.txt")).unwrap();
        assert!(v.contains_key("pgscan_kswapd"));
        assert!(v.contains_key("nr_free_pages"));
        assert!(read_vmstat().unwrap().contains_key("pgfault"));
    }

    #[test]
    fn meminfo_live() {
        let m = read_meminfo().unwrap();
        assert!(m.mem_total > 0);
    }

    #[test]
    fn huge_mappings_of_every_kind_add_up() {
        let text = include_str!("../fixtures/smaps_rollup-6.18.txt")
            .replace("AnonHugePages:         0 kB", "AnonHugePages:      2048 kB")
            .replace("ShmemPmdMapped:        0 kB", "ShmemPmdMapped:     4096 kB");
        let u = parse_smaps_rollup(&text).unwrap();
        assert_eq!((u.anon_huge, u.shmem_pmd_mapped), (2 << 20, 4 << 20));
        assert_eq!(u.pmd_mapped(), 6 << 20);
    }

    #[test]
    fn smaps_rollup_fixture_and_live() {
        let u = parse_smaps_rollup(include_str!("../fixtures/smaps_rollup-6.18.txt")).unwrap();
        assert!(u.rss > 0 && u.pss > 0);
        let live = read_mem_usage(Pid::SelfProcess).unwrap();
        assert!(live.rss > 0);
    }

    #[test]
    fn pagemap_sees_a_touched_page_present() {
        let m = crate::mem::Mapping::anonymous(1 << 16, &Default::default()).unwrap();
        // SAFETY: our own fresh mapping.
        unsafe { m.as_mut_slice()[0] = 1 };
        let pm = Pagemap::open(Pid::SelfProcess).unwrap();
        let raw = pm.read_raw(m.addr(), 16).unwrap();
        assert!(raw[0] & PAGEMAP_PRESENT != 0);
        assert!(raw[15] & PAGEMAP_PRESENT == 0);
    }

    #[test]
    fn sysctl_names_are_checked() {
        assert!(vm_sysctl_path("../../etc/passwd").is_err());
        assert!(read_vm_sysctl("min_free_kbytes").unwrap().parse::<u64>().is_ok());
    }
}
