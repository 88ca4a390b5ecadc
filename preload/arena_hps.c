/* The HPS arena of the preload shim (`pagewise hps run`): routed allocations live in tracked
 * memfd arenas of libpagewise's HPS (hps_arena_alloc: 2 MiB aligned, whole 2 MiB regions),
 * whose accesses HPS counts; hot regions are collapsed into hugepages (MADV_COLLAPSE),
 * promote-only. Configured from the PAGEWISE_HPS_* environment `pagewise hps run` sets. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define HUGE (2UL << 20)
#define PAGE_SZ 4096UL

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
static int (*p_release)(void *, size_t);
static int (*p_stats)(struct pw_hps_stats *);
static int (*p_shutdown)(void);
static int (*p_state)(char *, size_t); /* optional: older libpagewise lacks it */

static int hps_arena_init(void *lib) {
    p_start = (int (*)(double, uint32_t))dlsym(lib, "hps_preload_start");
    p_alloc = (void *(*)(size_t))dlsym(lib, "hps_arena_alloc");
    p_free = (int (*)(void *))dlsym(lib, "hps_arena_free");
    p_release = (int (*)(void *, size_t))dlsym(lib, "hps_release");
    p_stats = (int (*)(struct pw_hps_stats *))dlsym(lib, "hps_stats");
    p_shutdown = (int (*)(void))dlsym(lib, "hps_shutdown");
    p_state = (int (*)(char *, size_t))dlsym(lib, "hps_preload_state");
    if (!p_start || !p_alloc || !p_free || !p_release || !p_stats || !p_shutdown)
        return -ENOSYS;
    const char *frac = getenv("PAGEWISE_HPS_PROMOTE_FRACTION");
    const char *interval = getenv("PAGEWISE_HPS_INTERVAL_MS");
    return p_start(frac ? strtod(frac, NULL) : 0.0, interval ? (uint32_t)strtoul(interval, NULL, 10) : 0);
}

/* Packing. Each tracked arena is whole 2 MiB regions, so one per allocation would leave half
 * of every 1 MiB allocation's region empty, and promoting that region would fill the empty
 * half with memory too (memcached's slab pages are 1 MiB). Allocations up to CHUNK/4 are
 * therefore cut one after the other from shared CHUNK-sized arenas; a freed piece's memory
 * goes back at once (hps_release: a hole in the memfd) and a chunk whose pieces are all freed
 * is freed whole. Larger allocations get an arena of their own.
 *
 * The arenas are MAP_SHARED memfds: a child made by fork(2) would share them with its parent
 * (its writes landing in the parent's "private" malloc memory), so they are not inherited
 * (MADV_DONTFORK), as DLM's areas are not. */
#define CHUNK (32UL << 20)
#define MAX_CHUNKS 4096
#define MAX_PIECES 65536

struct chunk {
    char *base;  /* NULL: free slot */
    size_t used; /* bytes handed out (bump) */
    size_t live; /* pieces not yet freed */
};
struct piece {
    char *addr;
    size_t len;
};
static struct chunk chunks[MAX_CHUNKS];
static struct chunk *cur;
static struct piece pieces[MAX_PIECES];
static size_t npieces;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void *new_arena(size_t len) {
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

static void *hps_arena_alloc(size_t len) {
    size_t whole = (len + PAGE_SZ - 1) & ~(PAGE_SZ - 1);
    if (whole > CHUNK / 4)
        return new_arena(len);
    pthread_mutex_lock(&mu);
    if (npieces == MAX_PIECES) {
        pthread_mutex_unlock(&mu);
        errno = ENOMEM;
        return NULL;
    }
    if (!cur || cur->used + whole > CHUNK) {
        struct chunk *slot = NULL;
        for (size_t i = 0; i < MAX_CHUNKS && !slot; i++)
            if (!chunks[i].base)
                slot = &chunks[i];
        char *base = slot ? new_arena(CHUNK) : NULL;
        if (!base) {
            pthread_mutex_unlock(&mu);
            if (!slot)
                errno = ENOMEM;
            return NULL;
        }
        *slot = (struct chunk){base, 0, 0};
        cur = slot;
    }
    char *p = cur->base + cur->used;
    cur->used += whole;
    cur->live++;
    pieces[npieces++] = (struct piece){p, whole};
    pthread_mutex_unlock(&mu);
    return p;
}

static int hps_arena_free(void *p) {
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < npieces; i++) {
        if (pieces[i].addr != p)
            continue;
        size_t len = pieces[i].len;
        pieces[i] = pieces[--npieces];
        struct chunk *c = NULL;
        for (size_t k = 0; k < MAX_CHUNKS && !c; k++)
            if (chunks[k].base && (char *)p >= chunks[k].base && (char *)p < chunks[k].base + CHUNK)
                c = &chunks[k];
        int rc = 0;
        if (c && --c->live == 0) {
            rc = p_free(c->base);
            c->base = NULL;
            if (cur == c)
                cur = NULL;
        } else {
            rc = p_release(p, len);
        }
        pthread_mutex_unlock(&mu);
        return rc;
    }
    pthread_mutex_unlock(&mu);
    return p_free(p);
}

static int hps_arena_summary(char *buf, size_t n) {
    struct pw_hps_stats s;
    int rc = p_stats(&s);
    if (rc < 0)
        return rc;
    int w = snprintf(buf, n, "hps: %llu region(s) promoted, %llu tracking period(s), %llu fault(s) counted",
                     (unsigned long long)s.promoted_regions, (unsigned long long)s.periods,
                     (unsigned long long)s.faults);
    /* "; tracking converged at exit; converged N time(s), restarted N time(s), N probe(s) ..." */
    char state[192];
    if (p_state && w > 0 && (size_t)w < n && p_state(state, sizeof state) == 0)
        snprintf(buf + w, n - (size_t)w, "; %s", strncmp(state, "hps: ", 5) == 0 ? state + 5 : state);
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
