//! The `dlm_*` C ABI (include/pagewise/dlm.h). 0 or a count on success, negative errno on
//! failure; never aborts the caller for bad arguments.
