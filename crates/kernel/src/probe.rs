//! The capability probe: what this kernel offers each Pagewise system, found without changing
//! anything. Files that are missing mean "absent"; files that exist but cannot be used mean
//! "unusable", with the reason. Active probes (a MADV_COLLAPSE on a private 2 MiB mapping, a
//! userfaultfd handshake, a PAGEMAP_SCAN of one page) touch only the probe's own memory.

use std::path::Path;

use serde::Serialize;

use crate::error::{read_trimmed, Error};
use crate::features::{self, Capability};
use crate::mem::{ftruncate, memfd_create, Advice, MapOptions, Mapping, HUGE_PMD};
use crate::{cgroup, pagemap_scan, thp, tracefs, uffd};

/// Whether a feature can be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Present,
    Absent,
    /// There, but not usable by Pagewise now (busy, permission, disabled).
    Unusable,
}

/// One probed feature.
#[derive(Clone, Debug, Serialize)]
pub struct Feature {
    pub status: Status,
    /// The value, where the feature has one (a mode, a list of sizes, a feature list).
    #[serde(skip_serializing_if = "serde_json::Value::is_null")]
    pub value: serde_json::Value,
    /// Why, in words.
    pub detail: String,
}

/// Every probed feature, by stable snake_case key (the JSON of `pagewise doctor --json`).
#[derive(Clone, Debug, Serialize)]
pub struct Capabilities {
    pub kernel_release: String,
    pub root: bool,
    pub features: Vec<(Capability, Feature)>,
}

impl Capabilities {
    pub fn get(&self, key: &str) -> Option<&Feature> {
        self.features.iter().find(|(k, _)| k.key() == key).map(|(_, f)| f)
    }

    pub fn present(&self, key: &str) -> bool {
        self.get(key).is_some_and(|f| f.status == Status::Present)
    }

    /// The flat JSON object: `{"kernel_release": .., "root": .., "thp_enabled": {..}, ...}`,
    /// each capability with `used_by`: the features of `registry` that need it
    /// ([`features::users`]).
    pub fn to_json(&self, registry: &[&[features::Feature]]) -> serde_json::Value {
        let mut map = serde_json::Map::new();
        map.insert("kernel_release".into(), self.kernel_release.clone().into());
        map.insert("root".into(), self.root.into());
        for (k, f) in &self.features {
            let mut v = serde_json::to_value(f).expect("feature serialises");
            v["used_by"] = features::users(registry, *k).into();
            map.insert(k.key().into(), v);
        }
        serde_json::Value::Object(map)
    }
}

fn feature(status: Status, value: serde_json::Value, detail: impl Into<String>) -> Feature {
    Feature { status, value, detail: detail.into() }
}

fn from_err(e: &Error) -> Status {
    if e.is_not_found() {
        Status::Absent
    } else {
        Status::Unusable
    }
}

/// Probe everything. Never panics on a missing file; changes no setting.
pub fn probe() -> Capabilities {
    let mut f: Vec<(Capability, Feature)> = Vec::new();
    let kernel_release = read_trimmed("/proc/sys/kernel/osrelease").unwrap_or_else(|_| "unknown".into());
    // SAFETY: no preconditions.
    let root = unsafe { libc::geteuid() } == 0;

    f.push((
        Capability::ThpEnabled,
        match thp::ThpSetting::Enabled.read() {
            Ok(s) => feature(
                if s.active == "never" { Status::Unusable } else { Status::Present },
                s.active.clone().into(),
                format!("transparent_hugepage/enabled = {} (choices {})", s.active, s.choices.join(" ")),
            ),
            Err(e) => feature(from_err(&e), serde_json::Value::Null, e.to_string()),
        },
    ));
    f.push((
        Capability::ThpDefrag,
        match thp::ThpSetting::Defrag.read() {
            Ok(s) => feature(Status::Present, s.active.clone().into(), format!("defrag = {}", s.active)),
            Err(e) => feature(from_err(&e), serde_json::Value::Null, e.to_string()),
        },
    ));
    f.push((
        Capability::ThpShmemEnabled,
        match thp::ThpSetting::ShmemEnabled.read() {
            Ok(s) => feature(Status::Present, s.active.clone().into(), format!("shmem_enabled = {}", s.active)),
            Err(e) => feature(from_err(&e), serde_json::Value::Null, e.to_string()),
        },
    ));
    f.push((
        Capability::MthpSizesKb,
        match thp::mthp_sizes() {
            Ok(sizes) if !sizes.is_empty() => feature(
                Status::Present,
                sizes.iter().filter(|s| s.anon.is_some()).map(|s| s.bytes / 1024).collect::<Vec<_>>().into(),
                sizes
                    .iter()
                    .map(|s| {
                        let anon = s.anon.as_ref().map_or("-".to_string(), |a| a.active.clone());
                        let shmem = s.shmem.as_ref().map_or("-".to_string(), |a| a.active.clone());
                        format!("{}K anon:{anon} shmem:{shmem}", s.bytes / 1024)
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
            Ok(_) => feature(Status::Absent, serde_json::Value::Null, "no hugepages-<size> directories (Linux < 6.8)"),
            Err(e) => feature(from_err(&e), serde_json::Value::Null, e.to_string()),
        },
    ));
    f.push((
        Capability::HugetlbSizesKb,
        match thp::HugetlbPool::all() {
            Ok(pools) if !pools.is_empty() => feature(
                Status::Present,
                pools.iter().map(|p| p.page_size / 1024).collect::<Vec<_>>().into(),
                pools
                    .iter()
                    .map(|p| format!("{}K: {} reserved, {} free", p.page_size / 1024, p.nr_hugepages, p.free_hugepages))
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
            Ok(_) => feature(Status::Absent, serde_json::Value::Null, "no hugetlb page sizes"),
            Err(e) => feature(from_err(&e), serde_json::Value::Null, e.to_string()),
        },
    ));
    f.push((Capability::MadvCollapse, probe_collapse(false)));
    f.push((Capability::MadvCollapseShmem, probe_collapse(true)));
    f.push((Capability::TmpfsHuge, probe_tmpfs_huge()));
    f.push((Capability::ProcessMadvise, probe_process_madvise()));
    f.push((Capability::Userfaultfd, probe_uffd(root)));
    f.push((
        Capability::PageIdle,
        if crate::page_idle::available() {
            match crate::page_idle::PageIdle::open() {
                Ok(_) => feature(Status::Present, serde_json::Value::Null, "idle page tracking bitmap readable"),
                Err(e) => feature(Status::Unusable, serde_json::Value::Null, e.to_string()),
            }
        } else {
            feature(
                Status::Absent,
                serde_json::Value::Null,
                "no /sys/kernel/mm/page_idle (CONFIG_IDLE_PAGE_TRACKING off)",
            )
        },
    ));
    let (vaddr, paddr) = probe_damon();
    f.push((Capability::DamonVaddr, vaddr));
    f.push((Capability::DamonPaddr, paddr));
    f.push((Capability::PagemapScan, probe_pagemap_scan()));
    f.push((Capability::SoftDirty, probe_soft_dirty()));
    f.push((
        Capability::Kpageflags,
        match std::fs::File::open("/proc/kpageflags") {
            Ok(_) => feature(Status::Present, serde_json::Value::Null, "/proc/kpageflags readable"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                feature(Status::Absent, serde_json::Value::Null, "no /proc/kpageflags")
            }
            Err(e) => feature(Status::Unusable, serde_json::Value::Null, format!("/proc/kpageflags: {e}")),
        },
    ));
    f.push((
        Capability::CgroupV1Memory,
        match cgroup::v1_memory_root() {
            Some(p) => feature(
                Status::Present,
                p.display().to_string().into(),
                format!("memory controller mounted at {}", p.display()),
            ),
            None => {
                feature(Status::Absent, serde_json::Value::Null, "no cgroup v1 hierarchy with the memory controller")
            }
        },
    ));
    f.push((
        Capability::CgroupV2Memory,
        match (cgroup::v2_memory_root(), cgroup::v2_root()) {
            (Some(p), _) => feature(
                Status::Present,
                p.display().to_string().into(),
                format!("memory controller in {}", p.display()),
            ),
            (None, Some(p)) => feature(
                Status::Absent,
                serde_json::Value::Null,
                format!(
                    "cgroup2 at {} has no memory controller (it is bound to the v1 hierarchy): no memory.reclaim",
                    p.display()
                ),
            ),
            (None, None) => feature(Status::Absent, serde_json::Value::Null, "no cgroup2 mount"),
        },
    ));
    f.push((
        Capability::Psi,
        match read_trimmed("/proc/pressure/memory") {
            Ok(_) => feature(Status::Present, serde_json::Value::Null, "/proc/pressure/{cpu,io,memory}"),
            Err(e) => feature(from_err(&e), serde_json::Value::Null, e.to_string()),
        },
    ));
    f.push((Capability::TracefsVmscan, probe_tracefs()));
    f.push((
        Capability::Swap,
        match read_trimmed("/proc/swaps") {
            Ok(t) => {
                let devices = t.lines().skip(1).filter(|l| !l.trim().is_empty()).count();
                if devices == 0 {
                    feature(Status::Absent, 0.into(), "no swap devices: anonymous memory cannot be reclaimed")
                } else {
                    feature(Status::Present, devices.into(), format!("{devices} swap device(s)"))
                }
            }
            Err(e) => feature(from_err(&e), serde_json::Value::Null, e.to_string()),
        },
    ));
    f.push((
        Capability::ZoneinfoWatermarks,
        match crate::procfs::read_zoneinfo() {
            Ok(z) => feature(
                Status::Present,
                serde_json::Value::Null,
                format!("{} zones with min/low/high", z.iter().filter(|z| z.is_populated()).count()),
            ),
            Err(e) => feature(from_err(&e), serde_json::Value::Null, e.to_string()),
        },
    ));
    f.push((
        Capability::OnlineCpus,
        match crate::cpu::online_cpus() {
            Ok(c) => feature(Status::Present, crate::cpu::format_cpulist(&c).into(), format!("{} online", c.len())),
            Err(e) => feature(from_err(&e), serde_json::Value::Null, e.to_string()),
        },
    ));
    f.push((Capability::MlockLimitKb, {
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: lim is writable.
        unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) };
        let v = if lim.rlim_cur == libc::RLIM_INFINITY {
            serde_json::Value::from("unlimited")
        } else {
            (lim.rlim_cur / 1024).into()
        };
        let enough = root || lim.rlim_cur == libc::RLIM_INFINITY;
        feature(
            if enough { Status::Present } else { Status::Unusable },
            v,
            if root {
                "root: mlock is not limited by RLIMIT_MEMLOCK".to_string()
            } else {
                "RLIMIT_MEMLOCK limits mlockall of a protected task".to_string()
            },
        )
    }));
    f.push((
        Capability::FreePageReporting,
        match crate::page_reporting::probe() {
            Some(r) => feature(
                Status::Present,
                r.order.into(),
                format!(
                    "the host takes back free blocks of order {} and more{}: memory freed seconds ago \
                     costs host faults at its next first touch, hugepages most",
                    r.order,
                    if r.reported_kib_path.is_some() { " (reported_kib counts them)" } else { "" }
                ),
            ),
            None => feature(Status::Absent, serde_json::Value::Null, "no virtio balloon reporting free pages"),
        },
    ));
    Capabilities { kernel_release, root, features: f }
}

fn probe_collapse(shmem: bool) -> Feature {
    let mapping = if shmem {
        memfd_create("pagewise-probe", None).and_then(|fd| {
            ftruncate(&fd, HUGE_PMD as u64)?;
            Mapping::of_fd(&fd, HUGE_PMD, 0, &MapOptions { shared: true, align: Some(HUGE_PMD), ..Default::default() })
        })
    } else {
        Mapping::anonymous(HUGE_PMD, &MapOptions { align: Some(HUGE_PMD), ..Default::default() })
    };
    let m = match mapping {
        Ok(m) => m,
        Err(e) => return feature(Status::Unusable, serde_json::Value::Null, e.to_string()),
    };
    // SAFETY: the probe's own fresh mapping.
    unsafe { crate::mem::touch_pages(m.addr(), m.len()) };
    match m.advise(Advice::Collapse) {
        Ok(()) => {
            let what = if shmem { "memfd" } else { "anonymous" };
            feature(Status::Present, true.into(), format!("collapsed a 2 MiB {what} region synchronously"))
        }
        Err(e) if e.errno() == Some(libc::EINVAL) => feature(
            Status::Absent,
            false.into(),
            format!("{e} (needs Linux 6.1{})", if shmem { " and shmem THP" } else { "" }),
        ),
        Err(e) => feature(Status::Unusable, false.into(), format!("{e} (no free hugepage? memory fragmented?)")),
    }
}

/// A tmpfs of our own with huge=advise (`crate::tmpfs`): one touch of a 2 MiB range advised
/// MADV_HUGEPAGE brings in all 512 pages at once (one hugepage).
fn probe_tmpfs_huge() -> Feature {
    let fs = match crate::tmpfs::HugeTmpfs::new() {
        Ok(fs) => fs,
        Err(e) if e.errno() == Some(libc::EPERM) => {
            return feature(Status::Unusable, false.into(), format!("{e} (mounting needs CAP_SYS_ADMIN)"))
        }
        Err(e) => return feature(from_err(&e), false.into(), e.to_string()),
    };
    let opts = MapOptions { shared: true, align: Some(HUGE_PMD), ..Default::default() };
    let m = match fs.create("pagewise-probe", HUGE_PMD as u64).and_then(|fd| Mapping::of_fd(&fd, HUGE_PMD, 0, &opts)) {
        Ok(m) => m,
        Err(e) => return feature(Status::Unusable, false.into(), e.to_string()),
    };
    if let Err(e) = m.advise(Advice::HugePage) {
        return feature(Status::Unusable, false.into(), e.to_string());
    }
    // SAFETY: the probe's own fresh shared mapping.
    unsafe { (m.addr() as *mut u8).write(1) };
    let mut v = vec![0u8; HUGE_PMD / crate::mem::page_size()];
    let resident = crate::mem::mincore(m.addr(), HUGE_PMD, &mut v).map(|_| v.iter().filter(|&&b| b & 1 != 0).count());
    match resident {
        Ok(n) if n == v.len() => feature(
            Status::Present,
            true.into(),
            "a private huge=advise tmpfs gave a hugepage at the first touch of an advised 2 MiB range",
        ),
        Ok(n) => feature(
            Status::Unusable,
            false.into(),
            format!("the first touch brought in {n} of 512 pages: no hugepage (memory fragmented?)"),
        ),
        Err(e) => feature(Status::Unusable, false.into(), e.to_string()),
    }
}

fn probe_process_madvise() -> Feature {
    let pidfd = match crate::mem::pidfd_open(std::process::id() as i32) {
        Ok(p) => p,
        Err(e) => return feature(from_err(&e), serde_json::Value::Null, e.to_string()),
    };
    let m = match Mapping::anonymous(4096, &MapOptions::default()) {
        Ok(m) => m,
        Err(e) => return feature(Status::Unusable, serde_json::Value::Null, e.to_string()),
    };
    match crate::mem::process_madvise(&pidfd, &[(m.addr(), 4096)], Advice::Cold) {
        Ok(_) => {
            feature(Status::Present, serde_json::Value::Null, "MADV_COLD/PAGEOUT/COLLAPSE on other processes via pidfd")
        }
        Err(e) => feature(from_err(&e), serde_json::Value::Null, e.to_string()),
    }
}

fn probe_uffd(root: bool) -> Feature {
    match uffd::api_info() {
        Ok(info) => {
            let sysctl = read_trimmed("/proc/sys/vm/unprivileged_userfaultfd").unwrap_or_default();
            feature(
                Status::Present,
                info.feature_names.clone().into(),
                format!(
                    "API handshake ok, {} features{}",
                    info.feature_names.len(),
                    match (root, sysctl == "1") {
                        (_, true) => String::new(),
                        (true, false) => "; other users get only the user-mode-only kind (vm.unprivileged_userfaultfd = 0), \
                                          which `pagewise run` and `pagewise hps run` refuse unless /dev/userfaultfd is open to them"
                            .into(),
                        (false, false) => "; this user would get only the user-mode-only kind (vm.unprivileged_userfaultfd = 0), \
                                           which `pagewise run` and `pagewise hps run` refuse unless /dev/userfaultfd is open to it"
                            .into(),
                    }
                ),
            )
        }
        Err(e) => feature(from_err(&e), serde_json::Value::Null, format!("{e}; DLM falls back to PROT_NONE + SIGSEGV")),
    }
}

/// DAMON through sysfs (/sys/kernel/mm/damon/admin): which operation sets exist and whether a
/// kdamond is already running. A running kdamond belongs to someone else: reported busy, never
/// written to.
fn probe_damon() -> (Feature, Feature) {
    let admin = Path::new("/sys/kernel/mm/damon/admin/kdamonds");
    if !admin.exists() {
        let f = feature(Status::Absent, serde_json::Value::Null, "no DAMON sysfs interface");
        return (f.clone(), f);
    }
    let nr: usize = read_trimmed(admin.join("nr_kdamonds")).ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let mut ops: Vec<String> = Vec::new();
    let mut busy = Vec::new();
    for i in 0..nr {
        let k = admin.join(i.to_string());
        if read_trimmed(k.join("state")).is_ok_and(|s| s == "on") {
            busy.push(i);
        }
        if let Ok(avail) = read_trimmed(k.join("contexts/0/avail_operations")) {
            ops.extend(avail.split_whitespace().map(String::from));
        }
    }
    ops.sort();
    ops.dedup();
    let busy_text = if busy.is_empty() {
        "no kdamond running".to_string()
    } else {
        format!(
            "kdamond {} running (busy: belongs to the machine, left alone)",
            busy.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(",")
        )
    };
    let ops_known = !ops.is_empty();
    let one = |name: &str| {
        if ops_known && !ops.iter().any(|o| o == name) {
            feature(
                Status::Absent,
                serde_json::Value::Null,
                format!("operation set {name} not offered (avail: {})", ops.join(" ")),
            )
        } else if !busy.is_empty() || !ops_known {
            let detail = if ops_known {
                format!("{name} offered; {busy_text}")
            } else {
                format!("no context to read avail_operations from; {busy_text}")
            };
            feature(Status::Unusable, serde_json::Value::Null, detail)
        } else {
            feature(Status::Present, serde_json::Value::Null, format!("{name} offered; {busy_text}"))
        }
    };
    (one("vaddr"), one("paddr"))
}

/// Soft-dirty bits (CONFIG_MEM_SOFT_DIRTY). /proc/PID/clear_refs accepts "4" whether or not
/// the kernel tracks soft-dirty, so look at the bit itself: a freshly written page of a kernel
/// with soft-dirty has pagemap bit 55 set.
fn probe_soft_dirty() -> Feature {
    let m = match Mapping::anonymous(4096, &MapOptions::default()) {
        Ok(m) => m,
        Err(e) => return feature(Status::Unusable, serde_json::Value::Null, e.to_string()),
    };
    // SAFETY: the probe's own fresh mapping.
    unsafe { crate::mem::touch_pages(m.addr(), m.len()) };
    match crate::procfs::Pagemap::open(crate::procfs::Pid::SelfProcess).and_then(|p| p.read_raw(m.addr(), 1)) {
        Ok(e) if e[0] & crate::procfs::PAGEMAP_SOFT_DIRTY != 0 => {
            feature(Status::Present, serde_json::Value::Null, "written pages show the soft-dirty bit")
        }
        Ok(_) => feature(
            Status::Absent,
            serde_json::Value::Null,
            "a written page has no soft-dirty bit (CONFIG_MEM_SOFT_DIRTY off); PAGEMAP_SCAN covers writes",
        ),
        Err(e) => feature(from_err(&e), serde_json::Value::Null, e.to_string()),
    }
}

fn probe_pagemap_scan() -> Feature {
    let scanner = match pagemap_scan::PagemapScanner::open(crate::procfs::Pid::SelfProcess) {
        Ok(s) => s,
        Err(e) => return feature(from_err(&e), serde_json::Value::Null, e.to_string()),
    };
    let m = match Mapping::anonymous(4096, &MapOptions::default()) {
        Ok(m) => m,
        Err(e) => return feature(Status::Unusable, serde_json::Value::Null, e.to_string()),
    };
    let q = pagemap_scan::ScanQuery { required: pagemap_scan::category::PRESENT, ..Default::default() };
    let mut out = Vec::with_capacity(4);
    match scanner.scan(m.addr(), m.addr() + 4096, &q, &mut out) {
        Ok(_) => feature(Status::Present, serde_json::Value::Null, "ioctl(PAGEMAP_SCAN) works (Linux 6.7)"),
        Err(e) if matches!(e.errno(), Some(libc::ENOTTY) | Some(libc::EINVAL)) => {
            feature(Status::Absent, serde_json::Value::Null, format!("{e} (needs Linux 6.7)"))
        }
        Err(e) => feature(Status::Unusable, serde_json::Value::Null, e.to_string()),
    }
}

fn probe_tracefs() -> Feature {
    let events = [
        "mm_vmscan_direct_reclaim_begin",
        "mm_vmscan_direct_reclaim_end",
        "mm_vmscan_memcg_reclaim_begin",
        "mm_vmscan_memcg_reclaim_end",
        "mm_vmscan_wakeup_kswapd",
        "mm_vmscan_kswapd_wake",
        "mm_shrink_slab_start",
        "mm_shrink_slab_end",
    ];
    if let Some(root) = tracefs::mounted() {
        let have: Vec<&str> = events.iter().copied().filter(|e| tracefs::event_exists(&root, "vmscan", e)).collect();
        let status = if have.len() == events.len() {
            Status::Present
        } else if have.is_empty() {
            Status::Absent
        } else {
            Status::Unusable
        };
        return feature(
            status,
            have.clone().into(),
            format!("tracefs at {}, {}/{} vmscan events", root.display(), have.len(), events.len()),
        );
    }
    if !tracefs::supported() {
        return feature(Status::Absent, serde_json::Value::Null, "kernel has no tracefs");
    }
    // Not mounted, and the doctor does not mount: look for the tracepoints in kallsyms.
    let have: Vec<&str> = std::fs::read_to_string("/proc/kallsyms")
        .map(|syms| {
            events
                .iter()
                .copied()
                .filter(|e| {
                    syms.contains(&format!("__traceiter_{e}\n")) || syms.contains(&format!("__tracepoint_{e}\n"))
                })
                .collect()
        })
        .unwrap_or_default();
    if have.is_empty() {
        return feature(
            Status::Unusable,
            serde_json::Value::Null,
            "tracefs not mounted and tracepoints not visible in /proc/kallsyms",
        );
    }
    let status = if have.len() == events.len() { Status::Present } else { Status::Unusable };
    feature(
        status,
        have.clone().into(),
        format!(
            "tracefs not mounted (Pagewise mounts it when needed); {}/{} vmscan tracepoints in kallsyms",
            have.len(),
            events.len()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_reports_every_capability_once_in_order() {
        let caps = probe();
        let keys: Vec<Capability> = caps.features.iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, Capability::ALL.to_vec());
    }

    #[test]
    fn probe_never_panics_and_keys_are_stable() {
        let caps = probe();
        const REG: &[features::Feature] =
            &[features::Feature { name: "t", needs: &[Capability::Swap, Capability::Userfaultfd] }];
        let json = caps.to_json(&[REG]);
        assert_eq!(json["swap"]["used_by"], serde_json::json!(["t"]));
        assert_eq!(json["psi"]["used_by"], serde_json::json!([]));
        for key in [
            "thp_enabled",
            "madv_collapse",
            "userfaultfd",
            "page_idle",
            "damon_vaddr",
            "pagemap_scan",
            "cgroup_v1_memory",
            "cgroup_v2_memory",
            "psi",
            "tracefs_vmscan",
            "hugetlb_sizes_kb",
            "swap",
        ] {
            assert!(json.get(key).and_then(|f| f.get("status")).is_some(), "missing {key}");
        }
    }
}
