//! Late routing, the mechanism ([`crate::late`] is the rule): arenas made young, and their
//! regions moved into tracked memory by the tracking thread once due, paced as promotion is.

use std::sync::atomic::Ordering;

use pagewise_kernel::signal;
use pagewise_kernel::uffd::{feature, Uffd, UffdBuilder};
use pagewise_track::TrackedArena;

use super::Shared;
use crate::late;

/// The userfaultfd that holds writers back while a region moves in: write protection of
/// anonymous memory, unpopulated pages included. Never read: writers wait until the move
/// wakes them. None where the kernel or the process's rights do not allow one (then arenas
/// are tracked from the start).
pub(super) fn open_uffd() -> Option<Uffd> {
    UffdBuilder::new().require(feature::WP_UNPOPULATED).nonblocking(true).open().ok()
}

impl Shared {
    /// Whether an arena made now starts young.
    pub(super) fn new_arena_young(&self) -> bool {
        let cfg = self.cfg.lock().expect("cfg lock");
        late::starts_young(
            cfg.late_routing.is_some(),
            self.move_in_uffd.is_some(),
            self.fill.is_some(),
            self.serving_since_ns.load(Ordering::Relaxed) != u64::MAX,
        )
    }

    /// Whether the arena `id` ([`TrackedArena::id`]) is young (not tracked yet).
    pub(super) fn is_young(&self, id: usize) -> bool {
        self.young.lock().expect("young lock").iter().any(|&(a, _)| a == id)
    }

    /// The arena `id` is tracked, or gone.
    pub(super) fn forget_young(&self, id: usize) {
        self.young.lock().expect("young lock").retain(|&(a, _)| a != id);
    }

    /// The arena `id` stays young for good: nothing more of it is moved in.
    fn settle_young(&self, id: usize) {
        for entry in self.young.lock().expect("young lock").iter_mut().filter(|e| e.0 == id) {
            entry.1 = SETTLED;
        }
    }
}

/// Birth time of a young arena nothing more is moved in from (a move of it failed).
const SETTLED: u64 = u64::MAX;

/// Move in what is due: the whole young regions of arenas at least the configured age, one at
/// a time while the promotion pace allows, each charged the CPU time it took. An arena with
/// no young region left that can move in is tracked from then on (its regions in the memfd).
pub(super) fn move_in_due(s: &Shared) {
    let Some(uffd) = &s.move_in_uffd else { return };
    let Some(after) = s.cfg.lock().expect("cfg lock").late_routing else { return };
    let due: Vec<usize> = {
        let now = s.epoch.elapsed().as_nanos() as u64;
        let young = s.young.lock().expect("young lock");
        young.iter().filter(|&&(_, born)| born != SETTLED && late::due(born, now, after)).map(|&(v, _)| v).collect()
    };
    for id in due {
        loop {
            let now = s.epoch.elapsed().as_nanos() as u64;
            if s.stop.load(Ordering::Acquire)
                || !s.pace.lock().expect("pace lock").as_mut().is_none_or(|p| p.allowed(now))
            {
                return;
            }
            let arenas = s.arenas.lock().expect("arenas lock");
            let Some(arena) = arenas.iter().find(|a| a.id() == id && s.is_young(id)) else {
                break; // freed meanwhile
            };
            let Some(&region) = arena.young_regions().first() else {
                // Tracked from now on, if anything of it is in the memfd; else it stays young,
                // all of it the program's private memory (every region has a hole).
                // Not young from the moment it is tracked (the arenas lock still held): a part
                // the program gives up meanwhile is forgotten in the tracker (`Hps::give_up`).
                if track_moved_in(s, arena) {
                    s.forget_young(id);
                }
                drop(arenas);
                break;
            };
            let cpu0 = signal::thread_cpu_time();
            let moved = arena.move_in(region, uffd);
            drop(arenas);
            let cost = (signal::thread_cpu_time() - cpu0).as_nanos() as u64;
            if let Some(p) = s.pace.lock().expect("pace lock").as_mut() {
                p.spend(s.epoch.elapsed().as_nanos() as u64, cost);
            }
            s.move_in_ns.fetch_add(cost, Ordering::Relaxed);
            match moved {
                Ok(m) => {
                    s.moved_regions.fetch_add(1, Ordering::Relaxed);
                    s.moved_pages.fetch_add(m.pages as u64, Ordering::Relaxed);
                }
                // The kernel refused (the region is as it was: the program's private memory).
                // What moved in is tracked; the rest stays private, not tried again each period.
                Err(_) => {
                    s.move_in_failures.fetch_add(1, Ordering::Relaxed);
                    let arenas = s.arenas.lock().expect("arenas lock");
                    match arenas.iter().find(|a| a.id() == id) {
                        Some(arena) if track_moved_in(s, arena) => s.forget_young(id),
                        Some(_) => s.settle_young(id),
                        None => {}
                    }
                    break;
                }
            }
        }
    }
}

/// Track what of `arena` is in the memfd now that no more of it can move in (under the arenas
/// lock); whether it is tracked now. Nothing in the memfd (every region had a hole): no.
fn track_moved_in(s: &Shared, arena: &TrackedArena) -> bool {
    let parts = arena.memfd_parts();
    if parts.is_empty() {
        return false;
    }
    match s.tracker.track_parts(arena.addr(), arena.len(), &parts) {
        Ok(range) => {
            s.set_range(arena.id(), Some(range));
        }
        Err(_) => return false,
    }
    s.idle_periods.store(0, Ordering::Relaxed);
    s.new_memory.store(true, Ordering::Release);
    true
}
