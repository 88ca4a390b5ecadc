/* The arena behind the Pagewise LD_PRELOAD shim (preload/shim.c).
 *
 * The shim decides *which* allocations leave libc (size, kind, re-entrancy, fork); an arena
 * decides *where* they go. `pagewise run` (DLM) and `pagewise hps run` (HPS's tracked arena)
 * differ only in the arena: PAGEWISE_PRELOAD_ARENA names it. An arena hands out page-aligned,
 * zero-filled areas of whole pages and takes them back whole.
 */
#ifndef PAGEWISE_PRELOAD_ARENA_H
#define PAGEWISE_PRELOAD_ARENA_H

#include <stddef.h>

struct pw_arena {
    const char *name;
    /* Start the arena; `lib` is the dlopen handle of libpagewise.so. 0 or a negative errno.
     * Runs once, in the shim's constructor, before the program's main. */
    int (*init)(void *lib);
    /* A zero-filled, page-aligned area of at least len bytes, or NULL (errno set). */
    void *(*alloc)(size_t len);
    /* The area of exactly [addr, addr+len) (page-aligned), replacing what is mapped there;
     * the caller preserves the content. NULL when the arena cannot (then nothing changed). */
    void *(*alloc_at)(void *addr, size_t len);
    /* Give back an area from alloc/alloc_at. 0 or a negative errno. */
    int (*free)(void *p);
    /* Optional (NULL): one line on what the arena did, for the end-of-run report. 0 or a
     * negative errno. */
    int (*summary)(char *buf, size_t n);
    /* Stop the arena (at exit of the process that started it). */
    void (*shutdown)(void);
};

/* The arenas this shim knows. */
extern const struct pw_arena pw_arena_dlm;
extern const struct pw_arena pw_arena_hps;

#endif
