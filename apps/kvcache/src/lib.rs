//! # pagewise-kvcache: a memcached-protocol cache whose hot items live on hugepages (HPS)
//!
//! The HPS paper (seed 000, section 6.4) put its mechanism inside memcached: slab memory is
//! tracked, dense hot regions are promoted to hugepages and hot items on sparse regions are
//! compacted onto hugepage-backed slab pages. This crate is such a cache, written for it:
//! [`proto`] parses the memcached text protocol (PROTOCOL.md), [`cache`] holds items in slab
//! classes with an LRU each, [`server`] runs mio event loops, [`hpsrun`] connects the cache to
//! HPS and [`load`] is a pipelined load generator with YCSB's key distribution.

pub mod cache;
pub mod hpsrun;
pub mod load;
pub mod proto;
pub mod server;
pub mod stats;
