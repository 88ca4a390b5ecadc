//! `shrink`: a process that unmaps its unchanged file pages keeps running, and reads the
//! same bytes there. Its own test binary: a thread of another test mapping files meanwhile
//! would break the contract (`unmap_unchanged_file_pages`).

use pagewise_kernel::procfs::{read_smaps, Pid};
use pagewise_kernel::shrink::{unchanged_file_ranges, unmap_unchanged_file_pages};

#[test]
fn unmapped_code_still_runs_and_reads_the_same_bytes() {
    let before = read_smaps(Pid::SelfProcess).expect("smaps");
    let ranges = unchanged_file_ranges(&before);
    assert!(!ranges.is_empty(), "a test binary maps its own code");
    // A page of each range as it reads before, to compare after.
    let first_pages: Vec<Vec<u8>> = ranges
        .iter()
        // SAFETY: each range is a readable mapping of this process (not writable, so no
        // thread changes it), read within its bounds.
        .map(|&(a, len)| unsafe { std::slice::from_raw_parts(a as *const u8, len.min(4096)) }.to_vec())
        .collect();
    let unmapped = unmap_unchanged_file_pages().expect("unmapping unchanged file pages");
    assert!(unmapped > 0, "some pages were mapped");
    for (&(a, len), before) in ranges.iter().zip(&first_pages) {
        // SAFETY: as above; the range is still mapped, only its page-table entries went.
        let after = unsafe { std::slice::from_raw_parts(a as *const u8, len.min(4096)) };
        assert_eq!(after, &before[..], "the page at {a:#x} reads back other bytes");
    }
}
