/* The HPS arena of the preload shim (`pagewise hps run`): each routed allocation is a tracked
 * memfd arena of libpagewise's HPS (hps_arena_alloc: 2 MiB aligned, whole 2 MiB regions),
 * whose accesses HPS counts; hot regions are collapsed into hugepages (MADV_COLLAPSE),
 * promote-only. Configured from the PAGEWISE_HPS_* environment `pagewise hps run` sets. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#define HUGE (2UL << 20)

#include "arena.h"

/* struct hps_stats of include/pagewise/hps.h. */
struct pw_hps_stats {
    uint64_t periods, armed_pages, faults;
    uint64_t promoted_regions, compacted_pages;
    uint64_t notifications_sent, notifications_received;
};

static int (*p_start)(double, uint32_t);
static void *(*p_alloc)(size_t);
static int (*p_free)(void *);
static int (*p_stats)(struct pw_hps_stats *);
static int (*p_shutdown)(void);

static int hps_arena_init(void *lib) {
    p_start = (int (*)(double, uint32_t))dlsym(lib, "hps_preload_start");
    p_alloc = (void *(*)(size_t))dlsym(lib, "hps_arena_alloc");
    p_free = (int (*)(void *))dlsym(lib, "hps_arena_free");
    p_stats = (int (*)(struct pw_hps_stats *))dlsym(lib, "hps_stats");
    p_shutdown = (int (*)(void))dlsym(lib, "hps_shutdown");
    if (!p_start || !p_alloc || !p_free || !p_stats || !p_shutdown)
        return -ENOSYS;
    const char *frac = getenv("PAGEWISE_HPS_PROMOTE_FRACTION");
    const char *interval = getenv("PAGEWISE_HPS_INTERVAL_MS");
    return p_start(frac ? strtod(frac, NULL) : 0.0, interval ? (uint32_t)strtoul(interval, NULL, 10) : 0);
}

/* The arena is a MAP_SHARED memfd: a child made by fork(2) would share it with its parent
 * (its writes landing in the parent's "private" malloc memory), so it is not inherited
 * (MADV_DONTFORK), as DLM's areas are not. */
static void *hps_arena_alloc(size_t len) {
    void *p = p_alloc(len);
    if (!p)
        return NULL;
    size_t whole = (len + HUGE - 1) & ~(HUGE - 1);
    if (madvise(p, whole, MADV_DONTFORK) != 0) {
        int e = errno;
        p_free(p);
        errno = e;
        return NULL;
    }
    return p;
}

static int hps_arena_free(void *p) { return p_free(p); }

static int hps_arena_summary(char *buf, size_t n) {
    struct pw_hps_stats s;
    int rc = p_stats(&s);
    if (rc < 0)
        return rc;
    snprintf(buf, n, "hps: %llu region(s) promoted, %llu tracking period(s), %llu fault(s) counted",
             (unsigned long long)s.promoted_regions, (unsigned long long)s.periods, (unsigned long long)s.faults);
    return 0;
}

static void hps_arena_shutdown(void) { p_shutdown(); }

const struct pw_arena pw_arena_hps = {
    .name = "hps",
    .init = hps_arena_init,
    .alloc = hps_arena_alloc,
    .alloc_at = NULL,
    .free = hps_arena_free,
    .summary = hps_arena_summary,
    .shutdown = hps_arena_shutdown,
};
