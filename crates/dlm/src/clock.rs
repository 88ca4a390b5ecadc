//! CLOCK (second chance) over resident units: a pure policy, no I/O.
//!
//! Slots form the clock's circle. A victim is the first slot under the hand whose reference bit
//! is clear; referenced slots passed over get their bit cleared (a second chance). A new unit
//! takes a free slot; free slots appear where the hand just evicted, so new units land right
//! behind the hand, as in Corbató's CLOCK. Capacity is fixed up front so inserting never
//! allocates (the DLM fault path may run inside a signal handler).

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Slot<K> {
    key: K,
    referenced: bool,
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
        let s = Some(Slot { key, referenced: true });
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

    pub fn get_mut(&mut self, slot: usize) -> Option<&mut K> {
        self.slots.get_mut(slot)?.as_mut().map(|s| &mut s.key)
    }

    /// Mark the entry used.
    pub fn touch(&mut self, slot: usize) {
        if let Some(Some(s)) = self.slots.get_mut(slot) {
            s.referenced = true;
        }
    }

    pub fn remove(&mut self, slot: usize) -> Option<K> {
        let s = self.slots.get_mut(slot)?.take()?;
        self.free.push(slot);
        self.len -= 1;
        Some(s.key)
    }

    /// The next victim (not removed): the first unreferenced entry under the hand, clearing
    /// reference bits on the way. At most two turns of the hand.
    pub fn victim(&mut self) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let n = self.slots.len();
        for _ in 0..2 * n + 1 {
            let i = self.hand;
            self.hand = (self.hand + 1) % n;
            if let Some(s) = &mut self.slots[i] {
                if s.referenced {
                    s.referenced = false;
                } else {
                    return Some(i);
                }
            }
        }
        None
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
        // First sweep clears every bit; 'a' is then the oldest unreferenced.
        assert_eq!(c.victim(), Some(a));
        c.touch(b);
        c.remove(a);
        // The hand is past 'a'; 'b' was touched again, so 'c' goes.
        let v = c.victim().unwrap();
        assert_eq!(c.get(v), Some(&'c'));
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
                    _ => if let Some(v) = c.victim() { prop_assert!(live.contains(&v)); },
                }
                prop_assert_eq!(c.len(), live.len());
            }
        }
    }
}
