/* The DLM arena of the preload shim: areas from libpagewise's dlm_* C ABI
 * (include/pagewise/dlm.h), configured from the PAGEWISE_DLM_* environment `pagewise run`
 * sets (fault mode: the handler thread, so that system calls writing into DLM memory, such
 * as read(2) into a malloc'd array, are served instead of failing with EFAULT). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/mman.h>

#include "../include/pagewise/dlm.h"
#include "arena.h"
#include "shim.h"

static int (*p_init)(const void *);
static int (*p_alloc)(size_t, void **);
static long (*p_alloc_at)(void *, size_t);
static int (*p_free)(void *);
static int (*p_discard)(void *, size_t);
static int (*p_unmap)(void *, size_t);
static int (*p_forget)(void *, size_t);
static int (*p_detach)(void *, size_t);
static int (*p_prefetch)(void *, size_t);
static int (*p_set_access)(void *, size_t, int);
static int (*p_finish)(void);
static int (*p_stats)(struct dlm_stats *);
static int (*p_holds_data)(void *, size_t, unsigned char *); /* optional: older libpagewise lacks it */

#define SYM(var, name)                                                                                                 \
    do {                                                                                                               \
        *(void **)&var = dlsym(lib, name);                                                                             \
        if (!var)                                                                                                      \
            return -ENOSYS;                                                                                            \
    } while (0)

static int dlm_arena_init(void *lib) {
    SYM(p_init, "dlm_init");
    SYM(p_alloc, "dlm_alloc");
    SYM(p_alloc_at, "dlm_alloc_at");
    SYM(p_free, "dlm_free");
    SYM(p_discard, "dlm_discard");
    SYM(p_unmap, "dlm_unmap");
    SYM(p_forget, "dlm_forget");
    SYM(p_detach, "dlm_detach");
    SYM(p_prefetch, "dlm_prefetch");
    SYM(p_set_access, "dlm_set_access");
    SYM(p_finish, "dlm_finish");
    SYM(p_stats, "dlm_stats");
    *(void **)&p_holds_data = dlsym(lib, "dlm_holds_data");
    return p_init(NULL);
}

/* The C ABI's negative errno as the shim's convention: NULL with errno set. */
static void *ptr_or_errno(int rc, void *p) {
    if (rc < 0) {
        errno = -rc;
        return NULL;
    }
    return p;
}

static void *dlm_arena_alloc(size_t len) {
    void *p = NULL;
    int rc = p_alloc(len, &p);
    return ptr_or_errno(rc, p);
}

static void *dlm_arena_alloc_at(void *addr, size_t len) {
    long rc = p_alloc_at(addr, len);
    if (rc >= 0 && (size_t)rc != len) {
        /* A tail shorter than a base page stays the kernel's: not one area, refuse. */
        p_unmap(addr, (size_t)rc);
        errno = EINVAL;
        return NULL;
    }
    return ptr_or_errno((int)(rc < 0 ? rc : 0), addr);
}

static int dlm_arena_free(void *p) { return p_free(p); }

/* A dead block's detached part is plain memory of its own mapping: unmapped. */
static void dlm_arena_release_detached(void *addr, size_t len) { pw_sys_munmap(addr, len); }

static int dlm_arena_unmap(void *addr, size_t len, int replace) {
    return replace ? p_forget(addr, len) : p_unmap(addr, len);
}

/* MADV_NORMAL / SEQUENTIAL / RANDOM steer read-ahead; every other advice has no effect on
 * DLM memory (hugepages, merging, dumping, fork behaviour: areas are never inherited). */
static int dlm_arena_advise(void *addr, size_t len, int advice) {
    switch (advice) {
    case MADV_NORMAL:
        return p_set_access(addr, len, 0);
    case MADV_SEQUENTIAL:
        return p_set_access(addr, len, 1);
    case MADV_RANDOM:
        return p_set_access(addr, len, 2);
    default:
        return 0;
    }
}

static int dlm_arena_discard(void *addr, size_t len) { return p_discard(addr, len); }
static int dlm_arena_detach(void *addr, size_t len) { return p_detach(addr, len); }
static int dlm_arena_prefetch(void *addr, size_t len) { return p_prefetch(addr, len); }
static void dlm_arena_finish(void) { p_finish(); }

/* What the paging cost: the end-of-run line a user reads to see whether local memory was
 * enough (faults and fetches) and what the unit size moved (bytes fetched). */
static int dlm_arena_summary(char *buf, size_t n) {
    struct dlm_stats s;
    int rc = p_stats(&s);
    if (rc < 0)
        return rc;
    snprintf(buf, n,
             "dlm: %llu fault(s) (%llu first write(s)), %llu unit(s) fetched (%llu MiB, %llu read ahead), %llu "
             "zero-filled, %llu evicted (%llu written back, %llu MiB); local peak %.1f of %.1f MiB",
             (unsigned long long)s.faults, (unsigned long long)s.wp_faults, (unsigned long long)s.fetched_units,
             (unsigned long long)(s.fetched_bytes >> 20), (unsigned long long)s.readahead_units,
             (unsigned long long)s.zero_units, (unsigned long long)s.evictions, (unsigned long long)s.writebacks,
             (unsigned long long)(s.writeback_bytes >> 20), (double)s.peak_resident_bytes / (1 << 20),
             (double)s.local_limit / (1 << 20));
    return 0;
}

static int dlm_arena_holds_data(void *addr, size_t len, unsigned char *vec) {
    return p_holds_data ? p_holds_data(addr, len, vec) : -ENOSYS;
}

const struct pw_arena pw_arena_dlm = {
    .name = "dlm",
    .init = dlm_arena_init,
    .alloc = dlm_arena_alloc,
    .alloc_at = dlm_arena_alloc_at,
    .free = dlm_arena_free,
    .release_detached = dlm_arena_release_detached,
    .discard = dlm_arena_discard,
    .unmap = dlm_arena_unmap,
    .detach = dlm_arena_detach,
    .prefetch = dlm_arena_prefetch,
    .advise = dlm_arena_advise,
    .summary = dlm_arena_summary,
    .copy_in_child = NULL, /* MADV_DONTFORK: the pages may live on a server */
    .stream_to_child = 1,
    .holds_data = dlm_arena_holds_data,
    .finish = dlm_arena_finish,
};
