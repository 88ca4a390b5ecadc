//! CLOCK (second chance) over resident units: a pure policy, no I/O.
//!
//! Slots form the clock's circle. A victim is the first slot under the hand whose reference bit
//! is clear; referenced slots passed over get their bit cleared (a second chance), and the
//! caller hears of each (`victim`'s `on_second_chance`, which may refuse it: `sampling.rs`) so
//! it can arrange to see the entry's next use — the runtime unmaps the unit's pages, keeping
//! their data, so the next access faults and sets the bit again (`runtime.rs`, "Reference
//! bits"). A new unit takes a free slot; free slots appear where the hand just evicted, so new units land right
//! behind the hand, as in Corbató's CLOCK. Capacity is fixed up front so inserting never
//! allocates (the DLM fault path may run inside a signal handler).

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Slot<K> {
    key: K,
    referenced: bool,
    /// Used again after it was inserted (`touch`): a tie-break when every entry is referenced.
    reused: bool,
}

/// A CLOCK of at most `capacity` entries keyed by `K`.
#[derive(Debug)]
pub struct Clock<K> {
    slots: Vec<Option<Slot<K>>>,
    free: Vec<usize>,
    hand: usize,
    len: usize,
}

impl<K: Copy> Clock<K> {
    pub fn with_capacity(capacity: usize) -> Self {
        Clock { slots: Vec::with_capacity(capacity), free: Vec::with_capacity(capacity), hand: 0, len: 0 }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Insert a just-used entry (reference bit set); returns its slot. `None` when full.
    pub fn insert(&mut self, key: K) -> Option<usize> {
        let s = Some(Slot { key, referenced: true, reused: false });
        let slot = if let Some(i) = self.free.pop() {
            self.slots[i] = s;
            i
        } else if self.slots.len() < self.slots.capacity() {
            self.slots.push(s);
            self.slots.len() - 1
        } else {
            return None;
        };
        self.len += 1;
        Some(slot)
    }

    pub fn get(&self, slot: usize) -> Option<&K> {
        self.slots.get(slot)?.as_ref().map(|s| &s.key)
    }

    /// Every live entry, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = &K> {
        self.slots.iter().flatten().map(|s| &s.key)
    }

    pub fn get_mut(&mut self, slot: usize) -> Option<&mut K> {
        self.slots.get_mut(slot)?.as_mut().map(|s| &mut s.key)
    }

    /// Mark the entry used (again: its insertion counted as the first use).
    pub fn touch(&mut self, slot: usize) {
        if let Some(Some(s)) = self.slots.get_mut(slot) {
            s.referenced = true;
            s.reused = true;
        }
    }

    pub fn remove(&mut self, slot: usize) -> Option<K> {
        let s = self.slots.get_mut(slot)?.take()?;
        self.free.push(slot);
        self.len -= 1;
        Some(s.key)
    }

    /// The next victim (not removed): the first unreferenced entry under the hand, clearing
    /// reference bits on the way and calling `on_second_chance` with each referenced entry;
    /// an entry for which it returns false gets no second chance and is the victim
    /// (`sampling.rs`: when the bits tell units apart too seldom to be worth seeing).
    ///
    /// When the hand comes round having found every entry referenced — a scan brings in units
    /// faster than the hand turns, so every entry is fresh — plain CLOCK takes whatever is under
    /// the hand, which may be the unit the program keeps using. Here the tie goes to the first
    /// entry never used since it was inserted (the scan's), as 2Q keeps once-used pages apart
    /// from reused ones; only if every entry was reused does the one under the hand go.
    pub fn victim(&mut self, mut on_second_chance: impl FnMut(&mut K) -> bool) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let n = self.slots.len();
        let start = self.hand;
        for _ in 0..n {
            let i = self.advance();
            if let Some(s) = &mut self.slots[i] {
                if !s.referenced {
                    return Some(i);
                }
                if !on_second_chance(&mut s.key) {
                    return Some(i);
                }
                s.referenced = false;
            }
        }
        // A whole turn found every entry referenced (and cleared it).
        let live = |s: &Option<Slot<K>>| s.is_some();
        let once_used = (0..n).map(|k| (start + k) % n).find(|&i| self.slots[i].as_ref().is_some_and(|s| !s.reused));
        let i = once_used.or_else(|| (0..n).map(|k| (start + k) % n).find(|&i| live(&self.slots[i])))?;
        self.hand = (i + 1) % n;
        Some(i)
    }

    fn advance(&mut self) -> usize {
        let i = self.hand;
        self.hand = (self.hand + 1) % self.slots.len();
        i
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn second_chance_spares_referenced_entries() {
        let mut c = Clock::with_capacity(4);
        let a = c.insert('a').unwrap();
        let b = c.insert('b').unwrap();
        let _ = c.insert('c').unwrap();
        // The victim, every second chance given, and the entries the hand passed on the way.
        let victim = |c: &mut Clock<char>| {
            let mut passed = Vec::new();
            let v = c.victim(|k| {
                passed.push(*k);
                true
            });
            (v, passed)
        };
        // First sweep clears every bit (and reports each); 'a' is then the oldest unreferenced.
        assert_eq!(victim(&mut c), (Some(a), vec!['a', 'b', 'c']));
        c.touch(b);
        c.remove(a);
        // The hand is past 'a'; 'b' was touched again, so 'c' goes.
        let (v, passed) = victim(&mut c);
        assert_eq!(c.get(v.unwrap()), Some(&'c'));
        assert_eq!(passed, ['b']);
    }

    #[test]
    fn a_refused_second_chance_makes_the_victim() {
        let mut c = Clock::with_capacity(3);
        let _ = c.insert('a').unwrap();
        let b = c.insert('b').unwrap();
        let _ = c.insert('c').unwrap();
        // All referenced: 'a' gets its chance, 'b' is refused one and goes; 'c' is not passed.
        let mut passed = Vec::new();
        let v = c.victim(|k| {
            passed.push(*k);
            *k != 'b'
        });
        assert_eq!(v, Some(b));
        assert_eq!(passed, ['a', 'b']);
    }

    #[test]
    fn full_clock_refuses_and_reuses_freed_slots() {
        let mut c = Clock::with_capacity(2);
        let a = c.insert(1).unwrap();
        c.insert(2).unwrap();
        assert_eq!(c.insert(3), None);
        c.remove(a);
        assert_eq!(c.insert(3), Some(a));
    }

    proptest! {
        /// Whatever the operations, the victim is a live entry and len counts live entries.
        #[test]
        fn victims_are_live(ops in proptest::collection::vec((0u8..4, 0usize..16), 1..200)) {
            let mut c = Clock::with_capacity(16);
            let mut live = std::collections::HashSet::new();
            for (op, x) in ops {
                match op {
                    0 => if let Some(s) = c.insert(x) { live.insert(s); },
                    1 => { c.touch(x); }
                    2 => if c.remove(x).is_some() { live.remove(&x); },
                    _ => if let Some(v) = c.victim(|_| true) { prop_assert!(live.contains(&v)); },
                }
                prop_assert_eq!(c.len(), live.len());
            }
        }

        /// An entry used between any two victim choices is never chosen while cold entries
        /// (inserted, never used again) stream through: the unit a program keeps reading
        /// outlives a scan, whatever the capacity and the scan's length.
        #[test]
        fn a_hot_entry_outlives_a_scan(cap in 2usize..12, scan in 1usize..300) {
            const HOT: usize = usize::MAX;
            let mut c = Clock::with_capacity(cap);
            let mut hot = c.insert(HOT).unwrap();
            c.touch(hot);
            let mut hot_evictions = 0;
            for i in 0..scan {
                if c.insert(i).is_none() {
                    let v = c.victim(|_| true).unwrap();
                    c.remove(v);
                    c.insert(i).unwrap();
                    if v == hot {
                        hot_evictions += 1;
                        hot = c.insert(HOT).unwrap_or_else(|| {
                            let w = c.victim(|_| true).unwrap();
                            c.remove(w);
                            c.insert(HOT).unwrap()
                        });
                    }
                }
                c.touch(hot);
            }
            prop_assert_eq!(hot_evictions, 0);
        }

        /// Plain second chance still holds: an unreferenced entry is taken before any
        /// referenced one.
        #[test]
        fn unreferenced_entries_go_first(cap in 2usize..12, touched in proptest::collection::vec(any::<bool>(), 12)) {
            let mut c = Clock::with_capacity(cap);
            let slots: Vec<usize> = (0..cap).map(|k| c.insert(k).unwrap()).collect();
            // One full turn clears every bit; then re-reference some.
            let first = c.victim(|_| true).unwrap();
            c.remove(first);
            for (&s, &t) in slots.iter().zip(&touched) {
                if t && s != first { c.touch(s); }
            }
            let v = c.victim(|_| true).unwrap();
            let any_cold = slots.iter().zip(&touched).any(|(&s, &t)| s != first && !t);
            if any_cold {
                prop_assert!(!touched[slots.iter().position(|&s| s == v).unwrap()]);
            }
        }
    }
}
