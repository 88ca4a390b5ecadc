//! The reclaimd configuration (TOML), validated against the online CPUs.
//!
//! ```toml
//! scope = "cgroup"                               # or "system"
//! cgroup = "/sys/fs/cgroup/memory/pagewise-app"  # the group to keep below its limit
//! # reclaim_cgroup = ".../pagewise-app/batch"    # optional: reclaim only from this child
//! interval_ms = 20                               # timer wake-up; PSI wakes the workers earlier
//! batch_kb = 4096                                # most reclaimed per step
//!
//! [roles]
//! protect = "1-15"   # application cores: thresholds at which reclaim never happens
//! reclaim = "0"      # reclaim cores: one pinned worker each
//!
//! [cores."0"]        # keys are cpulists: "1-15" sets fifteen cores in one line
//! min_free_kbytes = 12288
//! pages_low_ratio = 240
//! pages_high_ratio = 400
//! ```
//! Every error names the key it is about.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use pagewise_kernel::cpu::{format_cpulist, parse_cpulist};
use serde::{Deserialize, Serialize};

use crate::policy::{CoreThresholds, PerCoreTable, DEFAULT_HIGH_RATIO, DEFAULT_LOW_RATIO, MAX_MIN_FREE_KBYTES};

/// The largest size in KiB any `*_kb` key takes (1 PiB): every byte count derived from one
/// (× 1024) stays far inside u64.
pub const MAX_KB: u64 = 1 << 40;

/// A configuration the daemon refuses, naming the key.
#[derive(Debug, thiserror::Error)]
#[error("config key `{key}`: {message}")]
pub struct ConfigError {
    pub key: String,
    pub message: String,
}

fn err(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError { key: key.into(), message: message.into() }
}

/// What the daemon watches.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScopeKind {
    System,
    Cgroup,
}

/// One `[cores."LIST"]` table; omitted ratios take the defaults.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCore {
    pub min_free_kbytes: u64,
    #[serde(default = "default_low")]
    pub pages_low_ratio: u32,
    #[serde(default = "default_high")]
    pub pages_high_ratio: u32,
}

fn default_low() -> u32 {
    DEFAULT_LOW_RATIO
}
fn default_high() -> u32 {
    DEFAULT_HIGH_RATIO
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawRoles {
    #[serde(default)]
    pub protect: Option<String>,
    #[serde(default)]
    pub reclaim: Option<String>,
}

/// `[split]`: split reclaim (seed 004).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSplit {
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Page reclaim starts at or below this much free memory (default: the reclaim core's low).
    pub pstart_kb: Option<u64>,
    /// Sstart in % of the scope's memory (default 50).
    pub sstart_percent: Option<u32>,
    /// Sstart in KiB (overrides sstart_percent).
    pub sstart_kb: Option<u64>,
    /// Slab reclaimed per batch.
    #[serde(default = "default_slab_batch")]
    pub slab_batch_kb: u64,
    /// vfs_cache_pressure while the daemon runs (restored by the guard); unset: untouched.
    pub vfs_cache_pressure: Option<u32>,
    /// vfs_cache_pressure during the worker's own slab batches.
    #[serde(default = "default_slab_pressure")]
    pub slab_pass_pressure: u32,
}

fn yes() -> bool {
    true
}
fn default_slab_batch() -> u64 {
    4096
}
fn default_slab_pressure() -> u32 {
    1000
}

/// The file as written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(default = "default_scope")]
    pub scope: ScopeKind,
    pub cgroup: Option<PathBuf>,
    /// Reclaim from this group (a descendant of `cgroup`, e.g. the batch work's) instead of
    /// `cgroup` itself. On cgroup v1 reclaim lowers the limit of the group it reclaims from,
    /// so any task charging to that group meanwhile reclaims itself; reclaiming from the
    /// pressure's own child keeps the protected sibling's charges away from the lowered limit.
    pub reclaim_cgroup: Option<PathBuf>,
    /// With `reclaim_cgroup`: memory of `cgroup` the reclaim group may never charge. The
    /// daemon gives the reclaim group a standing limit of `cgroup`'s limit minus this, so a
    /// pressure that outruns the worker meets its own group's limit (and reclaims on its own
    /// core) before `cgroup` is full: the protected siblings' charges never find it full.
    /// Default: the first reclaim core's pages_low (min_free_kbytes × pages_low_ratio / 100).
    pub protected_reserve_kb: Option<u64>,
    #[serde(default = "default_interval")]
    pub interval_ms: u64,
    #[serde(default = "default_batch")]
    pub batch_kb: u64,
    /// Write the sum of the cores' mins to /proc/sys/vm/min_free_kbytes while running.
    #[serde(default)]
    pub apply_global: bool,
    /// Start every core from this global value (default: the kernel's current one).
    pub global_min_free_kbytes: Option<u64>,
    /// Expose /run/pagewise/percpu_free_mem (default true).
    #[serde(default = "yes")]
    pub tree: bool,
    /// Pin kswapd to the reclaim cores while running (default true; restored on exit).
    #[serde(default = "yes")]
    pub pin_kswapd: bool,
    /// System scope: directories whose files' page cache may be dropped (cold files first).
    #[serde(default)]
    pub cache_paths: Vec<PathBuf>,
    /// System scope: allow drop_caches when nothing else frees enough.
    #[serde(default)]
    pub drop_caches_last_resort: bool,
    /// PSI trigger stall in ms over a 2 s window (this VM refuses windows that are not
    /// multiples of 2 s).
    #[serde(default = "default_psi_stall")]
    pub psi_stall_ms: u64,
    /// SCHED_FIFO priority of the workers (0: normal scheduling). With a priority a worker's
    /// timer or PSI wake-up preempts the work on its core at once.
    #[serde(default)]
    pub worker_rt_priority: u8,
    /// Longest one reclaim pass may run (ms): the kernel's cgroup-v1 resize loop chases a
    /// group whose tasks keep charging; a pass that overruns is cut and the next one follows.
    #[serde(default = "default_pass_ms")]
    pub pass_ms: u64,
    /// Cgroup scope: the most headroom the worker's rate sizing may keep free, in % of the
    /// group's limit (the configured low/high watermarks are kept even when above it). Every
    /// page kept free is a page of cache the workload does not have.
    #[serde(default = "default_max_headroom_percent")]
    pub max_headroom_percent: u32,
    /// Cgroup scope: the group's composition (memory.stat) is read at most this often (ms),
    /// and only before a reclaim step; in between it is estimated from usage. Reading
    /// memory.stat flushes the group's statistics, which the kernel's own active/inactive
    /// balancing reads: read every few ms, they changed which pages the group kept.
    #[serde(default = "default_stat_interval_ms")]
    pub stat_interval_ms: u64,
    #[serde(default)]
    pub roles: RawRoles,
    #[serde(default)]
    pub cores: BTreeMap<String, RawCore>,
    pub split: Option<RawSplit>,
}

fn default_scope() -> ScopeKind {
    ScopeKind::System
}
fn default_interval() -> u64 {
    20
}
fn default_batch() -> u64 {
    4096
}
fn default_pass_ms() -> u64 {
    10
}
fn default_max_headroom_percent() -> u32 {
    10
}
fn default_stat_interval_ms() -> u64 {
    2000
}
fn default_psi_stall() -> u64 {
    50
}

/// Split-reclaim settings after validation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitConfig {
    pub pstart_kb: Option<u64>,
    pub sstart_percent: u32,
    pub sstart_kb: Option<u64>,
    pub slab_batch_kb: u64,
    pub vfs_cache_pressure: Option<u32>,
    pub slab_pass_pressure: u32,
}

/// A validated configuration.
#[derive(Clone, Debug)]
pub struct Config {
    pub raw: RawConfig,
    pub scope: ScopeKind,
    pub cgroup: Option<PathBuf>,
    pub table: PerCoreTable,
    pub protect: BTreeSet<usize>,
    pub reclaim: BTreeSet<usize>,
    pub interval: Duration,
    pub batch_kb: u64,
    pub split: Option<SplitConfig>,
}

impl Config {
    /// Parse and validate `text` against the online CPUs; `kernel_min_free_kbytes` is the
    /// starting global value when the file gives none.
    pub fn parse(text: &str, online: &BTreeSet<usize>, kernel_min_free_kbytes: u64) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let span = e.span().map(|s| format!(" at bytes {}..{}", s.start, s.end)).unwrap_or_default();
            err("(file)", format!("{}{span}", e.message()))
        })?;
        Self::from_raw(raw, online, kernel_min_free_kbytes)
    }

    pub fn from_raw(
        raw: RawConfig,
        online: &BTreeSet<usize>,
        kernel_min_free_kbytes: u64,
    ) -> Result<Config, ConfigError> {
        let cpus_of = |key: &str, text: &str| -> Result<BTreeSet<usize>, ConfigError> {
            let set = parse_cpulist(text).map_err(|e| err(key, e.to_string()))?;
            if set.is_empty() {
                return Err(err(key, "empty cpulist"));
            }
            if let Some(c) = set.iter().find(|c| !online.contains(c)) {
                return Err(err(key, format!("cpu {c} is not online (online: {})", format_cpulist(online))));
            }
            Ok(set)
        };
        let protect = match &raw.roles.protect {
            Some(t) => cpus_of("roles.protect", t)?,
            None => BTreeSet::new(),
        };
        let reclaim = match &raw.roles.reclaim {
            Some(t) => cpus_of("roles.reclaim", t)?,
            None => return Err(err("roles.reclaim", "missing: name the reclaim core(s), e.g. reclaim = \"0\"")),
        };
        if let Some(c) = protect.intersection(&reclaim).next() {
            return Err(err("roles", format!("cpu {c} is in both protect and reclaim")));
        }
        if let Some(kb) = raw.global_min_free_kbytes.filter(|&kb| kb > MAX_MIN_FREE_KBYTES) {
            return Err(err("global_min_free_kbytes", format!("{kb} is above the maximum {MAX_MIN_FREE_KBYTES}")));
        }
        let kb_keys = [
            ("batch_kb", Some(raw.batch_kb)),
            ("protected_reserve_kb", raw.protected_reserve_kb),
            ("split.pstart_kb", raw.split.as_ref().and_then(|s| s.pstart_kb)),
            ("split.sstart_kb", raw.split.as_ref().and_then(|s| s.sstart_kb)),
            ("split.slab_batch_kb", raw.split.as_ref().map(|s| s.slab_batch_kb)),
        ];
        if let Some((key, kb)) = kb_keys.iter().find_map(|(k, v)| v.filter(|&kb| kb > MAX_KB).map(|kb| (k, kb))) {
            return Err(err(*key, format!("{kb} is above the maximum {MAX_KB}")));
        }
        let mut table = PerCoreTable::uniform(online, raw.global_min_free_kbytes.unwrap_or(kernel_min_free_kbytes));
        let mut claimed: BTreeMap<usize, String> = BTreeMap::new();
        for (list, core) in &raw.cores {
            let key = format!("cores.\"{list}\"");
            let set = cpus_of(&key, list)?;
            if let Some((c, other)) = set.iter().find_map(|c| claimed.get(c).map(|o| (c, o.clone()))) {
                return Err(err(&key, format!("cpu {c} is already set by cores.\"{other}\"")));
            }
            claimed.extend(set.iter().map(|&c| (c, list.clone())));
            let t = CoreThresholds {
                min_free_kbytes: core.min_free_kbytes,
                pages_low_ratio: core.pages_low_ratio,
                pages_high_ratio: core.pages_high_ratio,
            };
            t.validate().map_err(|e| {
                let sub = match e {
                    crate::policy::PolicyError::RatioBelow100 { key, .. }
                    | crate::policy::PolicyError::TooLarge { key, .. } => format!(".{key}"),
                    _ => ".pages_high_ratio".into(),
                };
                err(format!("{key}{sub}"), e.to_string())
            })?;
            table.set_cores(&set, t).map_err(|e| err(&key, e.to_string()))?;
        }
        if raw.scope == ScopeKind::Cgroup && raw.cgroup.is_none() {
            return Err(err("cgroup", "scope = \"cgroup\" needs cgroup = \"/sys/fs/cgroup/memory/GROUP\""));
        }
        if let (Some(watch), Some(from)) = (&raw.cgroup, &raw.reclaim_cgroup) {
            if !from.starts_with(watch) || from == watch {
                return Err(err("reclaim_cgroup", "must be a group below `cgroup`"));
            }
        }
        if raw.protected_reserve_kb.is_some() && raw.reclaim_cgroup.is_none() {
            return Err(err("protected_reserve_kb", "only applies with reclaim_cgroup"));
        }
        if raw.reclaim_cgroup.is_some() && raw.scope != ScopeKind::Cgroup {
            return Err(err("reclaim_cgroup", "only applies to scope = \"cgroup\""));
        }
        if raw.interval_ms == 0 || raw.interval_ms > 10_000 {
            return Err(err("interval_ms", format!("{} is outside 1..=10000", raw.interval_ms)));
        }
        if raw.pass_ms == 0 || raw.pass_ms > 10_000 {
            return Err(err("pass_ms", format!("{} is outside 1..=10000", raw.pass_ms)));
        }
        if raw.stat_interval_ms == 0 || raw.stat_interval_ms > 60_000 {
            return Err(err("stat_interval_ms", format!("{} is outside 1..=60000", raw.stat_interval_ms)));
        }
        if raw.max_headroom_percent == 0 || raw.max_headroom_percent > 50 {
            return Err(err("max_headroom_percent", format!("{} is outside 1..=50", raw.max_headroom_percent)));
        }
        if raw.worker_rt_priority > 99 {
            return Err(err("worker_rt_priority", format!("{} is outside 0..=99", raw.worker_rt_priority)));
        }
        if raw.batch_kb < 4 {
            return Err(err("batch_kb", "must be at least one page (4)"));
        }
        let split = match &raw.split {
            Some(s) if s.enabled => {
                let pct = s.sstart_percent.unwrap_or(50);
                if pct == 0 || pct > 100 {
                    return Err(err("split.sstart_percent", format!("{pct} is outside 1..=100")));
                }
                if s.slab_batch_kb < 4 {
                    return Err(err("split.slab_batch_kb", "must be at least one page (4)"));
                }
                Some(SplitConfig {
                    pstart_kb: s.pstart_kb,
                    sstart_percent: pct,
                    sstart_kb: s.sstart_kb,
                    slab_batch_kb: s.slab_batch_kb,
                    vfs_cache_pressure: s.vfs_cache_pressure,
                    slab_pass_pressure: s.slab_pass_pressure,
                })
            }
            _ => None,
        };
        Ok(Config {
            scope: raw.scope.clone(),
            cgroup: raw.cgroup.clone(),
            table,
            protect,
            reclaim,
            interval: Duration::from_millis(raw.interval_ms),
            batch_kb: raw.batch_kb,
            split,
            raw,
        })
    }

    /// The file text again (comments are not kept).
    pub fn to_toml(raw: &RawConfig) -> String {
        toml::to_string(raw).expect("RawConfig serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn online() -> BTreeSet<usize> {
        (0..16).collect()
    }

    const PAPER: &str = r#"
scope = "cgroup"
cgroup = "/sys/fs/cgroup/memory/pagewise-x"
[roles]
protect = "1-15"
reclaim = "0"
[cores."0"]
min_free_kbytes = 12288
pages_low_ratio = 240
pages_high_ratio = 400
[cores."1-15"]
min_free_kbytes = 256
pages_low_ratio = 3300
pages_high_ratio = 4000
"#;

    #[test]
    fn paper_config_parses() {
        let c = Config::parse(PAPER, &online(), 67584).unwrap();
        assert_eq!(c.reclaim, BTreeSet::from([0]));
        assert_eq!(c.protect.len(), 15);
        assert_eq!(c.table.get(0).unwrap().pages_low_ratio, 240);
        assert_eq!(c.table.get(15).unwrap().pages_high_ratio, 4000);
        assert_eq!(c.table.global_min_free_kbytes(), 12288 + 15 * 256);
        // Serializing and parsing again gives the same table.
        let again = Config::parse(&Config::to_toml(&c.raw), &online(), 1).unwrap();
        assert_eq!(again.table, c.table);
    }

    fn error_of(text: &str) -> String {
        Config::parse(text, &online(), 1000).unwrap_err().to_string()
    }

    #[test]
    fn bad_configs_name_their_key() {
        let e = error_of("[roles]\nreclaim = \"0\"\n[cores.\"16\"]\nmin_free_kbytes = 1\n");
        assert!(e.contains("cores.\"16\"") && e.contains("cpu 16 is not online"), "{e}");
        let e = error_of("[roles]\nprotect = \"0-3\"\nreclaim = \"3\"\n");
        assert!(e.contains("`roles`") && e.contains("cpu 3 is in both"), "{e}");
        let e = error_of("[roles]\nreclaim = \"0\"\n[cores.\"1\"]\nmin_free_kbytes = 1\npages_low_ratio = 90\n");
        assert!(e.contains("cores.\"1\".pages_low_ratio") && e.contains("below 100"), "{e}");
        let e = error_of(
            "[roles]\nreclaim = \"0\"\n[cores.\"1-3\"]\nmin_free_kbytes = 1\n[cores.\"3\"]\nmin_free_kbytes = 2\n",
        );
        assert!(e.contains("already set by"), "{e}");
        let e = error_of("[roles]\nprotect = \"1\"\n");
        assert!(e.contains("roles.reclaim"), "{e}");
        let e = error_of("bogus = 1\n[roles]\nreclaim = \"0\"\n");
        assert!(e.contains("bogus"), "{e}");
        let e = error_of(
            "scope = \"cgroup\"\ncgroup = \"/sys/fs/cgroup/memory/a\"\nreclaim_cgroup = \"/sys/fs/cgroup/memory/b\"\n[roles]\nreclaim = \"0\"\n",
        );
        assert!(e.contains("reclaim_cgroup") && e.contains("below"), "{e}");
        let e = error_of("scope = \"cgroup\"\n[roles]\nreclaim = \"0\"\n");
        assert!(e.contains("`cgroup`"), "{e}");
        let e = error_of("[roles]\nreclaim = \"0-x\"\n");
        assert!(e.contains("roles.reclaim"), "{e}");
        let e = error_of("[roles]\nreclaim = \"0\"\n[split]\nsstart_percent = 0\n");
        assert!(e.contains("split.sstart_percent"), "{e}");
        let e = error_of("[roles]\nreclaim = \"0\"\n[cores.\"1\"]\nmin_free_kbytes = 18446744073709551615\n");
        assert!(e.contains("cores.\"1\".min_free_kbytes") && e.contains("maximum"), "{e}");
        let e =
            error_of("[roles]\nreclaim = \"0\"\n[cores.\"1\"]\nmin_free_kbytes = 1\npages_high_ratio = 4000000000\n");
        assert!(e.contains("cores.\"1\".pages_high_ratio") && e.contains("maximum"), "{e}");
        let e = error_of("global_min_free_kbytes = 4294967296\n[roles]\nreclaim = \"0\"\n");
        assert!(e.contains("global_min_free_kbytes"), "{e}");
        let e = error_of("batch_kb = 18446744073709551615\n[roles]\nreclaim = \"0\"\n");
        assert!(e.contains("batch_kb") && e.contains("maximum"), "{e}");
        let e = error_of(
            "[roles]\nreclaim = \"0\"\n[cores.\"0\"]\nmin_free_kbytes = 2147483647\n[cores.\"1\"]\nmin_free_kbytes = 2147483647\n",
        );
        assert!(e.contains("sum"), "{e}");
        let e = error_of("stat_interval_ms = 0\n[roles]\nreclaim = \"0\"\n");
        assert!(e.contains("stat_interval_ms"), "{e}");
        let e = error_of("protected_reserve_kb = 1024\n[roles]\nreclaim = \"0\"\n");
        assert!(e.contains("protected_reserve_kb"), "{e}");
    }
}
