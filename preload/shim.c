/* The Pagewise LD_PRELOAD shim: routes a program's large memory into a Pagewise arena
 * (arena.h) without changing the program, and keeps every call the program makes on that
 * memory meaningful. `pagewise run` (DLM) and `pagewise hps run` set it up; see docs/dlm-run.md.
 *
 * What is routed (size >= PAGEWISE_PRELOAD_MIN_ALLOC):
 * - anonymous private read-write mmap — without an address, with a hint, MAP_FIXED or
 *   MAP_FIXED_NOREPLACE — and large PROT_NONE reservations once the program commits them
 *   (mprotect read-write, or MAP_FIXED over them): the JVM's heap, an allocator's chunks
 *   (vm.c, which also gives munmap, mremap, mprotect and madvise their meaning there);
 * - the malloc family, when the program's malloc is glibc's (glibc maps large blocks with its
 *   own internal mmap, which no preload sees). A program that brings its own allocator
 *   (jemalloc, tcmalloc, mimalloc) keeps it for every pointer — the shim only forwards —
 *   and its large chunks are routed where the allocator maps them;
 * - with PAGEWISE_PRELOAD_BSS=1 the main executable's zero-initialised data (bss.c).
 * Everything else goes to libc and the kernel.
 *
 * - One owner per pointer: a pointer the shim's malloc routed is the shim's until freed
 *   (pw_blocks); every other pointer belongs to the program's allocator, glibc's or its own.
 * - Re-entrancy: the arena itself allocates and maps (libpagewise is Rust). Its allocations
 *   never come here (its global allocator calls glibc's by their own names,
 *   crates/capi/src/lib.rs) and its memory calls are raw system calls
 *   (crates/kernel/src/mem.rs); a thread-local depth sends whatever else happens while the
 *   shim works (libc's own allocations inside dlopen, getaddrinfo...) to glibc and the kernel.
 * - fork: the child stops routing and never calls into the parent's runtime. Each routed
 *   range becomes the child's private copy before the child runs on — before any other
 *   child handler, the program's allocator's too (fork.c: HPS copies its
 *   inherited memfds, DLM's parent streams its ranges to the child), so the child sees its
 *   parent's memory as fork(2) gives it; its blocks are then plain memory, unmapped when
 *   freed. The child forgets the routed ranges (their addresses are its plain memory).
 * - Exit: the destructor reports and stops new routing; memory stays valid while other
 *   threads run on through exit().
 * - Descriptors: the runtime's (and the shim's copy of stderr) are out of the program's reach:
 *   its close, close_range, closefrom, dup2 and dup3 leave them alone (fds.c).
 * - listen(2) is watched, not changed: a program that listens is a server, and the arena
 *   may treat it as one (HPS gives its promotion the whole pace share at once).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim.h"

extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

__thread int pw_in_shim __attribute__((tls_model("initial-exec")));
_Atomic int pw_state = S_OFF;
size_t pw_min_alloc = 1UL << 20;
const struct pw_arena *pw_arena;
pthread_mutex_t pw_lock = PTHREAD_MUTEX_INITIALIZER;
struct pw_ranges pw_routed, pw_reserved, pw_blocks;
_Atomic size_t pw_tracked;
_Atomic unsigned long pw_routed_count, pw_fallbacks;
_Atomic unsigned long pw_routed_bytes, pw_routed_peak;
static _Atomic size_t nblocks; /* pw_blocks.n, readable without the lock */
static _Atomic int warned_fallback;
static int report; /* this process prints the end-of-run notes (the one `pagewise run` started) */
/* PAGEWISE_PRELOAD_EXITED: a file the reporting process creates as it runs its exit handlers,
 * so that `pagewise run` can tell a program that left without them (a Go program makes the
 * exit_group system call itself) and therefore without a report. A copy: a program may write
 * over its environment's strings (redis-server's process title does), and then
 * `pagewise run` said it had left without its exit handlers. Empty: none. */
static char exited_marker[4096];
static pid_t reporter;
static pid_t owner;
void pw_route_bss(void);

/* Our own copy of stderr: programs may close theirs before our destructor runs (coreutils'
 * close_stdout does). */
static int errfd = 2;

void pw_note(const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n > 0)
        (void)!write(errfd, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

void pw_tables_changed(void) {
    atomic_store(&pw_tracked, pw_routed.n + pw_reserved.n);
    if (pw_routed.bytes > atomic_load(&pw_routed_peak))
        atomic_store(&pw_routed_peak, pw_routed.bytes);
}

void pw_count_routed(size_t len) {
    atomic_fetch_add(&pw_routed_count, 1);
    atomic_fetch_add(&pw_routed_bytes, pw_page_up(len));
}

void *pw_route(size_t len) {
    sigset_t saved;
    pw_runtime_enter(&saved);
    void *p = pw_arena->alloc(len);
    pw_runtime_leave(&saved);
    if (!p) {
        atomic_fetch_add(&pw_fallbacks, 1);
        if (!atomic_exchange(&warned_fallback, 1))
            pw_note("pagewise: the %s arena refused %zu bytes (%s); such allocations stay in libc\n",
                    pw_arena->name, len, strerror(errno));
        return NULL;
    }
    pthread_mutex_lock(&pw_lock);
    int rc = pw_ranges_add(&pw_routed, (uintptr_t)p, (uintptr_t)p + pw_page_up(len), (uintptr_t)p);
    pw_tables_changed();
    pthread_mutex_unlock(&pw_lock);
    if (rc < 0) {
        pw_runtime_enter(&saved);
        pw_arena->free(p);
        pw_runtime_leave(&saved);
        return NULL;
    }
    pw_count_routed(len);
    return p;
}

/* ---- whose malloc: glibc's (the shim routes large blocks) or the program's own ---- */

/* The program's allocator when it is not glibc's (NULL: glibc's). Found before the first
 * allocation the shim serves; allocations made while finding it (by the dynamic linker) come
 * from glibc and are remembered, so that they go back to glibc. */
static struct {
    void *(*malloc)(size_t);
    void (*free)(void *);
    void *(*calloc)(size_t, size_t);
    void *(*realloc)(void *, size_t);
    void *(*memalign)(size_t, size_t);
    size_t (*usable)(void *);
} next;
static size_t (*libc_usable)(void *); /* glibc's malloc_usable_size */
static _Atomic int resolved; /* 0: not yet, 1: resolving (this thread), 2: done */
/* What resolving found, for the fast paths: one load tells a small call where it goes. */
enum { ALLOC_UNKNOWN, ALLOC_GLIBC, ALLOC_FOREIGN };
static _Atomic int allocator;
static void *early[16];
static _Atomic int nearly;

/* Once, before the first allocation the shim serves: kept out of the allocation fast path. */
__attribute__((noinline, cold)) static void resolve_allocator(void) {
    int expected = 0;
    if (!atomic_compare_exchange_strong(&resolved, &expected, 1))
        return;
    pw_in_shim++;
    void *libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
    if (libc)
        libc_usable = (size_t(*)(void *))dlsym(libc, "malloc_usable_size");
    void *m = dlsym(RTLD_NEXT, "malloc");
    if (m && m != (void *)__libc_malloc) {
        next.malloc = m;
        next.free = dlsym(RTLD_NEXT, "free");
        next.calloc = dlsym(RTLD_NEXT, "calloc");
        next.realloc = dlsym(RTLD_NEXT, "realloc");
        next.memalign = dlsym(RTLD_NEXT, "memalign");
        next.usable = dlsym(RTLD_NEXT, "malloc_usable_size");
        if (!next.free || !next.calloc || !next.realloc || !next.memalign)
            next.malloc = NULL; /* an allocator without the basics: stay with glibc's */
    }
    pw_in_shim--;
    atomic_store(&resolved, 2);
    atomic_store(&allocator, next.malloc ? ALLOC_FOREIGN : ALLOC_GLIBC);
}

static inline int foreign(void) {
    if (__builtin_expect(atomic_load_explicit(&resolved, memory_order_acquire) != 2, 0))
        resolve_allocator();
    return next.malloc != NULL;
}

/* While the allocator is being found (or by a re-entrant call), glibc serves. The bounds of
 * those blocks keep the list out of the program's frees: glibc's early blocks lie in its heap,
 * the program's allocator's elsewhere, so a free is one compare away from its allocator. */
static _Atomic uintptr_t early_lo = UINTPTR_MAX, early_hi;

__attribute__((noinline)) static void remember_early(void *p) {
    int i = atomic_fetch_add(&nearly, 1);
    if (i >= (int)(sizeof early / sizeof *early))
        return; /* never: the dynamic linker allocates a few blocks */
    uintptr_t a = (uintptr_t)p, lo = atomic_load(&early_lo), hi = atomic_load(&early_hi);
    while (a < lo && !atomic_compare_exchange_weak(&early_lo, &lo, a))
        ;
    while (a + 1 > hi && !atomic_compare_exchange_weak(&early_hi, &hi, a + 1))
        ;
    early[i] = p;
}

static inline void *early_alloc(void *p) {
    if (__builtin_expect(p && atomic_load_explicit(&resolved, memory_order_acquire) != 2, 0))
        remember_early(p);
    return p;
}

static int in_early_list(void *p) {
    int n = atomic_load(&nearly);
    for (int i = 0; i < n && i < (int)(sizeof early / sizeof *early); i++)
        if (early[i] == p)
            return 1;
    return 0;
}

/* Whether glibc gave p out while the program's allocator was being found. */
static inline int is_early(void *p) {
    uintptr_t a = (uintptr_t)p;
    return a >= atomic_load_explicit(&early_lo, memory_order_relaxed) &&
           a < atomic_load_explicit(&early_hi, memory_order_relaxed) && in_early_list(p);
}

/* ---- the blocks the shim's malloc routed ---- */

/* The size first: almost every call is a small block, decided by one compare. In a forked child
 * nothing is routed; a block its parent would have routed is counted for the report (others.c). */
static inline int routable(size_t len) {
    if (len < pw_min_alloc || pw_in_shim)
        return 0;
    int state = atomic_load_explicit(&pw_state, memory_order_acquire);
    if (state == S_CHILD)
        pw_others_kept_in_child(len);
    return state == S_ON;
}

/* A routed block of n bytes, or NULL (use libc). */
static void *route_block(size_t n) {
    void *p = pw_route(n);
    if (!p)
        return NULL;
    pthread_mutex_lock(&pw_lock);
    int rc = pw_ranges_add(&pw_blocks, (uintptr_t)p, (uintptr_t)p + pw_page_up(n), n);
    atomic_store(&nblocks, pw_blocks.n);
    pthread_mutex_unlock(&pw_lock);
    if (rc < 0) {
        pthread_mutex_lock(&pw_lock);
        pw_ranges_remove(&pw_routed, (uintptr_t)p, (uintptr_t)p + pw_page_up(n));
        pw_tables_changed();
        pthread_mutex_unlock(&pw_lock);
        sigset_t saved;
        pw_runtime_enter(&saved);
        pw_arena->free(p);
        pw_runtime_leave(&saved);
        return NULL;
    }
    return p;
}

/* The routed block starting at p, if any. */
__attribute__((noinline)) static int find_routed_block(const void *p, struct pw_range *out);

static inline int find_block(const void *p, struct pw_range *out) {
    if (!p || atomic_load_explicit(&nblocks, memory_order_relaxed) == 0 || ((uintptr_t)p & (PW_PAGE - 1)))
        return 0;
    return find_routed_block(p, out);
}

static int find_routed_block(const void *p, struct pw_range *out) {
    pthread_mutex_lock(&pw_lock);
    int found = pw_ranges_at(&pw_blocks, (uintptr_t)p, out);
    pthread_mutex_unlock(&pw_lock);
    return found;
}

/* Free a routed block: what of it is still the arena's goes back to the arena, and what the
 * program had taken out of it (detached) is released as plain memory. 1 if p was one. */
__attribute__((noinline)) static int free_routed_block(void *p);

static inline int free_block(void *p) {
    if (!p || atomic_load_explicit(&nblocks, memory_order_relaxed) == 0 || ((uintptr_t)p & (PW_PAGE - 1)))
        return 0;
    return free_routed_block(p);
}

static int free_routed_block(void *p) {
    pthread_mutex_lock(&pw_lock);
    struct pw_range b;
    if (!pw_ranges_at(&pw_blocks, (uintptr_t)p, &b)) {
        pthread_mutex_unlock(&pw_lock);
        return 0;
    }
    pw_ranges_remove(&pw_blocks, b.start, b.end);
    atomic_store(&nblocks, pw_blocks.n);
    if (atomic_load(&pw_state) == S_CHILD) {
        /* The child's own copy (fork.c), plain memory: unmapped. Else not here
         * (MADV_DONTFORK): nothing to give back. */
        if (pw_child_has_copies)
            pw_sys_munmap((void *)b.start, b.end - b.start);
        pthread_mutex_unlock(&pw_lock);
        return 1;
    }
    sigset_t saved;
    pw_runtime_enter(&saved);
    /* Parts detached since (mprotect, or advice only plain memory honours) are plain memory
     * inside the block; the rest is the arena's. */
    uintptr_t at = b.start;
    int live = 0;
    struct pw_range r;
    while (at < b.end) {
        uintptr_t gap_end = pw_ranges_next(&pw_routed, at, b.end, &r) ? r.start : b.end;
        if (gap_end > at)
            pw_arena->release_detached((void *)at, gap_end - at);
        if (gap_end == b.end)
            break;
        live = 1;
        at = r.end;
    }
    if (live) {
        pw_arena->free(p);
        pw_ranges_remove(&pw_routed, b.start, b.end);
        pw_tables_changed();
    }
    pw_runtime_leave(&saved);
    pthread_mutex_unlock(&pw_lock);
    return 1;
}

/* ---- the malloc family ---- */

/* Called by each thread of Pagewise's own runtimes (DLM's fault handler, HPS's tracker) as it
 * starts (`kernel::signal::spawn_blocking_signals`): nothing it allocates or maps is routed. A
 * runtime thread given arena memory would fault on memory that it serves itself, and wait for
 * itself forever. */
PW_EXPORT void pagewise_runtime_thread(void) { pw_in_shim++; }

/* The fast paths below take a small block's call straight to its allocator: one load of
 * `allocator`, a compare of the size (malloc) or of `nblocks` (free), and a tail call; a
 * program spends most of its allocator time in such calls (a loop of small malloc/free pairs:
 * 7.7 ns a pair plain, as much with the shim alone preloaded). Everything else is the slow
 * path. */
__attribute__((noinline)) static void *malloc_slow(size_t n) {
    if (foreign())
        return next.malloc(n);
    if (routable(n)) {
        void *p = route_block(n);
        if (p)
            return p;
    }
    return early_alloc(__libc_malloc(n));
}

PW_EXPORT void *malloc(size_t n) {
    int a = atomic_load_explicit(&allocator, memory_order_acquire);
    if (__builtin_expect(a == ALLOC_GLIBC && n < pw_min_alloc, 1))
        return __libc_malloc(n);
    if (a == ALLOC_FOREIGN)
        return next.malloc(n);
    return malloc_slow(n);
}

__attribute__((noinline)) static void free_slow(void *p) {
    if (!p)
        return;
    if (free_block(p))
        return;
    /* glibc's blocks, and with the program's own allocator, those glibc gave out while it was
     * being found. */
    if (!foreign() || is_early(p))
        __libc_free(p);
    else
        next.free(p);
}

PW_EXPORT void free(void *p) {
    /* No routed block anywhere (always so with the program's own allocator, whose large
     * blocks are routed where it maps them): p is its allocator's. */
    if (__builtin_expect(atomic_load_explicit(&nblocks, memory_order_relaxed) == 0, 1)) {
        int a = atomic_load_explicit(&allocator, memory_order_acquire);
        if (__builtin_expect(a == ALLOC_GLIBC, 1)) {
            __libc_free(p);
            return;
        }
        if (a == ALLOC_FOREIGN && !is_early(p)) {
            next.free(p);
            return;
        }
    }
    free_slow(p);
}

PW_EXPORT void *calloc(size_t n, size_t m) {
    size_t total;
    if (__builtin_mul_overflow(n, m, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    int a = atomic_load_explicit(&allocator, memory_order_acquire);
    if (__builtin_expect(a == ALLOC_GLIBC && total < pw_min_alloc, 1))
        return __libc_calloc(n, m);
    if (foreign())
        return next.calloc(n, m);
    if (routable(total)) {
        void *p = route_block(total); /* arena areas are zero-filled */
        if (p)
            return p;
    }
    return early_alloc(__libc_calloc(n, m));
}

PW_EXPORT size_t malloc_usable_size(void *p) {
    struct pw_range b;
    if (find_block(p, &b))
        return b.end - b.start;
    if (foreign() && !is_early(p))
        return next.usable ? next.usable(p) : 0;
    return libc_usable ? libc_usable(p) : 0;
}

PW_EXPORT void *realloc(void *p, size_t n) {
    if (!p)
        return malloc(n);
    struct pw_range b;
    if (find_block(p, &b)) {
        if (n == 0) {
            free(p);
            return NULL;
        }
        size_t cap = b.end - b.start;
        if (n <= cap && n >= pw_min_alloc && n > cap / 2) {
            pthread_mutex_lock(&pw_lock);
            pw_ranges_retag(&pw_blocks, b.start, n);
            pthread_mutex_unlock(&pw_lock);
            return p;
        }
        void *q = malloc(n);
        if (!q)
            return NULL;
        memcpy(q, p, b.tag < n ? b.tag : n);
        free(p);
        return q;
    }
    if (foreign()) {
        if (is_early(p))
            return __libc_realloc(p, n); /* stays glibc's: the early list keeps naming it */
        return next.realloc(p, n);
    }
    if (routable(n)) {
        size_t old = libc_usable ? libc_usable(p) : 0;
        if (n > old) {
            void *q = route_block(n);
            if (q) {
                memcpy(q, p, old);
                __libc_free(p);
                return q;
            }
        }
    }
    return __libc_realloc(p, n);
}

PW_EXPORT void *reallocarray(void *p, size_t n, size_t m) {
    size_t total;
    if (__builtin_mul_overflow(n, m, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    return realloc(p, total);
}

PW_EXPORT void *memalign(size_t al, size_t n) {
    if (foreign())
        return next.memalign(al, n);
    /* Any alignment the arena's areas happen to have (DLM views of 2 MiB and more, HPS arenas
     * are 2 MiB aligned): 7-Zip asks for its dictionary aligned to 2 MiB. */
    if (al <= (2UL << 20) && routable(n)) {
        void *p = route_block(n);
        if (p && ((uintptr_t)p & (al - 1)) == 0)
            return p;
        if (p)
            free(p); /* not aligned so: libc's */
    }
    return early_alloc(__libc_memalign(al, n));
}

PW_EXPORT int posix_memalign(void **out, size_t al, size_t n) {
    if (al < sizeof(void *) || (al & (al - 1)))
        return EINVAL;
    void *p = memalign(al, n);
    if (!p)
        return ENOMEM;
    *out = p;
    return 0;
}

PW_EXPORT void *aligned_alloc(size_t al, size_t n) { return memalign(al, n); }
PW_EXPORT void *valloc(size_t n) { return memalign(PW_PAGE, n); }
PW_EXPORT void *pvalloc(size_t n) { return memalign(PW_PAGE, pw_page_up(n)); }

/* ---- what the program is ---- */

/* libc's listen, found at start (listen(2) is async-signal-safe, dlsym is not); before that,
 * the system call itself. */
static int (*_Atomic next_listen)(int, int);

/* listen(2): a program that listens for connections is a server, which runs until it is
 * stopped; the arena may spend on it as on a long-running program (HPS: the pace's ramp
 * ends). Said once, by the program `pagewise run` started or a process it exec'd, never by a
 * forked child. */
PW_EXPORT int listen(int fd, int backlog) {
    static _Atomic int told;
    int (*next)(int, int) = atomic_load(&next_listen);
    int rc = next ? next(fd, backlog) : (int)syscall(SYS_listen, fd, backlog);
    if (rc == 0 && pw_arena && pw_arena->serving && atomic_load(&pw_state) == S_ON && !atomic_exchange(&told, 1)) {
        int e = errno;
        sigset_t saved;
        pw_runtime_enter(&saved);
        pw_arena->serving();
        pw_runtime_leave(&saved);
        errno = e;
    }
    return rc;
}

/* ---- start, fork, exit ---- */

/* Set by prepare (pw_lock held) for the fork under way: the child handler acts only on a fork
 * the shim prepared (its registration comes first, before the shim may have started). */
static int forking;

static void prepare(void) {
    pw_fork_prepare();
    forking = 1;
}

static void parent(void) {
    forking = 0;
    pw_fork_parent();
}

static void child(void) {
    if (!forking)
        return;
    forking = 0;
    int on = S_ON, down = S_DOWN;
    if (!atomic_compare_exchange_strong(&pw_state, &on, S_CHILD))
        atomic_compare_exchange_strong(&pw_state, &down, S_CHILD);
    pw_fork_child();
    pw_others_forked();
    /* The routed ranges and reservations are the child's plain memory now, or not here: their
     * addresses are the child's to use. The blocks stay known (free_block). */
    pw_ranges_clear(&pw_routed);
    pw_ranges_clear(&pw_reserved);
    pw_tables_changed();
    pthread_mutex_unlock(&pw_lock);
    pw_fds_close_in_child(errfd);
}

/* pthread_atfork(3) registrations, the program's and its libraries' as well as the shim's
 * (glibc's pthread_atfork calls this). Child handlers run in the order they were registered,
 * and the shim's must run first: an allocator's child handler touches the allocator's state
 * (jemalloc re-initialises each arena's locks), which may lie in routed memory that the shim's
 * handler has yet to make the child's (DLM: not there until streamed, so the child died of
 * SIGSEGV — rustc's fork to run its linker; HPS: still the parent's memory, shared). A library
 * the program links runs its constructor, and registers, before the shim's constructor does;
 * so the shim's child handler is registered ahead of the first registration anyone makes. Its
 * prepare and parent handlers are registered by the constructor, after those libraries': their
 * parent handlers, which release what their prepare handlers locked, run before the shim's,
 * which streams the child's copy. */
typedef int (*register_atfork_fn)(void (*)(void), void (*)(void), void (*)(void), void *);
extern void *__dso_handle;

PW_EXPORT int __register_atfork(void (*on_prepare)(void), void (*on_parent)(void), void (*on_child)(void),
                                void *dso) {
    static _Atomic(register_atfork_fn) next;
    /* 0: the shim's child handler is not registered, 1: being registered, 2: registered. */
    static _Atomic int first;
    register_atfork_fn f = atomic_load(&next);
    if (!f) {
        f = (register_atfork_fn)dlsym(RTLD_NEXT, "__register_atfork");
        if (!f)
            return ENOSYS;
        atomic_store(&next, f);
    }
    int none = 0;
    if (atomic_compare_exchange_strong(&first, &none, 1)) {
        f(NULL, NULL, child, &__dso_handle);
        atomic_store(&first, 2);
    }
    while (atomic_load(&first) != 2)
        sched_yield();
    return f(on_prepare, on_parent, on_child, dso);
}

/* Give environment entry `name` the value `value` in environ itself, not through setenv: a
 * program may bring its own setenv and getenv, and this runs before its main. bash does: its
 * pair keeps its shell variables, and its setenv called this early made the variable table,
 * from which its getenv then answered alone, before main had imported the environment into
 * it. libpagewise, whose getenv is bash's, found none of its settings ("PAGEWISE_DLM_SERVERS
 * is not set"). The entry's string lives as long as the process, as setenv's would. */
static void mark_environ(const char *name, const char *value) {
    static char entry[64];
    size_t n = strlen(name);
    for (char **e = environ; e && *e; e++)
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=') {
            snprintf(entry, sizeof entry, "%s=%s", name, value);
            *e = entry;
            return;
        }
}

void pw_copy_env(char *buf, size_t n, const char *name) {
    const char *v = getenv(name);
    size_t len = v ? strlen(v) : 0;
    if (len >= n)
        len = 0; /* a path cut short would name another file: none */
    memcpy(buf, v ? v : "", len);
    buf[len] = 0;
}

/* Whether this process prints the end-of-run notes: the program `pagewise run` started
 * (PAGEWISE_PRELOAD_REPORT=program), and what it execs in its own place — a wrapper such as
 * pyenv's python3 script, env or nice execs the real program, whose notes are the run's — but
 * not the processes it starts. So the first process replaces the mark with its pid. */
static int reports(void) {
    const char *mark = getenv("PAGEWISE_PRELOAD_REPORT");
    if (!mark)
        return 0;
    char pid[24];
    snprintf(pid, sizeof pid, "%ld", (long)getpid());
    if (strcmp(mark, "program") == 0) {
        mark_environ("PAGEWISE_PRELOAD_REPORT", pid);
        return 1;
    }
    return strcmp(mark, pid) == 0;
}

/* Where the shim's own descriptor goes (as crates/kernel/src/fd.rs out_of_the_way_floor places
 * the runtime's): 128 below the soft RLIMIT_NOFILE counted from at most 1024, or half a limit
 * under 256. A program places its own descriptors by number (bash's `exec 3>file` is dup2
 * onto 3), and a dup2 onto the shim's copy of stderr sent its end-of-run report into the
 * program's file. */
static int out_of_the_way_floor(void) {
    struct rlimit l;
    rlim_t soft = getrlimit(RLIMIT_NOFILE, &l) == 0 ? l.rlim_cur : 1024;
    if (soft > 1024)
        soft = 1024;
    return soft >= 256 ? (int)soft - 128 : (int)soft / 2;
}

__attribute__((constructor)) static void shim_init(void) {
    pw_in_shim++;
    int fd = fcntl(2, F_DUPFD_CLOEXEC, out_of_the_way_floor());
    if (fd >= 0) {
        errfd = fd;
        pw_fds_guard(fd);
    }
    const char *name = getenv("PAGEWISE_PRELOAD_ARENA");
    const char *libpath = getenv("PAGEWISE_PRELOAD_LIB");
    const char *min = getenv("PAGEWISE_PRELOAD_MIN_ALLOC");
    const char *bss = getenv("PAGEWISE_PRELOAD_BSS");
    report = reports();
    if (report) {
        pw_copy_env(exited_marker, sizeof exited_marker, "PAGEWISE_PRELOAD_EXITED");
        reporter = getpid();
    }
    atomic_store(&next_listen, (int (*)(int, int))dlsym(RTLD_NEXT, "listen"));
    pw_in_shim--;
    foreign(); /* found now, before the program's first allocation if it has not made one */
    pw_in_shim++;
    if (min)
        pw_min_alloc = strtoull(min, NULL, 10);
    if (pw_min_alloc < PW_PAGE)
        pw_min_alloc = PW_PAGE;
    if (name && strcmp(name, "dlm") == 0)
        pw_arena = &pw_arena_dlm;
    else if (name && strcmp(name, "hps") == 0)
        pw_arena = &pw_arena_hps;
    else {
        pw_note("pagewise: PAGEWISE_PRELOAD_ARENA=%s is not an arena this shim knows (dlm, hps); nothing is "
                "routed\n", name ? name : "(unset)");
        pw_in_shim--;
        return;
    }
    void *lib = libpath ? dlopen(libpath, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!lib) {
        pw_note("pagewise: cannot load libpagewise (PAGEWISE_PRELOAD_LIB=%s): %s; nothing is routed\n",
                libpath ? libpath : "(unset)", dlerror());
        pw_in_shim--;
        return;
    }
    int rc = pw_arena->init(lib);
    if (rc < 0) {
        pw_note("pagewise: starting the %s arena failed (%s); nothing is routed\n", pw_arena->name, strerror(-rc));
        pw_in_shim--;
        return;
    }
    owner = getpid();
    pw_fork_configure(getenv("PAGEWISE_PRELOAD_FORK"));
    pw_others_configure();
    __register_atfork(prepare, parent, NULL, &__dso_handle);
    atomic_store(&pw_state, S_ON);
    pw_in_shim--;
    if (bss && strcmp(bss, "1") == 0)
        pw_route_bss();
}

__attribute__((destructor)) static void shim_fini(void) {
    if (exited_marker[0] && getpid() == reporter) {
        int fd = open(exited_marker, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
        if (fd >= 0)
            close(fd);
    }
    if (atomic_load(&pw_state) == S_CHILD) {
        pw_others_leave_child_counts();
        return;
    }
    int on = S_ON;
    if (getpid() != owner || !atomic_compare_exchange_strong(&pw_state, &on, S_DOWN))
        return;
    if (!report) {
        pw_others_leave_counts();
        return;
    }
    /* The program routed nothing itself, the processes it started did: the wrapper says what. */
    if (atomic_load(&pw_routed_count) == 0 && pw_others_left_counts())
        return;
    if (atomic_load(&pw_routed_count) == 0)
        pw_note("pagewise: warning: the program made no allocation of at least %zu bytes: nothing ran on %s "
                "memory (see --min-alloc)\n", pw_min_alloc, pw_arena->name);
    else
        pw_note("pagewise: %lu allocation(s) on %s memory (%lu MiB over the run, at most %lu MiB at once), %lu "
                "refused (left in libc)\n", atomic_load(&pw_routed_count), pw_arena->name,
                atomic_load(&pw_routed_bytes) >> 20, atomic_load(&pw_routed_peak) >> 20, atomic_load(&pw_fallbacks));
    pw_in_shim++;
    char line[896];
    if (pw_arena->summary && pw_arena->summary(line, sizeof line) == 0)
        pw_note("pagewise: %s\n", line);
    /* What the run reports (the tuner's decisions) is the started program's: a process it
     * execs, ending later, would put its own in their place (hpcc's MPI helper did). */
    pw_arena->finish();
    pw_in_shim--;
}
