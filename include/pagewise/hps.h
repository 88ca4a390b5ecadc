/* HPS: hot pages get hugepages, cold pages don't (Pagewise, seed 000).
 *
 * Memory from hps_arena_alloc() is tracked page by page. When pages turn active the tracker
 * notifies the process with a queued real-time signal (SIGRTMIN + signal_offset) carrying the
 * number of active pages, and a decision step runs: per 2 MiB region, promote it to a hugepage
 * (MADV_COLLAPSE) when at least promote_fraction of its pages are active, else hand its active
 * pages to the compaction function, which moves the objects on them to hps_huge_alloc() memory
 * and frees the old pages with hps_release(). Return values: 0 or a count on success, a
 * negative errno on failure; pointer functions return NULL and set errno.
 */
#ifndef PAGEWISE_HPS_H
#define PAGEWISE_HPS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* How notifications are handled. */
#define HPS_NOTIFY_NONE 0    /* no signal: call hps_process() yourself */
#define HPS_NOTIFY_HANDLER 1 /* a signal handler wakes an HPS thread that runs the decision step */
#define HPS_NOTIFY_WAIT 2    /* your thread blocks in hps_wait_signal() and runs it */

/* Results of an hps_decide_fn. */
#define HPS_DEFAULT (-1)
#define HPS_OBSERVE 0
#define HPS_PROMOTE 1
#define HPS_COMPACT 2
#define HPS_OBSERVE_FULLY 3

struct hps_config {
    uint32_t interval_ms;      /* tracking period while busy (0: default 20) */
    uint32_t max_interval_ms;  /* longest period once idle (0: default 320) */
    uint32_t active_threshold; /* acscount that makes a page active (0: default 1) */
    uint32_t sample_pages;     /* pages of a region armed per period (0: default 64) */
    uint32_t budget_pages;     /* pages armed per period in all (0: default 262144) */
    int notify;                /* HPS_NOTIFY_* */
    int signal_offset;         /* notification signal = SIGRTMIN + this */
    int publish;               /* publish counts for `pagewise hps report --pid` */
    double promote_fraction;   /* (0: default 0.25) */
    uint64_t host_hugepages;   /* share a host-wide budget of this many hugepages (0: none) */
};

struct hps_page {
    uintptr_t addr;
    uint32_t count; /* acscount: tracking periods in which the page was accessed */
    uint32_t reserved;
};

struct hps_stats {
    uint64_t periods, armed_pages, faults;
    uint64_t promoted_regions, compacted_pages;
    uint64_t notifications_sent, notifications_received;
};

/* Decide a 2 MiB region: return HPS_DEFAULT to apply the built-in rule. */
typedef int (*hps_decide_fn)(void *ctx, uintptr_t region, uint32_t total, uint32_t observed, uint32_t active);
/* Move the objects living on `pages`; return how many pages were moved. */
typedef size_t (*hps_compact_fn)(void *ctx, const struct hps_page *pages, size_t n);

int hps_config_default(struct hps_config *cfg);
int hps_enable_track(const struct hps_config *cfg); /* NULL: defaults; again: restart */
int hps_disable_track(void);
int hps_shutdown(void);
int hps_set_functions(hps_decide_fn decide, hps_compact_fn compact, void *ctx);
int64_t hps_wait_signal(int timeout_ms); /* active pages notified; 0 on timeout */
int64_t hps_process(void);               /* promoted regions + compacted pages */
int64_t hps_get_active(struct hps_page *buf, size_t n);
void *hps_arena_alloc(size_t len);
/* Tracked memory at exactly [addr, addr+len) (page aligned), replacing what is mapped there
 * (a mapping the caller placed: MAP_FIXED, a reservation it commits): addr, or NULL with errno
 * set and the range plain zero-filled read-write private memory (or as it was, if nothing was
 * mapped over it yet). Free with hps_arena_free(addr). */
void *hps_arena_alloc_at(void *addr, size_t len);
int hps_arena_free(void *p);
int hps_release(void *p, size_t len);
/* Calls on part of an arena (page aligned), with the meaning Linux gives them on private
 * memory: hps_unmap unmaps [p, p+len) (an arena of which nothing is left is freed);
 * hps_forget does the same but leaves the range mapped for the caller to map over it at once
 * (MAP_FIXED); hps_detach takes the range out of HPS with its data (plain private anonymous
 * memory from now on, e.g. for the program's own MADV_HUGEPAGE or mprotect). */
int hps_unmap(void *p, size_t len);
int hps_forget(void *p, size_t len);
int hps_detach(void *p, size_t len);
void *hps_huge_alloc(size_t len);
int hps_stats(struct hps_stats *out);
int64_t hps_page_acs(char *buf, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* PAGEWISE_HPS_H */
