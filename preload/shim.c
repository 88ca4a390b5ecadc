/* The Pagewise LD_PRELOAD shim: routes a program's large allocations into a Pagewise arena
 * (arena.h) without changing the program. `pagewise run` (DLM) and `pagewise hps run` set it
 * up; see README "pagewise run".
 *
 * Routed (size >= PAGEWISE_PRELOAD_MIN_ALLOC): malloc, calloc, realloc, posix_memalign,
 * aligned_alloc, memalign, valloc, pvalloc, and anonymous private read-write mmap without an
 * address hint (munmap and mremap follow them); with PAGEWISE_PRELOAD_BSS=1 also the main
 * executable's zero-initialised data. Everything else goes to libc.
 *
 * - Re-entrancy: the arena itself allocates (libpagewise is Rust); a thread-local depth sends
 *   every allocation made while the shim is working to libc, so the shim never recurses into
 *   itself. Before the arena is up (and if it fails to start) everything goes to libc.
 * - Threads: routed blocks sit in one table under a mutex, touched only on routed paths and
 *   on frees of page-aligned pointers (libc's small chunks are never page-aligned... except
 *   memalign's, which the table lookup then rejects).
 * - fork: areas are not inherited (the arena maps them MADV_DONTFORK): a child would
 *   otherwise see zeros where its parent's pages live on a server. The child stops routing
 *   and never calls into the parent's runtime (its sockets belong to the parent); exec gives
 *   it a fresh shim with its own runtime.
 *
 * libc's own entry points are reached through glibc's exported __libc_* names and raw
 * syscalls, never dlsym(RTLD_NEXT) on the hot path (dlsym may allocate).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <malloc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "arena.h"

extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

#define PAGE 4096UL
#define MAX_BLOCKS 65536

static __thread int in_shim __attribute__((tls_model("initial-exec")));

enum { S_OFF, S_ON, S_CHILD, S_DOWN };
static _Atomic int state = S_OFF;
static size_t min_alloc = 1UL << 20;
static const struct pw_arena *arena;
static pid_t owner;
static int report; /* this process prints the end-of-run notes (the one `pagewise run` started) */
static _Atomic unsigned long routed, fallbacks;
static _Atomic int warned_fallback;

struct block {
    uintptr_t addr;
    size_t len; /* bytes asked for */
    size_t cap; /* bytes usable (whole pages) */
};
static struct block blocks[MAX_BLOCKS];
static size_t nblocks;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static size_t page_up(size_t n) { return (n + PAGE - 1) & ~(PAGE - 1); }

/* Our own copy of stderr: programs may close theirs before our destructor runs (coreutils'
 * close_stdout does). */
static int errfd = 2;

static void note(const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n > 0)
        (void)!write(errfd, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

static int routable(size_t len) {
    return !in_shim && len >= min_alloc && atomic_load_explicit(&state, memory_order_acquire) == S_ON;
}

/* A routed area of len bytes, recorded in the table; NULL: use libc instead. */
static void *route(size_t len) {
    in_shim++;
    void *p = arena->alloc(len);
    in_shim--;
    if (!p) {
        atomic_fetch_add(&fallbacks, 1);
        if (!atomic_exchange(&warned_fallback, 1))
            note("pagewise: the %s arena refused %zu bytes (%s); such allocations stay in libc\n", arena->name, len,
                 strerror(errno));
        return NULL;
    }
    pthread_mutex_lock(&lock);
    int full = nblocks == MAX_BLOCKS;
    if (!full)
        blocks[nblocks++] = (struct block){(uintptr_t)p, len, page_up(len)};
    pthread_mutex_unlock(&lock);
    if (full) {
        in_shim++;
        arena->free(p);
        in_shim--;
        return NULL;
    }
    atomic_fetch_add(&routed, 1);
    return p;
}

/* Look up the block starting at p (inside: any block containing p); remove it if asked. */
static int lookup(const void *p, int inside, int remove, struct block *out) {
    uintptr_t a = (uintptr_t)p;
    if (!p || (a & (PAGE - 1)))
        return 0;
    int found = 0;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nblocks; i++) {
        struct block *b = &blocks[i];
        if (a == b->addr || (inside && a > b->addr && a < b->addr + b->cap)) {
            if (out)
                *out = *b;
            if (remove)
                *b = blocks[--nblocks];
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return found;
}

static void set_len(const void *p, size_t len) {
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nblocks; i++)
        if (blocks[i].addr == (uintptr_t)p)
            blocks[i].len = len;
    pthread_mutex_unlock(&lock);
}

/* Give a removed block back (only the process that owns the runtime may). */
static void unroute(void *p) {
    if (atomic_load(&state) != S_ON)
        return; /* a forked child or after exit: the parent's runtime is not ours to call */
    in_shim++;
    arena->free(p);
    in_shim--;
}

void *malloc(size_t n) {
    if (routable(n)) {
        void *p = route(n);
        if (p)
            return p;
    }
    return __libc_malloc(n);
}

void free(void *p) {
    if (lookup(p, 0, 1, NULL)) {
        unroute(p);
        return;
    }
    __libc_free(p);
}

void *calloc(size_t n, size_t m) {
    size_t total;
    if (__builtin_mul_overflow(n, m, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    if (routable(total)) {
        void *p = route(total); /* arena areas are zero-filled */
        if (p)
            return p;
    }
    return __libc_calloc(n, m);
}

static size_t (*libc_usable)(void *);

size_t malloc_usable_size(void *p) {
    struct block b;
    if (lookup(p, 0, 0, &b))
        return b.cap;
    if (!libc_usable) {
        in_shim++;
        libc_usable = (size_t(*)(void *))dlsym(RTLD_NEXT, "malloc_usable_size");
        in_shim--;
    }
    return libc_usable ? libc_usable(p) : 0;
}

void *realloc(void *p, size_t n) {
    if (!p)
        return malloc(n);
    struct block b;
    if (lookup(p, 0, 0, &b)) {
        if (n == 0) {
            free(p);
            return NULL;
        }
        if (n <= b.cap && n >= min_alloc) {
            set_len(p, n);
            return p;
        }
        void *q = malloc(n);
        if (!q)
            return NULL;
        memcpy(q, p, b.len < n ? b.len : n);
        free(p);
        return q;
    }
    if (routable(n)) {
        size_t old = malloc_usable_size(p);
        if (n > old) {
            void *q = route(n);
            if (q) {
                memcpy(q, p, old);
                __libc_free(p);
                return q;
            }
        }
    }
    return __libc_realloc(p, n);
}

void *memalign(size_t al, size_t n) {
    if (al <= PAGE && routable(n)) {
        void *p = route(n);
        if (p)
            return p;
    }
    return __libc_memalign(al, n);
}

int posix_memalign(void **out, size_t al, size_t n) {
    if (al < sizeof(void *) || (al & (al - 1)))
        return EINVAL;
    void *p = memalign(al, n);
    if (!p)
        return ENOMEM;
    *out = p;
    return 0;
}

void *aligned_alloc(size_t al, size_t n) { return memalign(al, n); }
void *valloc(size_t n) { return memalign(PAGE, n); }
void *pvalloc(size_t n) { return memalign(PAGE, page_up(n)); }

static void *sys_mmap(void *a, size_t len, int prot, int flags, int fd, off_t off) {
    return (void *)syscall(SYS_mmap, a, len, prot, flags, fd, off);
}

void *mmap(void *a, size_t len, int prot, int flags, int fd, off_t off) {
    const int plain = MAP_PRIVATE | MAP_ANONYMOUS;
    const int ok_extra = MAP_NORESERVE | MAP_POPULATE;
    if (!a && fd == -1 && prot == (PROT_READ | PROT_WRITE) && (flags & ~ok_extra) == plain && routable(len)) {
        void *p = route(len);
        if (p)
            return p;
    }
    return sys_mmap(a, len, prot, flags, fd, off);
}

void *mmap64(void *a, size_t len, int prot, int flags, int fd, off_t off) { return mmap(a, len, prot, flags, fd, off); }

int munmap(void *a, size_t len) {
    struct block b;
    if (lookup(a, 1, 0, &b)) {
        if ((uintptr_t)a == b.addr && page_up(len) >= b.cap) {
            lookup(a, 0, 1, NULL);
            unroute(a);
        }
        /* Part of a routed area: it stays mapped until the whole area goes (the arena hands
         * out whole areas only); the program must not rely on the part faulting. */
        return 0;
    }
    return (int)syscall(SYS_munmap, a, len);
}

void *mremap(void *old, size_t oldlen, size_t newlen, int flags, ...) {
    void *target = NULL;
    if (flags & MREMAP_FIXED) {
        va_list ap;
        va_start(ap, flags);
        target = va_arg(ap, void *);
        va_end(ap);
    }
    struct block b;
    if (lookup(old, 0, 0, &b)) {
        if (newlen <= b.cap) {
            set_len(old, newlen);
            return old;
        }
        if (!(flags & MREMAP_MAYMOVE) || (flags & MREMAP_FIXED)) {
            errno = ENOMEM;
            return MAP_FAILED;
        }
        void *q = mmap(NULL, newlen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (q == MAP_FAILED)
            return MAP_FAILED;
        memcpy(q, old, b.len < oldlen ? b.len : oldlen);
        munmap(old, b.cap);
        return q;
    }
    return (void *)syscall(SYS_mremap, old, oldlen, newlen, flags, target);
}

/* --bss: the main executable's zero-initialised data, whole pages of it, into the arena. */
struct bss {
    uintptr_t start, end;
};

static int find_bss(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    struct bss *out = data;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_W) && ph->p_memsz > ph->p_filesz) {
            uintptr_t zero = info->dlpi_addr + ph->p_vaddr + ph->p_filesz;
            out->start = page_up(zero);
            out->end = page_up(info->dlpi_addr + ph->p_vaddr + ph->p_memsz);
        }
    }
    return 1; /* the first object is the main program */
}

static void route_bss(void) {
    struct bss z = {0, 0};
    dl_iterate_phdr(find_bss, &z);
    if (z.end <= z.start || z.end - z.start < min_alloc) {
        note("pagewise: --bss: the program's zero-initialised data (%zu bytes in whole pages) is below "
             "--min-alloc; left in place\n", (size_t)(z.end > z.start ? z.end - z.start : 0));
        return;
    }
    if (!arena->alloc_at) {
        note("pagewise: --bss: the %s arena cannot map at a fixed address\n", arena->name);
        return;
    }
    size_t len = z.end - z.start, pages = len / PAGE;
    /* Whatever was written there already (copy relocations, constructors) is kept: resident
     * pages that are not all zero are saved and written back after the area replaces them. */
    unsigned char *res = __libc_malloc(pages);
    unsigned char *saved = NULL;
    size_t nsaved = 0;
    size_t *which = NULL;
    if (res && mincore((void *)z.start, len, res) == 0) {
        for (size_t i = 0; i < pages; i++) {
            if (!(res[i] & 1))
                continue;
            const unsigned long *w = (const unsigned long *)(z.start + i * PAGE);
            int zero = 1;
            for (size_t k = 0; k < PAGE / sizeof *w && zero; k++)
                zero = w[k] == 0;
            if (zero)
                continue;
            saved = __libc_realloc(saved, (nsaved + 1) * PAGE);
            which = __libc_realloc(which, (nsaved + 1) * sizeof *which);
            memcpy(saved + nsaved * PAGE, w, PAGE);
            which[nsaved++] = i;
        }
    }
    in_shim++;
    void *p = arena->alloc_at((void *)z.start, len);
    in_shim--;
    if (!p)
        note("pagewise: --bss: the %s arena could not take %zu bytes at %p (%s); left in place\n", arena->name, len,
             (void *)z.start, strerror(errno));
    else {
        atomic_fetch_add(&routed, 1);
        note("pagewise: --bss: %zu bytes of static data at %p on %s memory\n", len, (void *)z.start, arena->name);
    }
    if (p)
        for (size_t i = 0; i < nsaved; i++)
            memcpy((void *)(z.start + which[i] * PAGE), saved + i * PAGE, PAGE);
    __libc_free(res);
    __libc_free(saved);
    __libc_free(which);
}

static void prepare(void) { pthread_mutex_lock(&lock); }
static void parent(void) { pthread_mutex_unlock(&lock); }
static void child(void) {
    pthread_mutex_unlock(&lock);
    int on = S_ON;
    atomic_compare_exchange_strong(&state, &on, S_CHILD);
}

__attribute__((constructor)) static void shim_init(void) {
    in_shim++;
    int fd = fcntl(2, F_DUPFD_CLOEXEC, 3);
    if (fd >= 0)
        errfd = fd;
    const char *name = getenv("PAGEWISE_PRELOAD_ARENA");
    const char *libpath = getenv("PAGEWISE_PRELOAD_LIB");
    const char *min = getenv("PAGEWISE_PRELOAD_MIN_ALLOC");
    const char *bss = getenv("PAGEWISE_PRELOAD_BSS");
    report = getenv("PAGEWISE_PRELOAD_REPORT") != NULL;
    /* Only the program `pagewise run` started reports; processes it execs do not. */
    unsetenv("PAGEWISE_PRELOAD_REPORT");
    if (min)
        min_alloc = strtoull(min, NULL, 10);
    if (min_alloc < PAGE)
        min_alloc = PAGE;
    if (name && strcmp(name, "dlm") == 0)
        arena = &pw_arena_dlm;
    else if (name && strcmp(name, "hps") == 0)
        arena = &pw_arena_hps;
    else {
        note("pagewise: PAGEWISE_PRELOAD_ARENA=%s is not an arena this shim knows (dlm, hps); nothing is "
             "routed\n", name ? name : "(unset)");
        in_shim--;
        return;
    }
    void *lib = libpath ? dlopen(libpath, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!lib) {
        note("pagewise: cannot load libpagewise (PAGEWISE_PRELOAD_LIB=%s): %s; nothing is routed\n",
             libpath ? libpath : "(unset)", dlerror());
        in_shim--;
        return;
    }
    int rc = arena->init(lib);
    if (rc < 0) {
        note("pagewise: starting the %s arena failed (%s); nothing is routed\n", arena->name, strerror(-rc));
        in_shim--;
        return;
    }
    owner = getpid();
    pthread_atfork(prepare, parent, child);
    atomic_store(&state, S_ON);
    in_shim--;
    if (bss && strcmp(bss, "1") == 0)
        route_bss();
}

__attribute__((destructor)) static void shim_fini(void) {
    if (atomic_load(&state) != S_ON || getpid() != owner)
        return;
    if (report && atomic_load(&routed) == 0)
        note("pagewise: warning: the program made no allocation of at least %zu bytes: nothing ran on %s "
             "memory (see --min-alloc)\n", min_alloc, arena->name);
    else if (report)
        note("pagewise: %lu allocation(s) on %s memory, %lu refused (left in libc)\n", atomic_load(&routed),
             arena->name, atomic_load(&fallbacks));
    in_shim++;
    char line[256];
    if (report && arena->summary && arena->summary(line, sizeof line) == 0)
        note("pagewise: %s\n", line);
    arena->shutdown();
    in_shim--;
}
