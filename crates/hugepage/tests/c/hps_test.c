/* The HPS C API end to end: a dense half of an arena must end up PMD-mapped (smaps
 * ShmemPmdMapped), the sparse hot pages of the other half must be handed to the compaction
 * function and moved onto hugepage memory, notifications go through hps_wait_signal, and
 * tracking stops and restarts. Prints "OK" and exits 0 on success. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pagewise.h"

#define PAGE 4096UL
#define REGION (2UL << 20)
#define NPAGES (4 * REGION / PAGE)

static char *arena;
static char *where[NPAGES]; /* the application's "object pointers": where each page lives */
static size_t moved_total;

static void fail(const char *what, long v) {
    fprintf(stderr, "FAIL: %s (%ld)\n", what, v);
    exit(1);
}

static size_t compact(void *ctx, const struct hps_page *pages, size_t n) {
    (void)ctx;
    size_t moved = 0;
    for (size_t i = 0; i < n; i++) {
        size_t p = (pages[i].addr - (uintptr_t)arena) / PAGE;
        char *dst = hps_huge_alloc(PAGE);
        if (!dst) fail("hps_huge_alloc", errno);
        memcpy(dst, (char *)pages[i].addr, PAGE);
        where[p] = dst;
        if (hps_release((void *)pages[i].addr, PAGE) != 0) fail("hps_release", 0);
        moved++;
    }
    moved_total += moved;
    return moved;
}

static int is_hot(size_t p) { return p < NPAGES / 2 || p % 8 == 0; }

static void touch_hot(void) {
    for (size_t p = 0; p < NPAGES; p++)
        if (is_hot(p)) where[p][64] += 1;
}

static long pmd_mapped_kb(void *addr) {
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512];
    int in = 0;
    long kb = 0;
    unsigned long lo, hi, a = (unsigned long)addr;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            in = lo <= a && a < hi;
            continue;
        }
        long v;
        if (in && sscanf(line, "ShmemPmdMapped: %ld kB", &v) == 1) kb += v;
    }
    fclose(f);
    return kb;
}

int main(void) {
    struct hps_config cfg;
    hps_config_default(&cfg);
    cfg.notify = HPS_NOTIFY_WAIT;
    cfg.interval_ms = 5;
    cfg.publish = 0;
    if (hps_enable_track(&cfg) != 0) fail("hps_enable_track", 0);
    if (hps_set_functions(NULL, compact, NULL) != 0) fail("hps_set_functions", 0);
    arena = hps_arena_alloc(4 * REGION);
    if (!arena || (uintptr_t)arena % REGION) fail("hps_arena_alloc", errno);
    for (size_t p = 0; p < NPAGES; p++) {
        where[p] = arena + p * PAGE;
        if (is_hot(p)) where[p][0] = (char)p;
    }
    struct hps_config bad = cfg;
    bad.notify = 42;
    if (hps_enable_track(&bad) != -EINVAL) fail("bad config accepted", 0);

    /* Run the "application" until both decisions were made. */
    for (int round = 0; round < 2000; round++) {
        touch_hot();
        int64_t n = hps_wait_signal(2);
        if (n < 0) fail("hps_wait_signal", n);
        struct hps_stats st;
        hps_stats(&st);
        if (st.promoted_regions >= 2 && moved_total >= NPAGES / 2 / 8) break;
    }
    struct hps_stats st;
    if (hps_stats(&st) != 0) fail("hps_stats", 0);
    if (st.promoted_regions != 2) fail("promoted regions", (long)st.promoted_regions);
    if (moved_total != NPAGES / 2 / 8) fail("compacted pages", (long)moved_total);
    if (st.notifications_received == 0) fail("no notification received", 0);
    long kb = pmd_mapped_kb(arena);
    if (kb != 2 * REGION / 1024) fail("ShmemPmdMapped kB of the arena", kb);
    for (size_t p = 0; p < NPAGES; p++)
        if (is_hot(p) && where[p][0] != (char)p) fail("data lost at page", (long)p);

    /* Nothing left to decide: the active list is empty. */
    if (hps_get_active(NULL, 0) != 0) fail("active pages left", hps_get_active(NULL, 0));

    /* Stop and restart tracking. */
    if (hps_disable_track() != 0) fail("hps_disable_track", 0);
    hps_stats(&st);
    uint64_t p0 = st.periods;
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
    hps_stats(&st);
    if (st.periods != p0) fail("tracking did not stop", (long)(st.periods - p0));
    if (hps_enable_track(&cfg) != 0) fail("restart", 0);
    nanosleep(&ts, NULL);
    hps_stats(&st);
    if (st.periods == p0) fail("tracking did not restart", 0);

    char report[256];
    int64_t len = hps_page_acs(report, sizeof report);
    if (len <= 0 || strstr(report, " : 0x") == NULL) fail("page_acs report", len);

    if (hps_arena_free(arena) != 0) fail("hps_arena_free", 0);
    if (hps_arena_free(arena) != -EINVAL) fail("double free not refused", 0);
    hps_shutdown();
    printf("OK\n");
    return 0;
}
