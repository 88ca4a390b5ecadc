/* What the parts of the preload shim share: its state, its tables and its way to the kernel.
 * shim.c: start, exit, fork and the malloc family; vm.c: the memory system calls. */
#ifndef PAGEWISE_PRELOAD_SHIM_H
#define PAGEWISE_PRELOAD_SHIM_H

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "arena.h"
#include "ranges.h"

#define PW_PAGE 4096UL

/* What the shim defines for the program: every other symbol of it is hidden. */
#define PW_EXPORT __attribute__((visibility("default")))

/* S_OFF: not started (or failed): nothing is routed. S_ON: routing. S_CHILD: a child made by
 * fork(2): the areas are its own plain copies (HPS) or not here (DLM: MADV_DONTFORK), nothing
 * is routed and the parent's arena is never called. S_DOWN: the program is exiting (the destructor ran while other threads may
 * still run): nothing new is routed, what is routed stays valid and keeps its meaning. */
enum { S_OFF, S_ON, S_CHILD, S_DOWN };

extern _Atomic int pw_state;
extern size_t pw_min_alloc;
extern const struct pw_arena *pw_arena;

/* A thread-local depth: while the shim (or the arena it calls) is working, every allocation
 * and memory call of this thread goes straight to libc and the kernel. */
extern __thread int pw_in_shim __attribute__((tls_model("initial-exec")));

/* A call into the arena from a thread of the program: it counts as inside the shim, and its
 * asynchronous signals wait until the call returns. The runtime may hold a lock across the
 * call, and a signal delivered meanwhile whose frame or handler touches routed memory faults
 * to a runtime that waits on that lock: a Go program under `pagewise run` hung so (Go keeps
 * each thread's signal stack on its heap, which is routed, and preempts threads with SIGURG).
 * The synchronous signals stay open: a fault the call itself takes must reach its handler. */
static inline void pw_runtime_enter(sigset_t *saved) {
    sigset_t wait;
    sigfillset(&wait);
    sigdelset(&wait, SIGSEGV);
    sigdelset(&wait, SIGBUS);
    sigdelset(&wait, SIGILL);
    sigdelset(&wait, SIGFPE);
    sigdelset(&wait, SIGTRAP);
    sigdelset(&wait, SIGSYS);
    pthread_sigmask(SIG_BLOCK, &wait, saved);
    pw_in_shim++;
}

static inline void pw_runtime_leave(const sigset_t *saved) {
    pw_in_shim--;
    pthread_sigmask(SIG_SETMASK, saved, NULL);
}

/* The tables, under pw_lock. `pw_routed`: the live routed parts of the address space (tag:
 * the area's start). `pw_reserved`: the program's large PROT_NONE reservations not yet
 * committed. `pw_blocks`: blocks the shim's malloc routed (start, start + whole pages; tag:
 * bytes asked for) — the shim owns these pointers for their whole life. */
extern pthread_mutex_t pw_lock;
extern struct pw_ranges pw_routed, pw_reserved, pw_blocks;
/* pw_routed.n + pw_reserved.n, readable without the lock: 0 lets calls on memory that is
 * not the arena's skip the lock altogether. */
extern _Atomic size_t pw_tracked;
void pw_tables_changed(void);
/* fork(2) (fork.c): the handlers' halves that copy the routed ranges into a child, and whether
 * this child holds such copies (its blocks are then plain memory, unmapped when freed). */
void pw_fork_prepare(void);
/* PAGEWISE_PRELOAD_FORK: `copy` (NULL too) or `none`. */
void pw_fork_configure(const char *mode);
void pw_fork_parent(void);
void pw_fork_child(void);
extern int pw_child_has_copies;

extern _Atomic unsigned long pw_routed_count, pw_fallbacks;
/* Bytes routed over the run, and the most routed at once. */
extern _Atomic unsigned long pw_routed_bytes, pw_routed_peak;
/* Count a new routed area of len bytes (what the end-of-run report says). */
void pw_count_routed(size_t len);

static inline size_t pw_page_up(size_t n) { return (n + PW_PAGE - 1) & ~(PW_PAGE - 1); }

/* Descriptors (fds.c): keep `fd`, one of the runtime's or the shim's own, from the program's
 * close, close_range, closefrom, dup2 and dup3; and, in a child made by fork(2), close the
 * runtime's copies but `keep`. */
void pw_fds_guard(int fd);
void pw_fds_close_in_child(int keep);
/* Copy environment variable `name` into buf (n bytes): empty when unset or too long. The
 * environment's own strings may be overwritten by the program (a process title). */
void pw_copy_env(char *buf, size_t n, const char *name);
/* others.c: what the processes the program started routed, and what its forked children kept
 * in local memory, for the wrapper's report. */
void pw_others_configure(void);
void pw_others_leave_counts(void);
int pw_others_left_counts(void);
/* In a forked child: forget the parent's counts (fork); one allocation of len bytes, at least
 * pw_min_alloc, left in local memory; at exit, leave the counts. */
void pw_others_forked(void);
void pw_others_kept_in_child(size_t len);
void pw_others_leave_child_counts(void);

/* Write a note on the shim's own copy of stderr. */
void pw_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A new routed area of at least len bytes, recorded in pw_routed (the lock is taken); NULL:
 * leave the allocation to libc or the kernel. */
void *pw_route(size_t len);

/* The kernel's system calls, never libc's wrappers (which are the shim's). */
void *pw_sys_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);
int pw_sys_munmap(void *addr, size_t len);
void *pw_sys_mremap(void *old, size_t oldlen, size_t newlen, int flags, void *target);
int pw_sys_mprotect(void *addr, size_t len, int prot);
int pw_sys_madvise(void *addr, size_t len, int advice);

#endif
