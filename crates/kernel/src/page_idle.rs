//! Idle page tracking (/sys/kernel/mm/page_idle/bitmap, CONFIG_IDLE_PAGE_TRACKING): the
//! kernel's read-and-clear of the accessed bit, for any process, by PFN. Each 64-bit word of
//! the bitmap covers 64 PFNs; writing a 1 bit marks the page idle, and a page still idle when
//! read back has not been accessed since (Documentation/admin-guide/mm/idle_page_tracking.rst).

use std::fs::File;
use std::os::unix::fs::FileExt;

use crate::error::{Error, Result};

pub const BITMAP: &str = "/sys/kernel/mm/page_idle/bitmap";

/// Whether this kernel has idle page tracking.
pub fn available() -> bool {
    std::path::Path::new(BITMAP).exists()
}

/// The open bitmap.
pub struct PageIdle {
    file: File,
}

impl PageIdle {
    pub fn open() -> Result<Self> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(BITMAP)
            .map_err(|source| Error::Read { path: BITMAP.into(), source })?;
        Ok(PageIdle { file })
    }

    /// Mark the 64 PFNs of word `pfn / 64` selected by `mask` idle.
    pub fn mark_idle(&self, pfn: u64, mask: u64) -> Result<()> {
        self.file.write_all_at(&mask.to_ne_bytes(), pfn / 64 * 8).map_err(|source| Error::Write {
            path: BITMAP.into(),
            value: format!("{mask:#x}"),
            source,
        })
    }

    /// The idle bits of the word holding `pfn`.
    pub fn read_word(&self, pfn: u64) -> Result<u64> {
        let mut buf = [0u8; 8];
        self.file
            .read_exact_at(&mut buf, pfn / 64 * 8)
            .map_err(|source| Error::Read { path: BITMAP.into(), source })?;
        Ok(u64::from_ne_bytes(buf))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn open_reports_absence_clearly() {
        if super::available() {
            assert!(super::PageIdle::open().is_ok());
        } else {
            let err = super::PageIdle::open().err().expect("absent bitmap cannot open");
            assert!(err.to_string().contains("page_idle/bitmap"));
        }
    }
}
