//! # pagewise-hugepage: HPS — hot pages get hugepages, cold pages don't (seed 000)
//!
//! What it decides, from what signal, and why:
//! - **Signal**: per-page access counts from [`pagewise_track`] (userfaultfd-minor emulation of
//!   the accessed bit over memory the application got from [`Hps::alloc`]).
//! - **Decision** ([`policy`], pure): per 2 MiB region, promote when at least a quarter of its
//!   pages are active; otherwise the active pages go to the application's compaction callback,
//!   which moves the objects on them onto hugepage-backed memory ([`compact::HugeArena`]).
//!   The application may override the rule per region.
//! - **Promotion** ([`promote`]): MADV_COLLAPSE, synchronous, behind a latency guard with
//!   backoff ([`policy::Backoff`]).
//! - **Notification** ([`Hps`]): the tracker queues a real-time signal carrying the number of
//!   active pages to one thread; the application handles it in a signal-driven service thread
//!   or in its own thread blocked in [`Hps::wait_signal`]. Queued real-time signals are not
//!   merged, so notifications that arrive while one is processed are kept.
//! - **Fairness** ([`fairness`]): hugepages come out of a host-wide budget shared max-min fairly
//!   between the HPS processes of the host; a dead process's share is reclaimed.
//! - **C API** ([`capi`], `include/pagewise/hps.h`): the seed's `hps_*` names.
//!
//! Also here, seed 001: [`hp_alloc`], the per-data hugepage arena (`hp_alloc`/`hp_free`/
//! `hp_stats`, `include/pagewise/hp_alloc.h`, [`hp_alloc_capi`]) behind the Java module.

pub mod capi;
pub mod compact;
pub mod fairness;
pub mod fill;
pub mod hp_alloc;
pub mod hp_alloc_capi;
pub mod hps;
pub mod late;
pub mod pace;
pub mod policy;
pub mod promote;

pub use compact::HugeArena;
pub use hps::{ActivePage, Hps, HpsConfig, HpsStats, Notify, Outcome};
pub use policy::{decide, Action, ConvergeRule, Convergence, Decision, RegionRule, RegionView, TrackState};

/// A failure of HPS.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// a kernel interaction failed.
    #[error(transparent)]
    Kernel(#[from] pagewise_kernel::Error),
    /// the tracker failed.
    #[error(transparent)]
    Track(#[from] pagewise_track::Error),
    /// MADV_COLLAPSE of a compaction chunk failed.
    #[error("collapsing the compaction arena failed: {0}")]
    Collapse(Box<pagewise_kernel::Error>),
    /// a file of the shared state failed.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// an argument was rejected.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// a tagged free named a block that was freed and whose address was handed out again: the
    /// newer block is left alone.
    #[error("stale free: {0}")]
    Stale(String),
}

impl Error {
    /// The errno to hand a C caller (negated by the C API).
    pub fn errno(&self) -> i32 {
        match self {
            Error::Kernel(e) => e.errno().unwrap_or(libc::EINVAL),
            Error::Collapse(e) => e.errno().unwrap_or(libc::EIO),
            Error::Stale(_) => libc::ESTALE,
            Error::Track(pagewise_track::Error::Kernel(e)) => e.errno().unwrap_or(libc::EINVAL),
            Error::Track(pagewise_track::Error::Io { source, .. }) | Error::Io { source, .. } => {
                source.raw_os_error().unwrap_or(libc::EIO)
            }
            Error::Track(_) | Error::Invalid(_) => libc::EINVAL,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

use pagewise_kernel::features::{Capability, Feature};

/// What HPS offers a user and the kernel capabilities each part uses (`pagewise doctor`).
pub const FEATURES: &[Feature] = &[
    Feature { name: "hps_* C API: tracking", needs: &[Capability::Userfaultfd] },
    Feature { name: "hps_* C API: promotion", needs: &[Capability::MadvCollapseShmem, Capability::ThpShmemEnabled] },
    Feature { name: "hps_huge_alloc", needs: &[Capability::HugetlbSizesKb, Capability::MadvCollapseShmem] },
    Feature {
        name: "pagewise hps run (unmodified programs, promote-only)",
        needs: &[Capability::Userfaultfd, Capability::MadvCollapseShmem],
    },
    Feature {
        name: "pagewise hps run (hugepages at first touch ahead of a dense fill)",
        needs: &[Capability::TmpfsHuge],
    },
    Feature {
        name: "hp_alloc (per-data hugepages, the Spark agent)",
        needs: &[Capability::ThpEnabled, Capability::HugetlbSizesKb, Capability::MadvCollapse],
    },
];
