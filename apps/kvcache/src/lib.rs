//! # pagewise-kvcache: a memcached-protocol cache whose hot items live on hugepages (HPS)
//!
//! The HPS paper (seed 000, section 6.4) put its mechanism inside memcached: slab memory is
//! tracked, dense hot regions are promoted to hugepages and hot items on sparse regions are
//! compacted onto hugepage-backed slab pages. This crate is such a cache, written for it:
//! [`proto`] parses the memcached text protocol (PROTOCOL.md), [`cache`] holds items in slab
//! classes with an LRU each, [`server`] runs mio event loops whose idle workers poll a while
//! before they sleep ([`idle`]), [`hpsrun`] connects the cache to HPS and [`load`] is a
//! pipelined load generator with YCSB's key distribution; [`memory`] is the definition of a
//! server's memory that kvcache and its peers are measured with.

use pagewise_kernel::features::{Capability, Feature};

/// What `pagewise-kvcache` needs of the kernel, per memory mode (for `pagewise doctor`).
pub const FEATURES: &[Feature] = &[
    Feature {
        name: "pagewise-kvcache --memory-mode hps",
        needs: &[Capability::Userfaultfd, Capability::MadvCollapseShmem, Capability::HugetlbSizesKb],
    },
    Feature { name: "pagewise-kvcache --memory-mode thp", needs: &[Capability::ThpEnabled] },
];

pub mod cache;
pub mod hpsrun;
pub mod idle;
pub mod load;
pub mod memory;
pub mod proto;
pub mod server;
pub mod stats;
