/* bt_like.c, unchanged, with its arrays from the DLM library instead of malloc: the library
 * side of `pagewise eval dlm-programs`' path comparison (the same source runs unmodified under
 * `pagewise run` for the other side). The runtime starts at the first allocation with the
 * configuration `pagewise run` would give the shim (PAGEWISE_DLM_* in the environment, read by
 * dlm_init(NULL)) and stops at exit; as under the shim, allocations below 1 MiB stay in libc. Build: cc -O2 -I include bt_library.c -L DIR -lpagewise */
#include <stdio.h>
#include <stdlib.h>

#include <pagewise/dlm.h>

static int started;

static void stop(void) { dlm_finish(); }

/* Like the shim's default --min-alloc: only allocations of at least 1 MiB go to DLM. */
enum { MIN_ALLOC = 1 << 20 };

static void *library_alloc(size_t len) {
    if (len < MIN_ALLOC)
        return malloc(len);
    if (!started) {
        int rc = dlm_init(NULL);
        if (rc < 0) {
            fprintf(stderr, "bt_library: dlm_init failed (%d)\n", rc);
            exit(1);
        }
        atexit(stop);
        started = 1;
    }
    void *p = NULL;
    return dlm_alloc(len, &p) < 0 ? NULL : p;
}

static void library_free(void *p) {
    if (dlm_free(p) < 0) /* not a DLM area (-EINVAL): one of the small ones */
        free(p);
}

#define malloc library_alloc
#define free library_free
#include "bt_like.c"
