/* The HPS arena of the preload shim (`pagewise hps run`): routed memory lives in tracked memfd
 * arenas of libpagewise's HPS (hps_arena_alloc: 2 MiB aligned, whole 2 MiB regions), whose
 * accesses HPS counts; hot regions are collapsed into hugepages (MADV_COLLAPSE),
 * promote-only. Configured from the PAGEWISE_HPS_* environment `pagewise hps run` sets.
 *
 * Packing. Each tracked arena is whole 2 MiB regions, so one per allocation would leave half
 * of every 1 MiB allocation's region empty, and promoting that region would fill the empty
 * half with memory too (memcached's slab pages are 1 MiB). Allocations up to CHUNK/4 are
 * therefore cut one after the other from shared CHUNK-sized arenas (pieces); a piece's memory
 * goes back as soon as it is freed (a hole punched in the memfd) and a chunk whose pieces are
 * all gone is freed whole. Larger allocations get an arena of their own, and with
 * `--track-placed` so does memory the program places itself (MAP_FIXED, a reservation it
 * commits, a mapping at its hint): an arena exactly there (hps_arena_alloc_at), which may lie
 * in a hole of a chunk.
 *
 * Parts of a piece the program unmaps or takes over (detach: its own MADV_HUGEPAGE, an
 * mprotect) are given up by HPS (hps_unmap, hps_detach): never tracked, collapsed or unmapped
 * by it again. A piece is gone once nothing of it is HPS's or the program freed it. What the
 * program took over of a block and then freed (release_detached) is plain memory: dropped,
 * and unmapped when its chunk goes (before: the chunk's span holds it, so nothing else may be
 * mapped there yet).
 *
 * The arenas are MAP_SHARED memfds: a child made by fork(2) inherits them still shared with
 * its parent, and before it runs on, each routed range becomes a private copy in the child
 * (copy_in_child), while the parent waits in fork (shim.c): each then sees the memory as it was
 * at the fork plus its own writes, as fork(2) gives (a child reading its parent's arrays:
 * Python's multiprocessing, a snapshot such as redis's BGSAVE). Eager, where the kernel would
 * copy on write: the child holds a copy of every page in memory of the routed ranges. */
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

#include "arena.h"
#include "shim.h"

#define HUGE (2UL << 20)

extern void *__libc_malloc(size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);

/* struct hps_stats of include/pagewise/hps.h. */
struct pw_hps_stats {
    uint64_t periods, armed_pages, faults;
    uint64_t promoted_regions, compacted_pages;
    uint64_t notifications_sent, notifications_received;
};

static int (*p_start)(double, uint32_t);
static void *(*p_alloc)(size_t);
static void *(*p_alloc_at)(void *, size_t); /* optional: older libpagewise lacks it */
static int (*p_free)(void *);
static int (*p_release)(void *, size_t);
static int (*p_unmap)(void *, size_t);
static int (*p_forget)(void *, size_t);
static int (*p_detach)(void *, size_t);
static int (*p_stats)(struct pw_hps_stats *);
static int (*p_state)(char *, size_t); /* optional: older libpagewise lacks it */
static int (*p_serving)(void);         /* optional, likewise */
/* Memory the program places itself gets an arena (PAGEWISE_HPS_TRACK_PLACED=1,
 * `--track-placed`); otherwise it stays the kernel's. */
static int track_placed;

static int hps_arena_init(void *lib) {
    p_start = (int (*)(double, uint32_t))dlsym(lib, "hps_preload_start");
    p_alloc = (void *(*)(size_t))dlsym(lib, "hps_arena_alloc");
    p_alloc_at = (void *(*)(void *, size_t))dlsym(lib, "hps_arena_alloc_at");
    p_free = (int (*)(void *))dlsym(lib, "hps_arena_free");
    p_release = (int (*)(void *, size_t))dlsym(lib, "hps_release");
    p_unmap = (int (*)(void *, size_t))dlsym(lib, "hps_unmap");
    p_forget = (int (*)(void *, size_t))dlsym(lib, "hps_forget");
    p_detach = (int (*)(void *, size_t))dlsym(lib, "hps_detach");
    p_stats = (int (*)(struct pw_hps_stats *))dlsym(lib, "hps_stats");
    p_state = (int (*)(char *, size_t))dlsym(lib, "hps_preload_state");
    p_serving = (int (*)(void))dlsym(lib, "hps_preload_serving");
    if (!p_start || !p_alloc || !p_free || !p_release || !p_unmap || !p_forget || !p_detach || !p_stats)
        return -ENOSYS;
    const char *placed = getenv("PAGEWISE_HPS_TRACK_PLACED");
    track_placed = placed && strcmp(placed, "1") == 0;
    const char *frac = getenv("PAGEWISE_HPS_PROMOTE_FRACTION");
    const char *interval = getenv("PAGEWISE_HPS_INTERVAL_MS");
    return p_start(frac ? strtod(frac, NULL) : 0.0, interval ? (uint32_t)strtoul(interval, NULL, 10) : 0);
}

#define CHUNK (32UL << 20)
#define MAX_CHUNKS 4096

struct chunk {
    char *base;                 /* NULL: free slot */
    size_t used;                /* bytes handed out (bump) */
    size_t live;                /* pieces not yet gone */
    struct pw_ranges dead;      /* taken-over parts of freed blocks: unmapped with the chunk */
};
/* A piece: its bytes still HPS's, its chunk (or -1: an arena of its own), and where it starts
 * and ends (what alloc returned). */
struct piece {
    size_t mapped;
    int chunk;
    uintptr_t start, end;
};
static struct chunk chunks[MAX_CHUNKS];
static struct chunk *cur;
/* The parts of pieces still HPS's (tag: struct piece *): a part the program gives up leaves
 * the table, so the ranges never overlap, and a piece placed where another gave memory up (a
 * MAP_FIXED over part of it, an arena in its hole) finds the table free there. Before, a
 * piece kept its whole range until it was gone: the table (sorted and disjoint by contract)
 * got overlapping ranges, its lookups then missed pieces or found other ones, and chunks
 * whose pieces were never found again stayed mapped for good. */
static struct pw_ranges pieces;
static int cut(uintptr_t lo, uintptr_t hi);
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void *new_arena(size_t len) {
    void *p = p_alloc(len);
    if (!p)
        return NULL;
    return p;
}

static int record(char *p, size_t len, int chunk) {
    struct piece *pc = __libc_malloc(sizeof *pc);
    if (!pc || pw_ranges_add(&pieces, (uintptr_t)p, (uintptr_t)p + len, (uintptr_t)pc) < 0) {
        __libc_free(pc);
        return -ENOMEM;
    }
    *pc = (struct piece){len, chunk, (uintptr_t)p, (uintptr_t)p + len};
    return 0;
}

static void *hps_arena_alloc(size_t len) {
    size_t whole = pw_page_up(len);
    if (whole > CHUNK / 4) {
        void *p = new_arena(len);
        pthread_mutex_lock(&mu);
        int rc = p ? record(p, whole, -1) : 0;
        pthread_mutex_unlock(&mu);
        if (rc < 0) {
            p_free(p);
            errno = ENOMEM;
            return NULL;
        }
        return p;
    }
    pthread_mutex_lock(&mu);
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
        *slot = (struct chunk){base, 0, 0, {0}};
        cur = slot;
    }
    char *p = cur->base + cur->used;
    if (record(p, whole, (int)(cur - chunks)) < 0) {
        pthread_mutex_unlock(&mu);
        errno = ENOMEM;
        return NULL;
    }
    cur->used += whole;
    cur->live++;
    pthread_mutex_unlock(&mu);
    return p;
}

/* Exactly [addr, addr+len), where the program placed a mapping (MAP_FIXED, a reservation it
 * commits, a mapping at its hint): an arena of its own, whose 2 MiB regions wholly inside can
 * be promoted. On failure the range is what every such call asks for without HPS, fresh
 * zero-filled read-write private memory (or untouched), and the shim goes on as the kernel
 * would have. */
static void *hps_arena_alloc_at(void *addr, size_t len) {
    if (!track_placed || !p_alloc_at)
        return NULL; /* the range untouched: the kernel maps or protects it */
    size_t whole = pw_page_up(len);
    void *p = p_alloc_at(addr, whole);
    if (!p)
        return NULL;
    pthread_mutex_lock(&mu);
    /* Nothing of a piece is recorded there any more (what the program replaced or unmapped
     * was given up); should anything be, it is not that piece's now. */
    (void)cut((uintptr_t)p, (uintptr_t)p + whole);
    int rc = record(p, whole, -1);
    pthread_mutex_unlock(&mu);
    if (rc < 0) {
        p_free(p);
        pw_sys_mmap(addr, whole, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        errno = ENOMEM;
        return NULL;
    }
    return p;
}

/* The chunk is done with: its arena freed, the freed blocks' taken-over parts unmapped. */
static int drop_chunk(struct chunk *c) {
    int rc = p_free(c->base);
    for (size_t i = 0; i < c->dead.n; i++)
        pw_sys_munmap((void *)c->dead.v[i].start, c->dead.v[i].end - c->dead.v[i].start);
    pw_ranges_clear(&c->dead);
    c->base = NULL;
    if (cur == c)
        cur = NULL;
    return rc;
}

/* The parts of pc still in the table, one by one (none: 0). */
static int piece_part(struct piece *pc, uintptr_t from, struct pw_range *out) {
    for (uintptr_t at = from; pw_ranges_next(&pieces, at, pc->end, out); at = out->end)
        if (out->tag == (uintptr_t)pc)
            return 1;
    return 0;
}

/* Piece pc is gone (its parts out of the table): its chunk loses it; the caller frees an own
 * arena itself. */
static int piece_gone(struct piece *pc) {
    int chunk = pc->chunk;
    __libc_free(pc);
    if (chunk >= 0 && --chunks[chunk].live == 0)
        return drop_chunk(&chunks[chunk]);
    return 0;
}

static int hps_arena_free(void *p) {
    pthread_mutex_lock(&mu);
    /* The piece that starts at p: the first part at or after p is its (the shim frees a block
     * while some of it is still routed, and nothing else lies inside a block). */
    struct pw_range r;
    struct piece *pc = NULL;
    if (pw_ranges_next(&pieces, (uintptr_t)p, UINTPTR_MAX, &r) && ((struct piece *)r.tag)->start == (uintptr_t)p)
        pc = (struct piece *)r.tag;
    int rc = 0;
    if (!pc) {
        rc = -EINVAL;
    } else {
        /* What is still HPS's goes back at once (a hole in the memfd), part by part: a part
         * the program took over is not HPS's to release. */
        int own = pc->chunk < 0;
        while (piece_part(pc, pc->start, &r)) {
            int e = own ? 0 : p_release((void *)r.start, r.end - r.start);
            rc = rc < 0 ? rc : e;
            pw_ranges_remove(&pieces, r.start, r.end); /* a whole range: never splits */
        }
        int e = piece_gone(pc);
        rc = rc < 0 ? rc : e;
        if (own) {
            e = p_free(p);
            rc = rc < 0 ? rc : e;
        }
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

/* [lo, hi) is no longer any piece's: its parts leave the table, and a piece goes when nothing
 * of it is left (an own arena HPS freed itself). Under mu. 0 or a negative errno. */
static int cut(uintptr_t lo, uintptr_t hi) {
    struct pw_range r;
    int rc = 0;
    while (pw_ranges_next(&pieces, lo, hi, &r)) {
        struct piece *pc = (struct piece *)r.tag;
        size_t n = r.end - r.start;
        if (pw_ranges_remove(&pieces, r.start, r.end) < 0)
            return -ENOMEM; /* splitting a part: then the part stays recorded */
        pc->mapped -= n < pc->mapped ? n : pc->mapped;
        if (pc->mapped == 0) {
            int e = piece_gone(pc);
            rc = rc < 0 ? rc : e;
        }
        lo = r.end;
    }
    return rc;
}

/* [addr, addr+len) of a piece is no longer HPS's: `give_up` tells HPS, and the range leaves
 * the table whatever HPS said (the shim stops routing it either way). */
static int give_up_part(void *addr, size_t len, int (*give_up)(void *, size_t)) {
    pthread_mutex_lock(&mu);
    int rc = give_up(addr, len);
    int e = cut((uintptr_t)addr, (uintptr_t)addr + len);
    rc = rc < 0 ? rc : e;
    pthread_mutex_unlock(&mu);
    return rc;
}

static int hps_arena_unmap(void *addr, size_t len, int replace) {
    return give_up_part(addr, len, replace ? p_forget : p_unmap);
}

static int hps_arena_detach(void *addr, size_t len) { return give_up_part(addr, len, p_detach); }

static void hps_arena_release_detached(void *addr, size_t len) {
    pthread_mutex_lock(&mu);
    struct chunk *c = NULL;
    for (size_t i = 0; i < MAX_CHUNKS && !c; i++)
        if (chunks[i].base && (char *)addr >= chunks[i].base && (char *)addr < chunks[i].base + CHUNK)
            c = &chunks[i];
    /* Inside a live chunk the range must stay mapped (its span); its memory goes now. */
    if (c && pw_ranges_add(&c->dead, (uintptr_t)addr, (uintptr_t)addr + len, 0) == 0)
        pw_sys_madvise(addr, len, MADV_DONTNEED);
    else
        pw_sys_munmap(addr, len);
    pthread_mutex_unlock(&mu);
}

static int hps_arena_discard(void *addr, size_t len) { return p_release(addr, len); }

/* The program's own MADV_HUGEPAGE is kept: only plain memory gets THP from the kernel the
 * way the program asked (on its first touch, for the whole range), so the range is detached.
 * Every other advice has no effect on tracked memory. */
static int hps_arena_advise(void *addr, size_t len, int advice) {
    (void)addr;
    (void)len;
    return advice == MADV_HUGEPAGE ? 1 : 0;
}

static int hps_arena_summary(char *buf, size_t n) {
    struct pw_hps_stats s;
    int rc = p_stats(&s);
    if (rc < 0)
        return rc;
    int w = snprintf(buf, n, "hps: %llu region(s) promoted, %llu tracking period(s), %llu fault(s) counted",
                     (unsigned long long)s.promoted_regions, (unsigned long long)s.periods,
                     (unsigned long long)s.faults);
    /* "; tracking converged at exit" (or "still tracking at exit"), "; converged N time(s), ..." */
    char state[768];
    if (p_state && w > 0 && (size_t)w < n && p_state(state, sizeof state) == 0)
        snprintf(buf + w, n - (size_t)w, "; %s", strncmp(state, "hps: ", 5) == 0 ? state + 5 : state);
    return 0;
}

/* In a child made by fork(2): [addr, addr+len) becomes a private copy of what it holds. Only
 * pages in memory are copied (mincore(2) answers for the memfd's page cache): reading a hole
 * through the shared mapping would allocate it, in the parent's file. */
static int hps_arena_copy_in_child(void *addr, size_t len) {
    char *src = addr;
    char *copy = pw_sys_mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (copy == MAP_FAILED)
        return -errno;
    unsigned char vec[4096];
    const size_t step = sizeof vec * PW_PAGE;
    for (size_t at = 0; at < len; at += step) {
        size_t n = len - at < step ? len - at : step, pages = n / PW_PAGE;
        if (mincore(src + at, n, vec) != 0) {
            int e = errno;
            pw_sys_munmap(copy, len);
            return -e;
        }
        for (size_t i = 0; i < pages;) {
            size_t j = i;
            while (j < pages && (vec[j] & 1))
                j++;
            if (j > i)
                memcpy(copy + at + i * PW_PAGE, src + at + i * PW_PAGE, (j - i) * PW_PAGE);
            i = j + 1;
        }
    }
    /* Replaces the shared mapping at once: no moment with nothing mapped there. */
    if (pw_sys_mremap(copy, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, addr) == MAP_FAILED) {
        int e = errno;
        pw_sys_munmap(copy, len);
        return -e;
    }
    return 0;
}

/* A server runs until it is stopped: promotion and tracking get their whole pace share now
 * rather than as the program ages (crates/hugepage/src/pace.rs). */
static void hps_arena_serving(void) {
    if (p_serving)
        p_serving();
}

/* Exit: the tracking thread may run on with the program's other threads; memory stays. */
static void hps_arena_finish(void) {}

const struct pw_arena pw_arena_hps = {
    .name = "hps",
    .init = hps_arena_init,
    .alloc = hps_arena_alloc,
    .alloc_at = hps_arena_alloc_at,
    .free = hps_arena_free,
    .release_detached = hps_arena_release_detached,
    .discard = hps_arena_discard,
    .unmap = hps_arena_unmap,
    .detach = hps_arena_detach,
    .prefetch = NULL,
    .advise = hps_arena_advise,
    .summary = hps_arena_summary,
    .copy_in_child = hps_arena_copy_in_child,
    .serving = hps_arena_serving,
    .finish = hps_arena_finish,
};
