//! libpagewise: one shared and one static library carrying the C ABI of every Pagewise
//! system. Each system keeps its `extern "C"` functions next to its Rust API (a `capi` module
//! in its own crate); this crate links them into `libpagewise.so` / `libpagewise.a`, and
//! `include/pagewise.h` declares them.
//!
//! Convention of the ABI: functions return 0 (or a count) on success and a negative errno on
//! failure, and never abort the calling program.

/// DLM: `dlm_*` (include/pagewise/dlm.h).
pub use pagewise_dlm::capi as dlm;
pub use pagewise_hugepage::capi as hps;
/// hp_alloc: `hp_alloc`/`hp_free`/`hp_stats` (include/pagewise/hp_alloc.h) and its JNI functions.
pub use pagewise_hugepage::hp_alloc_capi as hp_alloc;
pub use pagewise_reclaim::capi as reclaim;
