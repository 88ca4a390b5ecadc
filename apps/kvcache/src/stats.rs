//! `stats` and `stats settings` output.

use std::sync::atomic::{AtomicU64, Ordering};

use pagewise_kernel::procfs::{read_mem_usage, read_status, Pid};

use crate::cache::{GROWTH, ITEM_MAX};
use crate::server::Shared;

/// Counters kept outside the cache lock.
#[derive(Default)]
pub struct ServerStats {
    pub bytes_read: AtomicU64,
    /// Refused command lines and data blocks.
    pub errors: AtomicU64,
}

/// Memory the process holds ([`crate::memory`]: RSS, with the HPS arenas' memfds counted by the
/// pages they hold, which RSS misses once the tracker dropped their mappings). Without the
/// privilege to read /proc/self/map_files (only needed with HPS), VmRSS, said once on stderr.
pub fn memory_bytes() -> u64 {
    crate::memory::process_memory_bytes(Pid::SelfProcess).unwrap_or_else(|e| {
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| eprintln!("kvcache: memory_bytes falls back to VmRSS: {e:#}"));
        read_status(Pid::SelfProcess).ok().and_then(|s| s.vmrss).unwrap_or(0) * 1024
    })
}

fn line(out: &mut Vec<u8>, k: &str, v: impl std::fmt::Display) {
    out.extend_from_slice(format!("STAT {k} {v}\r\n").as_bytes());
}

/// `stats`: memcached's general-purpose statistics plus the HPS fields.
pub fn general(shared: &Shared, out: &mut Vec<u8>) {
    let cache = shared.cache.lock().expect("cache lock");
    let c = cache.counters;
    let (hot_items, hot_set_bytes) = cache.hot_items();
    let uptime = cache.uptime();
    let curr_items = cache.curr_items();
    let bytes = cache.bytes();
    let limit = cache.limit_bytes();
    let backing = cache.config().backing;
    let promoted = cache.promoted_regions();
    drop(cache);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    line(out, "pid", std::process::id());
    line(out, "uptime", uptime);
    line(out, "time", now);
    line(out, "version", env!("CARGO_PKG_VERSION"));
    line(out, "pointer_size", usize::BITS);
    line(out, "curr_connections", shared.curr_conns.load(Ordering::Relaxed));
    line(out, "total_connections", shared.total_conns.load(Ordering::Relaxed));
    line(out, "rejected_connections", shared.rejected_conns.load(Ordering::Relaxed));
    for (k, v) in [
        ("cmd_get", c.cmd_get),
        ("cmd_set", c.cmd_set),
        ("cmd_flush", c.cmd_flush),
        ("cmd_touch", c.cmd_touch),
        ("get_hits", c.get_hits),
        ("get_misses", c.get_misses),
        ("get_expired", c.get_expired),
        ("delete_misses", c.delete_misses),
        ("delete_hits", c.delete_hits),
        ("incr_misses", c.incr_misses),
        ("incr_hits", c.incr_hits),
        ("decr_misses", c.decr_misses),
        ("decr_hits", c.decr_hits),
        ("cas_misses", c.cas_misses),
        ("cas_hits", c.cas_hits),
        ("cas_badval", c.cas_badval),
        ("touch_hits", c.touch_hits),
        ("touch_misses", c.touch_misses),
    ] {
        line(out, k, v);
    }
    line(out, "bytes_read", shared.stats.bytes_read.load(Ordering::Relaxed));
    line(out, "protocol_errors", shared.stats.errors.load(Ordering::Relaxed));
    line(out, "limit_maxbytes", limit);
    line(out, "threads", shared.settings.threads);
    line(out, "bytes", bytes);
    line(out, "curr_items", curr_items);
    line(out, "total_items", c.total_items);
    line(out, "evictions", c.evictions);
    // HPS and memory placement.
    line(out, "memory_mode", backing.name());
    line(out, "memory_bytes", memory_bytes());
    let usage = read_mem_usage(Pid::SelfProcess).ok();
    let anon_huge = usage.map(|u| u.anon_huge + u.shmem_pmd_mapped + u.shared_hugetlb + u.private_hugetlb).unwrap_or(0);
    line(out, "hugepage_bytes", anon_huge);
    line(out, "promoted_regions", promoted);
    line(out, "compacted_items", c.compacted_items);
    line(out, "demoted_items", c.demoted_items);
    line(out, "hot_items", hot_items);
    line(out, "hot_set_bytes", hot_set_bytes);
    line(out, "hot_hits", c.hot_hits);
    line(out, "promoted_hits", c.promoted_hits);
    match &shared.hps {
        Some(h) => {
            let s = h.hps.stats();
            line(out, "hot_arena_bytes", h.hps.huge_hugepages() * pagewise_kernel::mem::HUGE_PMD as u64);
            line(out, "tracking", u8::from(h.hps.tracking()));
            line(out, "tracking_state", if h.hps.tracking() { "tracking" } else { "converged" });
            line(out, "tracking_restarts", h.restarts.load(Ordering::Relaxed));
            line(out, "tracking_periods", s.tracker.periods);
            line(out, "tracking_faults", s.tracker.faults);
            line(out, "hps_decision_steps", s.decision_steps);
            line(out, "hps_compacted_pages", s.compacted_pages);
        }
        None => {
            line(out, "hot_arena_bytes", 0);
            line(out, "tracking", 0);
            line(out, "tracking_state", "off");
            line(out, "tracking_restarts", 0);
        }
    }
}

/// `stats settings`.
pub fn settings(shared: &Shared, out: &mut Vec<u8>) {
    let s = &shared.settings;
    let cache = shared.cache.lock().expect("cache lock");
    line(out, "maxbytes", cache.limit_bytes());
    line(out, "memory_mode", cache.config().backing.name());
    line(out, "hot_window_ms", cache.config().hot_window_ds as u64 * 100);
    line(out, "slab_prealloc", if cache.config().prealloc { "yes" } else { "no" });
    drop(cache);
    line(out, "maxconns", s.max_conns);
    line(out, "tcpport", s.port);
    line(out, "interface", if s.listen.is_empty() { "NULL" } else { &s.listen });
    line(out, "verbosity", shared.verbosity.load(Ordering::Relaxed));
    line(out, "num_threads", s.threads);
    line(out, "poll_us", s.poll.as_micros());
    line(out, "growth_factor", format!("{GROWTH:.2}"));
    line(out, "chunk_size", 48);
    line(out, "item_size_max", ITEM_MAX);
    line(out, "slab_page_size", crate::cache::SLAB_PAGE);
    line(out, "evictions", "on");
    line(out, "cas_enabled", "yes");
}
