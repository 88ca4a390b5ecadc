//! Late routing (`pagewise hps run`), the rule: when routed memory starts in tracked memory.
//!
//! HPS tracks and promotes memory in a memfd, and a memfd costs a program more than its own
//! private memory before HPS has given anything back: its first touch (2.1 µs a page against
//! 1.4 µs here) and its release at exit (0.74 µs against 0.26 µs). GNU sort of 64 MiB, whose
//! 256 MiB buffer is one routed allocation, ran 1.07–1.14× plain for that alone, though it
//! ends before any promotion could pay. So, as promotion itself is paced like ski rental
//! ([`crate::pace`]), routing is too: an arena starts young, the program's own private memory
//! (renting), and its regions move into the memfd (buying: a copy of what the program wrote)
//! once the arena has lived `after` and then only as fast as the promotion pace allows, each
//! move charged the CPU time it took. A program that ends young pays nothing; one that runs
//! on pays a copy, bounded by the pace, off its own thread (a writer to a region waits while
//! that region moves, about a millisecond).
//!
//! Exceptions, each where renting cannot pay: a program that serves (it began listening for
//! connections) runs until it is stopped, and its data would only be copied later, so its new
//! arenas are tracked memory from the start; with first-touch hugepages ahead of dense fills
//! ([`crate::fill`]) the memory must be on a huge-capable tmpfs from its first touch; and
//! without a userfaultfd that can hold writers back, nothing can move in.

use std::time::Duration;

/// Whether an arena made now starts young: late routing is on (`enabled`) and possible
/// (`can_move_in`), first-touch hugepages are off, and the program does not serve.
pub fn starts_young(enabled: bool, can_move_in: bool, first_touch: bool, serving: bool) -> bool {
    enabled && can_move_in && !first_touch && !serving
}

/// Whether an arena made at `born_ns` is due to move in at `now_ns` (both from the start).
pub fn due(born_ns: u64, now_ns: u64, after: Duration) -> bool {
    now_ns.saturating_sub(born_ns) >= after.as_nanos() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn only_a_program_that_does_not_serve_starts_young_and_only_where_memory_can_move_in() {
        assert!(starts_young(true, true, false, false));
        assert!(!starts_young(false, true, false, false), "off");
        assert!(!starts_young(true, false, false, false), "no userfaultfd to hold writers back");
        assert!(!starts_young(true, true, true, false), "first-touch hugepages need the tmpfs at once");
        assert!(!starts_young(true, true, false, true), "a server's data would only be copied later");
    }

    #[test]
    fn an_arena_is_due_once_it_has_lived_the_delay() {
        let after = Duration::from_secs(1);
        assert!(!due(2 * S, 2 * S, after));
        assert!(!due(2 * S, 3 * S - 1, after));
        assert!(due(2 * S, 3 * S, after));
        assert!(due(0, 0, Duration::ZERO));
        assert!(due(5 * S, 2 * S, Duration::ZERO), "a clock read before the arena was made");
    }
}
