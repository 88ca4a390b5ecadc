/* The DLM arena of the preload shim: areas from libpagewise's dlm_* C ABI
 * (include/pagewise/dlm.h), configured from the PAGEWISE_DLM_* environment `pagewise run`
 * sets (fault mode: the handler thread, so that system calls writing into DLM memory, such
 * as read(2) into a malloc'd array, are served instead of failing with EFAULT). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>

#include "arena.h"

static int (*p_init)(const void *);
static int (*p_alloc)(size_t, void **);
static long (*p_alloc_at)(void *, size_t);
static int (*p_free)(void *);
static int (*p_finish)(void);

static int dlm_arena_init(void *lib) {
    p_init = (int (*)(const void *))dlsym(lib, "dlm_init");
    p_alloc = (int (*)(size_t, void **))dlsym(lib, "dlm_alloc");
    p_alloc_at = (long (*)(void *, size_t))dlsym(lib, "dlm_alloc_at");
    p_free = (int (*)(void *))dlsym(lib, "dlm_free");
    p_finish = (int (*)(void))dlsym(lib, "dlm_finish");
    if (!p_init || !p_alloc || !p_alloc_at || !p_free || !p_finish)
        return -ENOSYS;
    return p_init(NULL);
}

static void *dlm_arena_alloc(size_t len) {
    void *p = NULL;
    int rc = p_alloc(len, &p);
    if (rc < 0) {
        errno = -rc;
        return NULL;
    }
    return p;
}

static void *dlm_arena_alloc_at(void *addr, size_t len) {
    long rc = p_alloc_at(addr, len);
    if (rc < 0) {
        errno = -rc;
        return NULL;
    }
    return addr;
}

static int dlm_arena_free(void *p) { return p_free(p); }

static void dlm_arena_shutdown(void) { p_finish(); }

const struct pw_arena pw_arena_dlm = {
    .name = "dlm",
    .init = dlm_arena_init,
    .alloc = dlm_arena_alloc,
    .alloc_at = dlm_arena_alloc_at,
    .free = dlm_arena_free,
    .shutdown = dlm_arena_shutdown,
};
