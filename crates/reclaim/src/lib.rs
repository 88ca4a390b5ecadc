//! # pagewise-reclaim: per-core reclaim and split reclaim in user space
//!
//! Seeds 002 (per-core page reclaim) and 004 (split reclaim), on a stock kernel.
//!
//! - [`policy`]: pure arithmetic: per-core thresholds with the paper's semantics and the
//!   kernel's rounding, the worker's hysteresis, the split-reclaim triggers.
//! - [`config`]: the TOML configuration with cpulist roles, validated with errors naming keys.
//! - [`daemon`]: reclaimd: workers pinned to the reclaim cores that watch free memory (zones or
//!   a cgroup's headroom) and reclaim in their own context, so on their own core.
//! - [`tree`]: the `/run/pagewise/percpu_free_mem/cpuN` files, read and written live.
//! - [`stats`]: per-core statistics from the vmscan trace events.
//! - [`threshold`]: the worker's cgroup-v1 usage threshold, moved by a helper thread.
//!
//! Why user space can do this at all: every proactive reclaim interface of Linux reclaims in
//! the *writer's* context (cgroup v2 memory.reclaim, cgroup v1 limit lowering, posix_fadvise
//! DONTNEED, drop_caches). A worker pinned to core 0 that keeps free memory above the kernel's
//! triggers therefore moves the reclaim work to core 0: the protected cores' allocations find
//! memory free and never enter reclaim themselves.

pub mod capi;
pub mod config;
pub mod daemon;
pub mod policy;
pub mod stats;
pub mod threshold;
pub mod tree;

use pagewise_kernel::features::{Capability, Feature};

/// What this crate offers a user and the kernel capabilities each part uses (`pagewise doctor`).
pub const FEATURES: &[Feature] = &[
    Feature {
        name: "pagewise reclaimd (cgroup scope)",
        needs: &[Capability::CgroupV1Memory, Capability::CgroupV2Memory, Capability::Psi, Capability::OnlineCpus],
    },
    Feature {
        name: "pagewise reclaimd (system scope)",
        needs: &[Capability::ZoneinfoWatermarks, Capability::Psi, Capability::OnlineCpus],
    },
    Feature { name: "pagewise reclaim show", needs: &[Capability::ZoneinfoWatermarks] },
    Feature { name: "pagewise reclaim stat", needs: &[Capability::TracefsVmscan] },
    Feature { name: "pw_reclaim_protect_self", needs: &[Capability::OnlineCpus, Capability::MlockLimitKb] },
];
