//! The memory definition of kvcache's `memory_bytes` stat and of `pagewise eval hps-kvcache`
//! ([`pagewise_kvcache::memory`]) on a real process: a memfd whose mapping dropped its pages
//! is still charged. Alone in its test binary, so no other test allocates meanwhile.

use pagewise_kernel::mem::{self, Advice, MapOptions, Mapping};
use pagewise_kernel::procfs::{self, Pid};
use pagewise_kvcache::memory::process_memory_bytes;

#[test]
fn a_memfd_whose_pages_are_no_longer_mapped_is_still_charged() {
    let before = process_memory_bytes(Pid::SelfProcess).unwrap();
    let fd = mem::memfd_create("kvcache-memory-test", None).unwrap();
    mem::ftruncate(&fd, 8 << 20).unwrap();
    let map = Mapping::of_fd(&fd, 8 << 20, 0, &MapOptions { shared: true, ..Default::default() }).unwrap();
    // SAFETY: the mapping is 8 MiB long and owned by this test.
    unsafe { std::ptr::write_bytes(map.as_ptr(), 1, 8 << 20) };
    let mapped = process_memory_bytes(Pid::SelfProcess).unwrap();
    // What HPS's tracker does to tracked memory: the page-table entries go, the pages stay.
    mem::madvise(map.addr(), map.len(), Advice::DontNeed).unwrap();
    let rss = procfs::read_smaps(Pid::SelfProcess)
        .unwrap()
        .0
        .iter()
        .find(|m| m.address.0 == map.addr() as u64)
        .map(|m| m.extension.map.get("Rss").copied().unwrap_or(0))
        .expect("the test's mapping");
    assert_eq!(rss, 0, "MADV_DONTNEED left pages mapped");
    let dropped = process_memory_bytes(Pid::SelfProcess).unwrap();
    let slack = 1 << 20; // the test's own allocations between the readings
    assert!(mapped >= before + (8 << 20) - slack, "before {before}, mapped {mapped}");
    assert!(dropped.abs_diff(mapped) < slack, "mapped {mapped}, after MADV_DONTNEED {dropped}");
    // Punching the pages out of the memfd frees them: the charge goes.
    mem::madvise(map.addr(), map.len(), Advice::Remove).unwrap();
    let removed = process_memory_bytes(Pid::SelfProcess).unwrap();
    assert!(removed + (8 << 20) - slack <= mapped, "mapped {mapped}, after MADV_REMOVE {removed}");
}
