//! Transparent hugepages (THP and multi-size THP) and hugetlb pools, through sysfs.
//!
//! Reads never change anything. Writes go through a [`SettingsGuard`] so they are undone.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{read_trimmed, read_u64, Error, Result};
use crate::guard::{normalize_setting, SettingsGuard};

/// The THP sysfs directory.
pub const THP_DIR: &str = "/sys/kernel/mm/transparent_hugepage";
/// The hugetlb sysfs directory.
pub const HUGETLB_DIR: &str = "/sys/kernel/mm/hugepages";

/// A selector setting: every choice the kernel offers and the active one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Selector {
    pub active: String,
    pub choices: Vec<String>,
}

/// Parse `always [madvise] never`.
pub fn parse_selector(text: &str) -> Result<Selector> {
    let choices: Vec<String> =
        text.split_whitespace().map(|w| w.trim_matches(|c| c == '[' || c == ']').to_string()).collect();
    let active = text
        .split_whitespace()
        .find(|w| w.starts_with('['))
        .map(|w| w.trim_matches(|c| c == '[' || c == ']').to_string())
        .ok_or_else(|| Error::parse("THP selector", format!("no [active] choice in {text:?}")))?;
    Ok(Selector { active, choices })
}

fn read_selector(path: &Path) -> Result<Selector> {
    parse_selector(&read_trimmed(path)?)
}

/// The THP settings Pagewise reads and changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThpSetting {
    Enabled,
    Defrag,
    ShmemEnabled,
}

impl ThpSetting {
    pub fn path(self) -> PathBuf {
        Path::new(THP_DIR).join(match self {
            ThpSetting::Enabled => "enabled",
            ThpSetting::Defrag => "defrag",
            ThpSetting::ShmemEnabled => "shmem_enabled",
        })
    }

    pub fn read(self) -> Result<Selector> {
        read_selector(&self.path())
    }

    /// Change the setting under `guard`, after checking `value` is one the kernel offers.
    pub fn set(self, guard: &SettingsGuard, value: &str) -> Result<()> {
        let current = self.read()?;
        if !current.choices.iter().any(|c| c == value) {
            return Err(Error::Invalid(format!(
                "{value:?} is not one of {:?} for {}",
                current.choices,
                self.path().display()
            )));
        }
        guard.write(self.path(), value)
    }
}

/// One multi-size THP size.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MthpSize {
    pub bytes: u64,
    /// The anonymous-memory setting; `None` for sizes only shmem supports (e.g. 8 KiB).
    pub anon: Option<Selector>,
    /// The shmem setting (since Linux 6.11).
    pub shmem: Option<Selector>,
}

/// The multi-size THP sizes this kernel offers, from `hugepages-<N>kB` directories.
/// Since Linux 6.8.
pub fn mthp_sizes() -> Result<Vec<MthpSize>> {
    let dir = Path::new(THP_DIR);
    let entries = std::fs::read_dir(dir).map_err(|source| Error::Read { path: dir.into(), source })?;
    let mut sizes = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if let Some(kb) = parse_size_dir(&name) {
            let optional = |file: &str| {
                let path = entry.path().join(file);
                if path.exists() {
                    read_selector(&path).map(Some)
                } else {
                    Ok(None)
                }
            };
            sizes.push(MthpSize { bytes: kb * 1024, anon: optional("enabled")?, shmem: optional("shmem_enabled")? });
        }
    }
    sizes.sort_by_key(|s| s.bytes);
    Ok(sizes)
}

/// Set one mTHP size's anonymous (`shmem: false`) or shmem `enabled` selector under `guard`.
pub fn set_mthp(guard: &SettingsGuard, bytes: u64, shmem: bool, value: &str) -> Result<()> {
    let path = Path::new(THP_DIR).join(format!("hugepages-{}kB", bytes / 1024)).join(if shmem {
        "shmem_enabled"
    } else {
        "enabled"
    });
    let current = read_selector(&path)?;
    if !current.choices.iter().any(|c| c == value) {
        return Err(Error::Invalid(format!("{value:?} is not one of {:?} for {}", current.choices, path.display())));
    }
    guard.write(path, value)
}

/// `hugepages-2048kB` -> 2048.
pub fn parse_size_dir(name: &str) -> Option<u64> {
    name.strip_prefix("hugepages-")?.strip_suffix("kB")?.parse().ok()
}

/// khugepaged tunables and counters.
#[derive(Clone, Debug, Serialize)]
pub struct Khugepaged {
    pub pages_to_scan: u64,
    pub scan_sleep_millisecs: u64,
    pub alloc_sleep_millisecs: u64,
    pub max_ptes_none: u64,
    pub pages_collapsed: u64,
    pub full_scans: u64,
    pub defrag: bool,
}

impl Khugepaged {
    pub fn dir() -> PathBuf {
        Path::new(THP_DIR).join("khugepaged")
    }

    pub fn read() -> Result<Self> {
        let d = Self::dir();
        Ok(Khugepaged {
            pages_to_scan: read_u64(d.join("pages_to_scan"))?,
            scan_sleep_millisecs: read_u64(d.join("scan_sleep_millisecs"))?,
            alloc_sleep_millisecs: read_u64(d.join("alloc_sleep_millisecs"))?,
            max_ptes_none: read_u64(d.join("max_ptes_none"))?,
            pages_collapsed: read_u64(d.join("pages_collapsed"))?,
            full_scans: read_u64(d.join("full_scans"))?,
            defrag: read_u64(d.join("defrag"))? != 0,
        })
    }

    /// Set one khugepaged tunable (e.g. `scan_sleep_millisecs`) under `guard`.
    pub fn set(guard: &SettingsGuard, name: &str, value: u64) -> Result<()> {
        if name.contains('/') {
            return Err(Error::Invalid(format!("bad khugepaged tunable {name:?}")));
        }
        guard.write(Self::dir().join(name), &value.to_string())
    }
}

/// One hugetlb pool (one page size).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HugetlbPool {
    pub page_size: u64,
    pub nr_hugepages: u64,
    pub free_hugepages: u64,
    pub resv_hugepages: u64,
    pub surplus_hugepages: u64,
}

impl HugetlbPool {
    fn dir(page_size: u64) -> PathBuf {
        Path::new(HUGETLB_DIR).join(format!("hugepages-{}kB", page_size / 1024))
    }

    /// Read the pool of `page_size` bytes.
    pub fn read(page_size: u64) -> Result<Self> {
        let d = Self::dir(page_size);
        Ok(HugetlbPool {
            page_size,
            nr_hugepages: read_u64(d.join("nr_hugepages"))?,
            free_hugepages: read_u64(d.join("free_hugepages"))?,
            resv_hugepages: read_u64(d.join("resv_hugepages"))?,
            surplus_hugepages: read_u64(d.join("surplus_hugepages"))?,
        })
    }

    /// Every pool the kernel offers, smallest page first.
    pub fn all() -> Result<Vec<Self>> {
        let dir = Path::new(HUGETLB_DIR);
        let entries = std::fs::read_dir(dir).map_err(|source| Error::Read { path: dir.into(), source })?;
        let mut sizes: Vec<u64> =
            entries.flatten().filter_map(|e| parse_size_dir(&e.file_name().to_string_lossy())).collect();
        sizes.sort();
        sizes.into_iter().map(|kb| Self::read(kb * 1024)).collect()
    }

    /// Resize the pool of `page_size` to `count` pages under `guard`; returns how many pages
    /// the pool really has afterwards (the kernel gives fewer when memory is fragmented).
    pub fn resize(guard: &SettingsGuard, page_size: u64, count: u64) -> Result<u64> {
        guard.write(Self::dir(page_size).join("nr_hugepages"), &count.to_string())?;
        Ok(Self::read(page_size)?.nr_hugepages)
    }
}

/// The current THP `enabled` mode, as one word.
pub fn thp_mode() -> Result<String> {
    Ok(normalize_setting(&read_trimmed(ThpSetting::Enabled.path())?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_selectors() {
        let s = parse_selector("always [madvise] never").unwrap();
        assert_eq!(s.active, "madvise");
        assert_eq!(s.choices, vec!["always", "madvise", "never"]);
        let s = parse_selector("always within_size advise [never] deny force").unwrap();
        assert_eq!(s.active, "never");
        assert!(parse_selector("always madvise never").is_err());
    }

    #[test]
    fn parses_size_dirs() {
        assert_eq!(parse_size_dir("hugepages-2048kB"), Some(2048));
        assert_eq!(parse_size_dir("hugepages-1048576kB"), Some(1048576));
        assert_eq!(parse_size_dir("khugepaged"), None);
    }

    #[test]
    fn reads_this_machine() {
        if !Path::new(THP_DIR).exists() {
            crate::testing::skip("no THP sysfs on this kernel");
            return;
        }
        let mode = ThpSetting::Enabled.read().unwrap();
        assert!(mode.choices.contains(&mode.active));
        let pools = HugetlbPool::all().unwrap();
        assert!(pools.iter().any(|p| p.page_size == 2 << 20));
    }
}
