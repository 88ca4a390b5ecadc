//! Which Pagewise feature needs which kernel capability: the one list `pagewise doctor`'s
//! "used by" column is derived from, so the doctor can only name features that exist.
//!
//! A [`Capability`] is one row of the capability probe ([`crate::probe`]). A [`Feature`] is
//! something a user runs or links (a command, a C API family, an experiment) together with the
//! capabilities it relies on. Each crate declares its features next to the code, as one
//! `pub const FEATURES: &[Feature]` in its lib.rs, and the `pagewise` binary gathers those
//! slices; adding a feature is one entry there. Because capabilities are an enum, a feature
//! cannot name a probe row that does not exist, and the probe cannot drop a row a feature
//! needs without the build failing.

use serde::Serialize;

/// One capability the probe reports, by its stable snake_case key (`pagewise doctor --json`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Capability {
    ThpEnabled,
    ThpDefrag,
    ThpShmemEnabled,
    MthpSizesKb,
    HugetlbSizesKb,
    MadvCollapse,
    MadvCollapseShmem,
    TmpfsHuge,
    ProcessMadvise,
    Userfaultfd,
    PageIdle,
    DamonVaddr,
    DamonPaddr,
    PagemapScan,
    SoftDirty,
    Kpageflags,
    CgroupV1Memory,
    CgroupV2Memory,
    Psi,
    TracefsVmscan,
    Swap,
    ZoneinfoWatermarks,
    OnlineCpus,
    MlockLimitKb,
    FreePageReporting,
}

impl Capability {
    /// Every capability, in the order the probe reports them.
    pub const ALL: [Capability; 25] = [
        Capability::ThpEnabled,
        Capability::ThpDefrag,
        Capability::ThpShmemEnabled,
        Capability::MthpSizesKb,
        Capability::HugetlbSizesKb,
        Capability::MadvCollapse,
        Capability::MadvCollapseShmem,
        Capability::TmpfsHuge,
        Capability::ProcessMadvise,
        Capability::Userfaultfd,
        Capability::PageIdle,
        Capability::DamonVaddr,
        Capability::DamonPaddr,
        Capability::PagemapScan,
        Capability::SoftDirty,
        Capability::Kpageflags,
        Capability::CgroupV1Memory,
        Capability::CgroupV2Memory,
        Capability::Psi,
        Capability::TracefsVmscan,
        Capability::Swap,
        Capability::ZoneinfoWatermarks,
        Capability::OnlineCpus,
        Capability::MlockLimitKb,
        Capability::FreePageReporting,
    ];

    /// The stable key (`thp_enabled`, `userfaultfd`, ...).
    pub fn key(self) -> &'static str {
        match self {
            Capability::ThpEnabled => "thp_enabled",
            Capability::ThpDefrag => "thp_defrag",
            Capability::ThpShmemEnabled => "thp_shmem_enabled",
            Capability::MthpSizesKb => "mthp_sizes_kb",
            Capability::HugetlbSizesKb => "hugetlb_sizes_kb",
            Capability::MadvCollapse => "madv_collapse",
            Capability::MadvCollapseShmem => "madv_collapse_shmem",
            Capability::TmpfsHuge => "tmpfs_huge",
            Capability::ProcessMadvise => "process_madvise",
            Capability::Userfaultfd => "userfaultfd",
            Capability::PageIdle => "page_idle",
            Capability::DamonVaddr => "damon_vaddr",
            Capability::DamonPaddr => "damon_paddr",
            Capability::PagemapScan => "pagemap_scan",
            Capability::SoftDirty => "soft_dirty",
            Capability::Kpageflags => "kpageflags",
            Capability::CgroupV1Memory => "cgroup_v1_memory",
            Capability::CgroupV2Memory => "cgroup_v2_memory",
            Capability::Psi => "psi",
            Capability::TracefsVmscan => "tracefs_vmscan",
            Capability::Swap => "swap",
            Capability::ZoneinfoWatermarks => "zoneinfo_watermarks",
            Capability::OnlineCpus => "online_cpus",
            Capability::MlockLimitKb => "mlock_limit_kb",
            Capability::FreePageReporting => "free_page_reporting",
        }
    }
}

/// A user-facing Pagewise feature and the kernel capabilities it relies on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Feature {
    /// What the user runs or links, as they would type it (`pagewise reclaimd`, `hps_* C API`).
    pub name: &'static str,
    /// The capabilities it uses (any one of alternatives such as cgroup v1/v2 is listed too).
    pub needs: &'static [Capability],
}

/// The names of the features in `registry` that need `cap`, in registry order, each once.
pub fn users(registry: &[&[Feature]], cap: Capability) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = Vec::new();
    for f in registry.iter().flat_map(|slice| slice.iter()) {
        if f.needs.contains(&cap) && !names.contains(&f.name) {
            names.push(f.name);
        }
    }
    names
}

/// Problems with a registry: a feature registered twice, an empty name, a feature that needs
/// nothing (it has no business in the doctor), a capability listed twice by one feature.
pub fn check(registry: &[&[Feature]]) -> Vec<String> {
    let mut problems = Vec::new();
    let all: Vec<&Feature> = registry.iter().flat_map(|s| s.iter()).collect();
    for (i, f) in all.iter().enumerate() {
        if f.name.trim().is_empty() {
            problems.push(format!("feature #{i} has an empty name"));
        }
        if f.needs.is_empty() {
            problems.push(format!("{} needs no kernel capability", f.name));
        }
        if all[..i].iter().any(|g| g.name == f.name) {
            problems.push(format!("{} is registered twice", f.name));
        }
        for (j, c) in f.needs.iter().enumerate() {
            if f.needs[..j].contains(c) {
                problems.push(format!("{} lists {} twice", f.name, c.key()));
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_unique_and_match_the_serialized_name() {
        let mut keys: Vec<&str> = Capability::ALL.iter().map(|c| c.key()).collect();
        for c in Capability::ALL {
            assert_eq!(serde_json::to_value(c).unwrap(), serde_json::Value::from(c.key()));
        }
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), Capability::ALL.len());
    }

    const A: &[Feature] = &[
        Feature { name: "a", needs: &[Capability::Userfaultfd, Capability::Psi] },
        Feature { name: "b", needs: &[Capability::Psi] },
    ];
    const B: &[Feature] = &[Feature { name: "c", needs: &[Capability::Swap] }];

    #[test]
    fn users_are_the_features_that_need_the_capability_in_registry_order() {
        assert_eq!(users(&[A, B], Capability::Psi), vec!["a", "b"]);
        assert_eq!(users(&[A, B], Capability::Swap), vec!["c"]);
        assert!(users(&[A, B], Capability::Kpageflags).is_empty());
        assert!(check(&[A, B]).is_empty());
    }

    #[test]
    fn check_names_duplicates_and_empty_features() {
        const BAD: &[Feature] =
            &[Feature { name: "a", needs: &[Capability::Swap, Capability::Swap] }, Feature { name: " ", needs: &[] }];
        let p = check(&[A, BAD]);
        assert!(p.iter().any(|m| m == "a is registered twice"), "{p:?}");
        assert!(p.iter().any(|m| m == "a lists swap twice"), "{p:?}");
        assert!(p.iter().any(|m| m.contains("empty name")), "{p:?}");
        assert!(p.iter().any(|m| m.contains("needs no kernel capability")), "{p:?}");
    }
}
