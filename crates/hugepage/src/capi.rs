//! C API (filled below)
