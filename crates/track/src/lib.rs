//! # pagewise-track: which pages does a process really use?
//!
//! HPS (seed 000) decides hugepage placement from per-page access counts (`acscount`): the
//! paper's kernel reads and clears each page's hardware accessed bit once per tracking period.
//! Stock Linux offers no user-space way to clear accessed bits where `page_idle` is missing
//! (it is on the machines this was built on), so the backend here emulates the bit with
//! userfaultfd *minor* faults on shared memory:
//!
//! - the application's memory lives in a [`TrackedArena`] (a memfd mapped MAP_SHARED), so
//!   MADV_DONTNEED drops only page-table entries and keeps the data in the page cache;
//! - "clearing the bit" of a page is dropping its PTE ([`MinorTracker::arm`]);
//! - the next touch raises a minor fault (registered with UFFD_FEATURE_MINOR_SHMEM, which
//!   disables fault-around, so one fault is one page), the handler thread counts it
//!   (`acscount[page] += 1`) and maps the same page back with UFFDIO_CONTINUE.
//!
//! Cost is bounded by a per-period budget of armed pages chosen by the pure [`plan`] module
//! (round-robin over 2 MiB regions, a rotating chunk per region, whole regions only where the
//! policy asked for page-exact counts, never a region already promoted). Counts are published
//! in the seed's `/proc/PID/page_acs` layout by [`report`].
//!
//! A second backend, [`WriteTracker`], sees writes only but costs the application almost
//! nothing: userfaultfd write-protection resolved in the kernel (WP_ASYNC) read back with
//! PAGEMAP_SCAN. page_idle (the kernel's own accessed-bit interface) and soft-dirty are absent
//! on the kernels this was built on, so no backend uses them.

pub mod arena;
pub mod minor;
pub mod plan;
pub mod report;
mod table;
pub mod wp_async;

pub use arena::{is_arena_path, TrackedArena};
pub use minor::{Delivery, FaultTiming, MinorTracker, TrackedRange, TrackerStats};
pub use plan::{PlanConfig, RegionMode};
pub use wp_async::WriteTracker;

/// Base pages per 2 MiB region.
pub const PAGES_PER_REGION: usize = pagewise_kernel::mem::HUGE_PMD / PAGE;
/// The tracking unit: one 4 KiB page.
pub const PAGE: usize = 4096;

/// A failure of the tracker.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// a kernel interaction failed.
    #[error(transparent)]
    Kernel(#[from] pagewise_kernel::Error),
    /// the range is not tracked by this tracker.
    #[error("address {0:#x} is not in a tracked range")]
    NotTracked(usize),
    /// a published count file had an unexpected shape.
    #[error("cannot parse the acscount file: {0}")]
    Parse(String),
    /// writing or reading the published counts failed.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T> = std::result::Result<T, Error>;
