/* Pagewise per-core reclaim (seed 002): thresholds and application habits.
 * The reclaim itself runs in `pagewise reclaimd`; see docs/reclaim.md.
 * Return 0 on success, a negative errno on failure.
 */
#ifndef PAGEWISE_RECLAIM_H
#define PAGEWISE_RECLAIM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Watermarks in 4 KiB pages. */
struct pw_reclaim_watermarks {
    uint64_t min;
    uint64_t low;
    uint64_t high;
};

/* One core's watermarks: min = min_free_kbytes / 4, low/high = floor(min * ratio / 100).
 * -EINVAL: out is NULL, a ratio is below 100 or above 100000, high_ratio < low_ratio, or
 * min_free_kbytes is above INT_MAX (the kernel sysctl's type). -EIO: internal error. */
int pw_reclaim_watermarks(uint64_t min_free_kbytes, uint32_t low_ratio, uint32_t high_ratio,
                          struct pw_reclaim_watermarks *out);

/* Set a core's thresholds in the running reclaimd (/run/pagewise/percpu_free_mem/cpuN).
 * -ESRCH: no reclaimd runs; -EINVAL: bad ratios, unknown core, or a sum of the cores'
 * min_free_kbytes above INT_MAX. */
int pw_reclaim_set_core(uint32_t cpu, uint64_t min_free_kbytes, uint32_t low_ratio,
                        uint32_t high_ratio);

/* Pin the calling thread to `cpu` and mlockall(MCL_CURRENT | MCL_FUTURE). */
int pw_reclaim_protect_self(uint32_t cpu);

#ifdef __cplusplus
}
#endif

#endif /* PAGEWISE_RECLAIM_H */
