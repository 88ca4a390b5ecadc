use super::*;
use crate::proto::Store;

fn cache(mb: usize) -> Cache {
    Cache::new(CacheConfig { limit: mb << 20, backing: Backing::Default, hot_window_ds: 20, prealloc: false }, None)
        .unwrap()
}

#[test]
fn classes_grow_by_a_quarter_to_one_page() {
    let s = class_sizes();
    assert_eq!(s[0], 96);
    assert_eq!(s[1], 120);
    assert_eq!(*s.last().unwrap(), SLAB_PAGE);
    assert!(s.windows(2).all(|w| w[1] > w[0] && w[1] % 8 == 0));
    assert!(s.len() < 256);
}

#[test]
fn store_get_replace_delete_keep_invariants() {
    let mut c = cache(4);
    let mut out = Vec::new();
    for i in 0..40_000u32 {
        let k = format!("key{i}");
        assert_eq!(c.store(Store::Set, k.as_bytes(), i, 0, &i.to_le_bytes().repeat(10), 0), StoreResult::Stored);
    }
    c.check().unwrap();
    // Every page went to one class: a size of another class finds no memory and no victim
    // (slab pages are not moved between classes).
    assert_eq!(c.store(Store::Set, b"big", 0, 0, &[7u8; 5000], 0), StoreResult::OutOfMemory);
    // 4 MiB cannot hold them all: the oldest were evicted, the newest are there.
    assert!(c.counters.evictions > 0);
    out.clear();
    assert!(c.get(b"key39999", false, None, &mut out));
    assert!(out.starts_with(b"VALUE key39999 39999 "));
    for i in 39_000..40_000u32 {
        assert!(c.delete(format!("key{i}").as_bytes()));
    }
    c.check().unwrap();
    assert!(!c.get(b"key39999", false, None, &mut out));
}

#[test]
fn reads_move_an_item_up_its_lru_at_most_once_a_minute() {
    let mut c = cache(8);
    c.store(Store::Set, b"a", 0, 0, b"1", 0);
    c.store(Store::Set, b"b", 0, 0, b"2", 0);
    let (a, b) = (c.find_raw(b"a"), c.find_raw(b"b"));
    let class = c.h(a).clsid as usize;
    assert_eq!(c.classes[class].lru_head, b);
    let mut out = Vec::new();
    assert!(c.get(b"a", false, None, &mut out));
    assert_eq!(c.classes[class].lru_head, b, "a read within a minute of the store leaves the LRU alone");
    // A minute later the same read moves the item to the head.
    c.start -= std::time::Duration::from_secs(u64::from(LRU_BUMP_SECS));
    assert!(c.get(b"a", false, None, &mut out));
    assert_eq!(c.classes[class].lru_head, a);
    assert_eq!(c.classes[class].lru_tail, b);
    c.check().unwrap();
}

#[test]
fn moving_items_repoints_hash_and_lru() {
    let mut c = cache(8);
    for i in 0..5000u32 {
        c.store(Store::Set, format!("k{i}").as_bytes(), 0, 0, format!("v{i}").as_bytes(), 0);
    }
    // Move every item to another cold chunk and back: values and invariants survive.
    let items: Vec<usize> = (0..5000u32).map(|i| c.find_raw(format!("k{i}").as_bytes())).collect();
    c.flush_at = None;
    for (n, it) in items.into_iter().enumerate() {
        let c2 = c.h(it).clsid as usize;
        let new = c.take_cold(c2);
        assert_ne!(new, 0);
        let total = c.total(it);
        // SAFETY: distinct chunks of the same class.
        unsafe { std::ptr::copy_nonoverlapping(it as *const u8, new as *mut u8, total) };
        c.hash_replace(it, new);
        c.lru_replace(it, new);
        c.free_chunk(it);
        c.h(new).iflags = LINKED;
        if n % 997 == 0 {
            c.check().unwrap();
        }
    }
    c.check().unwrap();
    let mut out = Vec::new();
    for i in 0..5000u32 {
        out.clear();
        assert!(c.get(format!("k{i}").as_bytes(), false, None, &mut out));
        assert!(out.ends_with(format!("v{i}\r\n").as_bytes()));
    }
}
