/* The arena behind the Pagewise LD_PRELOAD shim (preload/shim.c).
 *
 * The shim decides *which* memory leaves libc and the kernel (size, kind, re-entrancy, fork)
 * and keeps every call the program makes on it meaningful; an arena decides *where* it goes.
 * `pagewise run` (DLM) and `pagewise hps run` (HPS's tracked arena) differ only in the arena:
 * PAGEWISE_PRELOAD_ARENA names it.
 *
 * An arena hands out page-aligned, zero-filled areas of whole pages, private to the program:
 * not inherited by fork(2), or inherited and made the child's own copy (`copy_in_child`). The shim then forwards what the program does to parts of an area
 * — each call with the meaning Linux gives it on private anonymous memory — and frees the area
 * with `free` while any of it is still the arena's. An area whose every part was unmapped or
 * detached is the arena's to release by itself; the shim never names it again.
 */
#ifndef PAGEWISE_PRELOAD_ARENA_H
#define PAGEWISE_PRELOAD_ARENA_H

#include <stddef.h>

struct pw_arena {
    const char *name;
    /* Start the arena; `lib` is the dlopen handle of libpagewise.so. 0 or a negative errno.
     * Runs once, in the shim's constructor, before the program's main. */
    int (*init)(void *lib);
    /* A zero-filled, page-aligned area of at least len bytes (exactly its whole pages are the
     * program's), or NULL (errno set). */
    void *(*alloc)(size_t len);
    /* Optional (NULL: cannot). The area of exactly [addr, addr+len) (page-aligned), replacing
     * what is mapped there, zero-filled; NULL when the arena cannot (then nothing changed). */
    void *(*alloc_at)(void *addr, size_t len);
    /* Give back what is left of an area from alloc/alloc_at. 0 or a negative errno. */
    int (*free)(void *area);
    /* Give back the memory of [addr, addr+len), a part of a block of the shim's malloc that
     * was detached earlier and dies with the block now (DLM: unmapped; HPS, whose blocks
     * share one mapping: its pages dropped). */
    void (*release_detached)(void *addr, size_t len);
    /* [addr, addr+len) (page-aligned, inside one area) reads as zeros from now on
     * (MADV_DONTNEED, MADV_FREE); its memory is released. 0 or a negative errno. */
    int (*discard)(void *addr, size_t len);
    /* [addr, addr+len) (page-aligned, inside one area) is unmapped (munmap); nothing of it is
     * the arena's any more. `replace`: leave the mapping in place, a MAP_FIXED mapping is
     * about to replace it (so no other thread's mmap can take the range in between). */
    int (*unmap)(void *addr, size_t len, int replace);
    /* [addr, addr+len) (page-aligned, inside one area) leaves the arena with its data: plain
     * private anonymous memory at the same address from now on (before mprotect makes it
     * anything but read-write, or where the program asked for something the arena cannot
     * give, such as its own MADV_HUGEPAGE under HPS). */
    int (*detach)(void *addr, size_t len);
    /* Optional: MADV_WILLNEED. */
    int (*prefetch)(void *addr, size_t len);
    /* Optional: any other madvise advice on [addr, addr+len) (inside one area). Returns 0
     * (honoured or, as the kernel would for this memory, without effect), 1 (the shim should
     * detach the range: the program asked for what only plain memory gives), or a negative
     * errno. NULL: every such advice is without effect. */
    int (*advise)(void *addr, size_t len, int advice);
    /* Optional (NULL): one line on what the arena did, for the end-of-run report. 0 or a
     * negative errno. */
    int (*summary)(char *buf, size_t n);
    /* Optional (NULL: the areas are not inherited, MADV_DONTFORK). In a child made by fork(2),
     * before it runs on: [addr, addr+len), a routed range inherited still shared with the
     * parent, becomes plain private memory holding what it holds now. 0 or a negative errno. */
    int (*copy_in_child)(void *addr, size_t len);
    /* Not inherited (MADV_DONTFORK), and a child made by fork(2) is to get a copy: the forking
     * thread reads each routed range and the child receives it into plain memory (fork.c). */
    int stream_to_child;
    /* Optional (NULL: every page may): which pages of [addr, addr+len) (page-aligned, len at
     * most 4096 pages) may hold data (vec[i] = 1) and which read as zeros for sure (0), as
     * mincore(2) gives. 0 or a negative errno. */
    int (*holds_data)(void *addr, size_t len, unsigned char *vec);
    /* Optional (NULL): the program began listening for connections (listen(2)): a server,
     * which runs until it is stopped. Called once, without the shim's lock. */
    void (*serving)(void);
    /* The program `pagewise run` started is exiting (the shim's destructor; other threads may
     * still run): write what the run reports. Not called in the processes it execs. Memory
     * stays valid until the process is gone. */
    void (*finish)(void);
};

/* The arenas this shim knows. */
extern const struct pw_arena pw_arena_dlm;
extern const struct pw_arena pw_arena_hps;

#endif
