/* HPS in 60 lines: a 64 MiB heap whose first quarter is hot and dense, plus one hot page in
 * every eight of the rest. HPS promotes the dense regions to hugepages and hands the scattered
 * hot pages to compact(), which moves them onto hugepage memory.
 *
 *   cargo build --release -p pagewise-capi
 *   cc -O2 -Iinclude examples/c/hps_example.c target/release/libpagewise.a \
 *      -lpthread -ldl -lm -lgcc_s -o hps_example && ./hps_example
 */
#include <stdio.h>
#include <string.h>

#include "pagewise.h"

#define PAGE 4096UL
#define SIZE (64UL << 20)
#define NPAGES (SIZE / PAGE)

static char *heap, *where[NPAGES]; /* where[p]: where the object of page p lives now */

static int hot(size_t p) { return p < NPAGES / 4 || p % 8 == 0; }

/* The application's compaction: copy each hot page's object onto hugepage memory. */
static size_t compact(void *ctx, const struct hps_page *pages, size_t n) {
    (void)ctx;
    for (size_t i = 0; i < n; i++) {
        size_t p = (pages[i].addr - (uintptr_t)heap) / PAGE;
        char *dst = hps_huge_alloc(PAGE);
        if (!dst) return i;
        memcpy(dst, where[p], PAGE);
        where[p] = dst;
        hps_release((void *)pages[i].addr, PAGE); /* the old page's memory goes back */
    }
    return n;
}

int main(void) {
    struct hps_config cfg;
    hps_config_default(&cfg);
    cfg.notify = HPS_NOTIFY_WAIT; /* this thread handles notifications in hps_wait_signal */
    if (hps_enable_track(&cfg) != 0) return 1;
    hps_set_functions(NULL, compact, NULL); /* NULL decide: the 1/4 rule */
    heap = hps_arena_alloc(SIZE);
    if (!heap) return 1;
    for (size_t p = 0; p < NPAGES; p++) where[p] = heap + p * PAGE;

    for (int round = 0; round < 100; round++) {
        for (size_t p = 0; p < NPAGES; p++)
            if (hot(p)) where[p][0]++;
        int64_t n = hps_wait_signal(5); /* 5 ms; runs the decision step when notified */
        if (n > 0) printf("round %d: notified of %lld active pages\n", round, (long long)n);
    }
    struct hps_stats st;
    hps_stats(&st);
    printf("promoted %llu regions, compacted %llu pages, %llu tracking periods\n",
           (unsigned long long)st.promoted_regions, (unsigned long long)st.compacted_pages,
           (unsigned long long)st.periods);
    hps_shutdown();
    return 0;
}
