/* DLM: distributed large memory (crates/dlm). Memory areas larger than this host's memory,
 * backed by `pagewise dlm-server` processes on other hosts; the paging unit is
 * page_size × set count and can change at run time.
 *
 * Return values: 0 (or a count) on success, a negative errno on failure. A memory server that
 * fails while one of its pages is needed stops the program with a message naming it: DLM never
 * returns data it could not fetch.
 *
 * Memory servers admit only clients that prove a shared secret when they connect (a
 * challenge-response handshake: the secret never crosses the wire): dlm_config.secret, or the
 * PAGEWISE_DLM_SECRET environment variable when that is NULL. Pass it through the environment
 * or a file, never on a command line (other users of the host can read command lines).
 *
 * Signals: DLM serves faults on its areas in a SIGBUS handler (DLM_FAULT_SIGBUS) or SIGSEGV
 * handler (DLM_FAULT_SIGSEGV). A fault at an address outside every DLM area goes straight to
 * the handler that was installed before dlm_init, without DLM taking any lock, so a program's
 * own SIGSEGV/SIGBUS handler (guard pages, a JIT, a garbage collector) keeps working for its
 * own memory. A handler installed after dlm_init must pass on the signals it does not handle
 * to the one it replaced. What a program's signal handler (for any signal) may touch: anything
 * but DLM memory and the dlm_* functions. A handler may interrupt a thread inside dlm_alloc,
 * dlm_free or another dlm_* call, which holds the runtime's lock; touching a DLM page that is
 * not resident from there would wait for that lock forever. (While DLM serves a fault it
 * blocks all signals on that thread, so a handler never runs in the middle of one.)
 */
#ifndef PAGEWISE_DLM_H
#define PAGEWISE_DLM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum dlm_fault_mode {
    DLM_FAULT_AUTO = 0,           /* fastest available: SIGBUS, else SIGSEGV */
    DLM_FAULT_HANDLER_THREAD = 1, /* a thread reads userfaultfd messages */
    DLM_FAULT_SIGBUS = 2,         /* userfaultfd SIGBUS, served on the faulting thread; a system
                                   * call meeting a missing DLM page (read(2) into it) fails with
                                   * EFAULT: use HANDLER_THREAD for programs that hand DLM memory
                                   * to the kernel */
    DLM_FAULT_SIGSEGV = 3,        /* no userfaultfd: PROT_NONE + SIGSEGV + mprotect */
};

/* Zero fields take the defaults: local_mem 64 MiB, page_size 16 KiB, max_set 8,
 * set_count = max_set, readahead 32 units (readahead < 0: default; 0 disables it). */
struct dlm_config {
    const char *servers; /* "host:port,host:port" (required) */
    size_t local_mem;    /* most bytes of DLM pages resident on this host */
    size_t page_size;    /* base page: power of two >= 4096 */
    unsigned max_set;    /* largest set count (power of two) */
    unsigned set_count;  /* initial set count (power of two <= max_set) */
    int fault_mode;      /* enum dlm_fault_mode */
    int readahead;       /* units requested ahead of a sequential stream */
    const char *secret;  /* the servers' shared secret (at least 16 bytes); NULL: the
                          * PAGEWISE_DLM_SECRET environment variable */
    const char *redundancy; /* "none" (NULL), "ec:K+M" (K data + M parity pieces of each
                             * page on K+M servers, Reed-Solomon) or "copies:N": with
                             * redundancy a lost memory server loses nothing */
};

struct dlm_stats {
    int mode; /* enum dlm_fault_mode actually in use */
    uint64_t base_page;
    uint32_t set_count;
    uint32_t max_set;
    uint64_t local_limit;
    uint64_t resident_bytes;
    uint64_t peak_resident_bytes;
    uint64_t faults;          /* missing-page faults served */
    uint64_t wp_faults;       /* first writes to a resident unit */
    uint64_t fetched_units;   /* units fetched from their home */
    uint64_t fetched_bytes;
    uint64_t readahead_units;
    uint64_t zero_units;      /* never-written units installed as zeros, no message */
    uint64_t evictions;
    uint64_t writebacks;
    uint64_t writeback_bytes;
};

/* Start the runtime from cfg, or from PAGEWISE_DLM_SERVERS, PAGEWISE_DLM_LOCAL_MEM,
 * PAGEWISE_DLM_PAGE_SIZE, PAGEWISE_DLM_MAX_SET (and _SET_COUNT, _FAULT_MODE, _READAHEAD,
 * _SECRET, _REDUNDANCY) when cfg is NULL. -EBUSY if already started, -EINVAL for a bad configuration or no
 * secret, -EACCES when a server refuses the secret (or cannot prove it), -ECONNREFUSED etc.
 * when a server cannot be reached. */
int dlm_init(const struct dlm_config *cfg);
/* Allocate len bytes of DLM memory into *out: ordinary memory to every thread. */
int dlm_alloc(size_t len, void **out);
/* Free an area from dlm_alloc (its pages on the servers too). -EINVAL if p is not one. */
int dlm_free(void *p);
/* Change the set count from now on: a power of two <= max_set. */
int dlm_set_count(unsigned count);
int dlm_stats(struct dlm_stats *out);
/* Page-size tuning (seed 003). Bracket a compute loop with dlm_start(id) / dlm_end(id): between
 * them the runtime records the base pages the loop faults on; at dlm_end the tuner keeps the
 * unit size if the loop's working set fits in local memory, else shrinks it to the largest
 * size whose touched units fit (at least min_set pages), and goes back to the fastest larger size
 * it measured when a change made the loop slower. Each loop id has its own size and history; loops do not nest.
 * dlm_end returns the loop's unit size from now on, in KiB. PAGEWISE_DLM_AUTO_TUNE=1 tunes over
 * time windows while no loop is measured (programs without start/end). */
int dlm_start(uint64_t loop_id);
int dlm_end(uint64_t loop_id);
/* The decisions so far as JSON {"decisions":[{loop_id, iteration, working_set, local_units,
 * old_size, new_size, loop_time, reason}...], "dropped", "table"} (the seed's per-iteration
 * table as Markdown). Writes at most len bytes including a NUL; returns the full length. */
long dlm_decisions_json(char *buf, size_t len);
/* Make [addr, addr + n) DLM memory, n = len rounded down to whole base pages, replacing what
 * is mapped there (content starts as zeros); returns n or a negative errno. For memory that
 * must keep its address (the LD_PRELOAD shim's --bss, a program's MAP_FIXED mapping). The
 * caller owns the range. */
long dlm_alloc_at(void *addr, size_t len);
/* Calls on part of DLM memory, with the meaning Linux gives them on private anonymous memory
 * (the LD_PRELOAD shim forwards a program's madvise/munmap/mprotect/mremap here):
 * dlm_discard   MADV_DONTNEED / MADV_FREE: [addr, addr+len) reads as zeros from now on; local
 *               pages and the servers' copies are freed (bytes of a base page partly inside
 *               are zeroed in place).
 * dlm_unmap     munmap(2) of part of an area (whole base pages); an area of which nothing is
 *               left is freed.
 * dlm_forget    as dlm_unmap, but the range stays mapped (plain memory, its pages dropped) for
 *               the caller to map over it at once (MAP_FIXED): no other thread's mmap can
 *               take it in between.
 * dlm_detach    the range, rounded out to whole base pages, leaves DLM with its data: plain
 *               private anonymous memory at the same address (e.g. before mprotect(2) makes
 *               it read-only: DLM memory must stay read-write).
 * dlm_prefetch  MADV_WILLNEED: the units are requested now, installed as the program reaches
 *               them (at most a quarter of local_mem at a time).
 * dlm_set_access  MADV_NORMAL (0) / MADV_SEQUENTIAL (1) / MADV_RANDOM (2) for the areas
 *               overlapping the range: read-ahead after a sequential run (the default), from
 *               the first fault, or none.
 * dlm_holds_data  which 4 KiB pages of the range may hold data (vec[i] = 1) and which read as
 *               zeros for sure (0: never written, or discarded), one byte a page as
 *               mincore(2) gives (vec: len / 4096 bytes, rounded up); -EOPNOTSUPP when the
 *               base page is larger.
 * fork(2): DLM memory is not inherited (MADV_DONTFORK): a child would otherwise see zeros
 * where its parent's pages live on a server. In a child every dlm_* call but dlm_init
 * returns -ECHILD and never touches the parent's connections; the child may dlm_init a
 * runtime of its own. */
int dlm_discard(void *addr, size_t len);
int dlm_unmap(void *addr, size_t len);
int dlm_forget(void *addr, size_t len);
int dlm_detach(void *addr, size_t len);
int dlm_prefetch(void *addr, size_t len);
int dlm_set_access(void *addr, size_t len, int access);
int dlm_holds_data(void *addr, size_t len, unsigned char *vec);
/* The process is about to exit: write the decisions to PAGEWISE_DLM_DECISIONS. DLM memory
 * stays valid until the process ends. */
int dlm_finish(void);
/* Free every area and stop the runtime. */
int dlm_shutdown(void);

#ifdef __cplusplus
}
#endif

#endif /* PAGEWISE_DLM_H */
