/* The memory system calls of a program under the preload shim: which anonymous mappings are
 * routed into the arena, and what munmap, mremap, mprotect and madvise do to routed memory —
 * each what Linux does to private anonymous memory, so the program (and an allocator that
 * maps, purges, guards and remaps its chunks) cannot tell the difference:
 *
 * mmap      anonymous, private, read-write, at least --min-alloc bytes: routed, wherever
 *           placed (no address, a hint, MAP_FIXED, MAP_FIXED_NOREPLACE). A MAP_FIXED mapping
 *           of any kind over routed memory takes that memory out of the arena first. Large
 *           PROT_NONE private anonymous mappings are remembered as reservations.
 * munmap    routed parts are unmapped in the arena (server memory released), the rest by the
 *           kernel.
 * mremap    of routed memory: shrinking unmaps the tail; moving or growing copies into a new
 *           mapping (routed as any other) and unmaps the old one; MREMAP_DONTUNMAP leaves the
 *           old range mapped and empty. Growing in place without MREMAP_MAYMOVE: ENOMEM, as
 *           when the kernel finds the next pages taken. The old range must lie in one area
 *           (one mapping, as the kernel asks of one VMA): else EFAULT.
 * mprotect  read-write on routed memory: nothing to do. Anything else: the range leaves the
 *           arena with its data (detach) and the kernel protects it. Read-write over a
 *           reservation commits it: routed when large enough (the JVM's heap, V8's and
 *           Go's arenas reserve, then commit).
 * madvise   DONTNEED / FREE / DONTNEED_LOCKED: zeros from now on, memory released (arena
 *           discard). REMOVE: EINVAL, as for any private mapping. WILLNEED and POPULATE_*:
 *           prefetch. The rest goes to the arena, which honours it, finds it without effect,
 *           or asks for the range to be detached (HPS: the program's own MADV_HUGEPAGE).
 *           Nothing reaches the kernel on routed memory: advice splits the area's mapping,
 *           and the arena's page moves and copies must not straddle two mappings.
 * mlock     routed memory cannot be locked in: a no-op there.
 *
 * The routed table names every live routed range and its area; a call that touches none
 * (and no reservation) goes to the kernel at the cost of one atomic load.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif
#ifndef MADV_DONTNEED_LOCKED
#define MADV_DONTNEED_LOCKED 24
#endif
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#define MADV_POPULATE_WRITE 23
#endif

void *pw_sys_mmap(void *a, size_t len, int prot, int flags, int fd, off_t off) {
    return (void *)syscall(SYS_mmap, a, len, prot, flags, fd, off);
}
int pw_sys_munmap(void *a, size_t len) { return (int)syscall(SYS_munmap, a, len); }
void *pw_sys_mremap(void *old, size_t oldlen, size_t newlen, int flags, void *target) {
    return (void *)syscall(SYS_mremap, old, oldlen, newlen, flags, target);
}
int pw_sys_mprotect(void *a, size_t len, int prot) { return (int)syscall(SYS_mprotect, a, len, prot); }
int pw_sys_madvise(void *a, size_t len, int advice) { return (int)syscall(SYS_madvise, a, len, advice); }

/* Whether calls on memory must be looked at (routing started, something tracked). */
static int watching(void) { return !pw_in_shim && atomic_load_explicit(&pw_tracked, memory_order_acquire) != 0; }

static int aligned(const void *a) { return ((uintptr_t)a & (PW_PAGE - 1)) == 0; }

/* errno from a negative errno; -1. */
static int fail(int neg) {
    errno = -neg;
    return -1;
}

/* Take [lo, hi) out of the arena: its routed parts are unmapped there (`replace`: left mapped
 * for a MAP_FIXED mapping to replace at once, so no other thread's mmap can land in between),
 * and it stops being a reservation. Under the lock. */
static int unroute_locked(uintptr_t lo, uintptr_t hi, int replace) {
    struct pw_range r;
    int rc = 0;
    for (uintptr_t at = lo; pw_ranges_next(&pw_routed, at, hi, &r); at = r.end) {
        sigset_t saved;
        pw_runtime_enter(&saved);
        int e = pw_arena->unmap((void *)r.start, r.end - r.start, replace);
        pw_runtime_leave(&saved);
        if (e < 0 && rc == 0)
            rc = e;
        pw_ranges_remove(&pw_routed, r.start, r.end);
    }
    /* All of [lo, hi): a reservation left before a routed part would later claim whatever is
     * mapped there, routed areas included (mprotect then protects DLM's pages behind its back). */
    pw_ranges_remove(&pw_reserved, lo, hi);
    pw_tables_changed();
    return rc;
}

/* Route [addr, addr+len), where the program placed a mapping, as a new area (the lock is not
 * held). 1 if routed. */
static int route_at(uintptr_t addr, size_t len) {
    if (!pw_arena->alloc_at || atomic_load(&pw_state) != S_ON)
        return 0;
    sigset_t saved;
    pw_runtime_enter(&saved);
    void *p = pw_arena->alloc_at((void *)addr, len);
    pw_runtime_leave(&saved);
    if (!p)
        return 0;
    pthread_mutex_lock(&pw_lock);
    /* The area replaced whatever was there: it is no reservation any more (a range is routed or
     * reserved, never both). */
    int rc = pw_ranges_remove(&pw_reserved, addr, addr + len);
    if (rc == 0)
        rc = pw_ranges_add(&pw_routed, addr, addr + len, addr);
    pw_tables_changed();
    pthread_mutex_unlock(&pw_lock);
    if (rc < 0) {
        pw_runtime_enter(&saved);
        pw_arena->unmap(p, len, 1);
        pw_runtime_leave(&saved);
        return 0; /* the kernel mapping below replaces it */
    }
    pw_count_routed(len);
    return 1;
}

/* Remember [start, end) as reserved, joined with reservations right before and after it, as
 * the kernel joins adjacent PROT_NONE anonymous mappings into one (the lock is held). Out of
 * memory, it is forgotten: committing it then maps plain memory. */
static void reserve_locked(uintptr_t start, uintptr_t end) {
    struct pw_range n;
    if (start > 0 && pw_ranges_containing(&pw_reserved, start - 1, &n) && n.end == start) {
        pw_ranges_remove(&pw_reserved, n.start, n.end);
        start = n.start;
    }
    if (pw_ranges_at(&pw_reserved, end, &n)) {
        pw_ranges_remove(&pw_reserved, n.start, n.end);
        end = n.end;
    }
    pw_ranges_add(&pw_reserved, start, end, 0);
}

static void reserve(uintptr_t addr, size_t len) {
    pthread_mutex_lock(&pw_lock);
    if (pw_ranges_add(&pw_reserved, addr, addr + len, 0) == 0)
        pw_tables_changed();
    pthread_mutex_unlock(&pw_lock);
}

/* Private anonymous memory, placed or not (what the shim may route). */
static inline int anon_private(int flags) {
    const int placement = MAP_FIXED | MAP_FIXED_NOREPLACE;
    const int harmless = MAP_NORESERVE | MAP_POPULATE | MAP_STACK;
    return (flags & MAP_ANONYMOUS) && (flags & MAP_TYPE) == MAP_PRIVATE &&
           !(flags & ~(MAP_PRIVATE | MAP_ANONYMOUS | placement | harmless));
}

PW_EXPORT void *mmap(void *a, size_t len, int prot, int flags, int fd, off_t off) {
    int state = atomic_load_explicit(&pw_state, memory_order_acquire);
    if (pw_in_shim || len == 0 || (state != S_ON && state != S_DOWN)) {
        /* A forked child routes nothing: counted where its parent would have routed. */
        if (state == S_CHILD && !pw_in_shim && len >= pw_min_alloc && anon_private(flags) &&
            prot == (PROT_READ | PROT_WRITE))
            pw_others_kept_in_child(len);
        return pw_sys_mmap(a, len, prot, flags, fd, off);
    }
    size_t plen = pw_page_up(len);
    int big = len >= pw_min_alloc && state == S_ON;
    int routable = anon_private(flags) && prot == (PROT_READ | PROT_WRITE) && big;
    int reservation = anon_private(flags) && prot == PROT_NONE && big;
    if ((flags & MAP_FIXED) && aligned(a)) {
        /* Whatever is there stops being the arena's, then the new mapping replaces it. */
        if (atomic_load(&pw_tracked)) {
            pthread_mutex_lock(&pw_lock);
            unroute_locked((uintptr_t)a, (uintptr_t)a + plen, 1);
            pthread_mutex_unlock(&pw_lock);
        }
        if (routable && route_at((uintptr_t)a, plen))
            return a;
        void *r = pw_sys_mmap(a, len, prot, flags, fd, off);
        if (r != MAP_FAILED && reservation)
            reserve((uintptr_t)r, plen);
        return r;
    }
    if ((flags & MAP_FIXED_NOREPLACE) && atomic_load(&pw_tracked)) {
        struct pw_range r;
        pthread_mutex_lock(&pw_lock);
        int taken = pw_ranges_next(&pw_routed, (uintptr_t)a, (uintptr_t)a + plen, &r);
        pthread_mutex_unlock(&pw_lock);
        if (taken) {
            errno = EEXIST;
            return MAP_FAILED;
        }
    }
    if (routable && !a) {
        void *p = pw_route(len);
        if (p)
            return p;
    }
    /* A hint, MAP_FIXED_NOREPLACE, or routing refused: the kernel places it; a routable
     * mapping is then made an area where it landed. */
    void *r = pw_sys_mmap(a, len, prot, flags, fd, off);
    if (r == MAP_FAILED)
        return r;
    if (routable && route_at((uintptr_t)r, plen))
        return r;
    if (reservation)
        reserve((uintptr_t)r, plen);
    return r;
}

PW_EXPORT void *mmap64(void *a, size_t len, int prot, int flags, int fd, off_t off) {
    return mmap(a, len, prot, flags, fd, off);
}

PW_EXPORT int munmap(void *a, size_t len) {
    if (!watching() || !aligned(a) || len == 0)
        return pw_sys_munmap(a, len);
    pthread_mutex_lock(&pw_lock);
    int rc = unroute_locked((uintptr_t)a, (uintptr_t)a + pw_page_up(len), 0);
    pthread_mutex_unlock(&pw_lock);
    if (rc < 0)
        pw_note("pagewise: unmapping %p+%zu in the %s arena failed (%s)\n", a, len, pw_arena->name, strerror(-rc));
    /* The parts that were not routed; the routed ones are unmapped already (a no-op). */
    return pw_sys_munmap(a, len);
}

PW_EXPORT void *mremap(void *old, size_t oldlen, size_t newlen, int flags, ...) {
    void *target = NULL;
    if (flags & MREMAP_FIXED) {
        va_list ap;
        va_start(ap, flags);
        target = va_arg(ap, void *);
        va_end(ap);
    }
    if (!watching() || !aligned(old))
        return pw_sys_mremap(old, oldlen, newlen, flags, target);
    uintptr_t lo = (uintptr_t)old, hi = lo + pw_page_up(oldlen ? oldlen : 1);
    struct pw_range whole;
    pthread_mutex_lock(&pw_lock);
    int routed = pw_ranges_containing(&pw_routed, lo, &whole);
    if (!routed) {
        struct pw_range r;
        if (pw_ranges_next(&pw_routed, lo, hi, &r)) {
            pthread_mutex_unlock(&pw_lock);
            errno = EFAULT; /* part routed, part not: not one mapping */
            return MAP_FAILED;
        }
    }
    if (!routed && (flags & MREMAP_FIXED) && aligned(target)) {
        /* The kernel's move replaces what is at the target: it stops being the arena's. */
        unroute_locked((uintptr_t)target, (uintptr_t)target + pw_page_up(newlen), 1);
    }
    pthread_mutex_unlock(&pw_lock);
    if (!routed) {
        void *r = pw_sys_mremap(old, oldlen, newlen, flags, target);
        /* A reservation moved or resized is one still, where the kernel now has it (mremap
         * keeps a mapping's protection): shrunk in place, what is left of it; moved, the new
         * range; left where it was too (DONTUNMAP), both. Committing it later routes it as
         * one area, as the kernel keeps it one mapping. Forgetting what is left of a shrunk
         * one made a later commit of it plain memory beside a routed part of the same
         * mapping, and an mremap across the two then failed (EFAULT) where Linux succeeds. */
        if (r != MAP_FAILED) {
            struct pw_range was;
            pthread_mutex_lock(&pw_lock);
            int reserved = pw_ranges_containing(&pw_reserved, lo, &was);
            uintptr_t at = (uintptr_t)r, end = at + pw_page_up(newlen);
            if (reserved && at == lo && !(flags & MREMAP_DONTUNMAP)) {
                if (end < hi)
                    pw_ranges_remove(&pw_reserved, end, hi);
                else if (end > hi)
                    reserve_locked(hi, end);
            } else {
                if (!(flags & MREMAP_DONTUNMAP))
                    pw_ranges_remove(&pw_reserved, lo, hi);
                if (reserved) {
                    pw_ranges_remove(&pw_reserved, at, end);
                    reserve_locked(at, end);
                }
            }
            pw_tables_changed();
            pthread_mutex_unlock(&pw_lock);
        }
        return r;
    }
    if (flags & ~(MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP) || oldlen == 0 || newlen == 0 ||
        ((flags & MREMAP_FIXED) && !(flags & MREMAP_MAYMOVE)) ||
        ((flags & MREMAP_DONTUNMAP) && (!(flags & MREMAP_MAYMOVE) || oldlen != newlen))) {
        errno = EINVAL;
        return MAP_FAILED;
    }
    if (whole.end < hi) {
        errno = EFAULT; /* the old range is not one mapping */
        return MAP_FAILED;
    }
    size_t old_pages = pw_page_up(oldlen), new_pages = pw_page_up(newlen);
    if (!(flags & (MREMAP_FIXED | MREMAP_DONTUNMAP))) {
        if (new_pages <= old_pages) {
            if (new_pages < old_pages)
                munmap((char *)old + new_pages, old_pages - new_pages);
            return old;
        }
        if (!(flags & MREMAP_MAYMOVE)) {
            errno = ENOMEM;
            return MAP_FAILED;
        }
    }
    int fixed = (flags & MREMAP_FIXED) != 0;
    void *q = mmap(fixed ? target : NULL, new_pages, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | (fixed ? MAP_FIXED : 0), -1, 0);
    if (q == MAP_FAILED)
        return MAP_FAILED;
    memcpy(q, old, old_pages < new_pages ? old_pages : new_pages);
    if (flags & MREMAP_DONTUNMAP)
        madvise(old, old_pages, MADV_DONTNEED);
    else
        munmap(old, old_pages);
    return q;
}

PW_EXPORT int mprotect(void *a, size_t len, int prot) {
    if (!watching() || !aligned(a) || len == 0)
        return pw_sys_mprotect(a, len, prot);
    uintptr_t at = (uintptr_t)a, hi = at + pw_page_up(len);
    int rc = 0;
    pthread_mutex_lock(&pw_lock);
    while (at < hi) {
        struct pw_range routed, reserved;
        int is_routed = pw_ranges_next(&pw_routed, at, hi, &routed);
        int is_reserved = pw_ranges_next(&pw_reserved, at, hi, &reserved);
        uintptr_t next = hi;
        if (is_routed && routed.start < next)
            next = routed.start;
        if (is_reserved && reserved.start < next)
            next = reserved.start;
        if (next > at) {
            /* Neither routed nor reserved: the kernel's. */
            if (pw_sys_mprotect((void *)at, next - at, prot) != 0 && rc == 0)
                rc = -errno;
            at = next;
            continue;
        }
        if (is_routed && routed.start == at) {
            if (prot != (PROT_READ | PROT_WRITE)) {
                sigset_t saved;
                pw_runtime_enter(&saved);
                int e = pw_arena->detach((void *)routed.start, routed.end - routed.start);
                pw_runtime_leave(&saved);
                if (e == 0) {
                    pw_ranges_remove(&pw_routed, routed.start, routed.end);
                    pw_tables_changed();
                    if (pw_sys_mprotect((void *)routed.start, routed.end - routed.start, prot) != 0 && rc == 0)
                        rc = -errno;
                } else if (rc == 0) {
                    rc = e;
                }
            }
            at = routed.end;
            continue;
        }
        /* A reservation: committed read-write it becomes an area when large enough. */
        pw_ranges_remove(&pw_reserved, reserved.start, reserved.end);
        pw_tables_changed();
        size_t n = reserved.end - reserved.start;
        pthread_mutex_unlock(&pw_lock);
        int done = prot == (PROT_READ | PROT_WRITE) && n >= pw_min_alloc && route_at(reserved.start, n);
        if (!done && pw_sys_mprotect((void *)reserved.start, n, prot) != 0 && rc == 0)
            rc = -errno;
        if (!done && prot == PROT_NONE)
            reserve(reserved.start, n); /* still a reservation */
        pthread_mutex_lock(&pw_lock);
        at = reserved.end;
    }
    pthread_mutex_unlock(&pw_lock);
    return rc < 0 ? fail(rc) : 0;
}

/* One advice on a routed range, inside one area (under the lock). 0 or a negative errno. */
static int advise_routed(struct pw_range r, int advice) {
    void *p = (void *)r.start;
    size_t n = r.end - r.start;
    int rc = 0;
    sigset_t saved;
    pw_runtime_enter(&saved);
    switch (advice) {
    case MADV_DONTNEED:
    case MADV_FREE:
    case MADV_DONTNEED_LOCKED:
        rc = pw_arena->discard(p, n);
        break;
    case MADV_REMOVE:
        rc = -EINVAL; /* private memory has no backing store to punch */
        break;
    case MADV_WILLNEED:
    case MADV_POPULATE_READ:
    case MADV_POPULATE_WRITE:
        rc = pw_arena->prefetch ? pw_arena->prefetch(p, n) : 0;
        break;
    default:
        rc = pw_arena->advise ? pw_arena->advise(p, n, advice) : 0;
        if (rc == 1) {
            /* Only plain memory gives what the program asked for: it leaves the arena — the
             * whole routed range around it, since the program asks it of its allocation
             * (numpy advises all of an array but its first page). */
            struct pw_range whole;
            if (!pw_ranges_containing(&pw_routed, r.start, &whole))
                whole = r;
            rc = pw_arena->detach((void *)whole.start, whole.end - whole.start);
            if (rc == 0) {
                pw_ranges_remove(&pw_routed, whole.start, whole.end);
                pw_tables_changed();
                if (pw_sys_madvise(p, n, advice) != 0)
                    rc = -errno;
            }
        }
    }
    pw_runtime_leave(&saved);
    return rc;
}

/* Advice values the kernel knows (include/uapi/asm-generic/mman-common.h, 6.18). */
static int known_advice(int advice) { return (advice >= 0 && advice <= 26 && advice != 5 && advice != 6 && advice != 7) || advice == 100 || advice == 101; }

PW_EXPORT int madvise(void *a, size_t len, int advice) {
    if (!watching() || !aligned(a) || len == 0)
        return pw_sys_madvise(a, len, advice);
    uintptr_t at = (uintptr_t)a, hi = at + pw_page_up(len);
    struct pw_range r;
    pthread_mutex_lock(&pw_lock);
    if (!pw_ranges_next(&pw_routed, at, hi, &r)) {
        pthread_mutex_unlock(&pw_lock);
        return pw_sys_madvise(a, len, advice);
    }
    if (!known_advice(advice)) {
        pthread_mutex_unlock(&pw_lock);
        errno = EINVAL;
        return -1;
    }
    int rc = 0;
    while (at < hi) {
        int found = pw_ranges_next(&pw_routed, at, hi, &r);
        uintptr_t gap_end = found ? r.start : hi;
        if (gap_end > at) {
            if (pw_sys_madvise((void *)at, gap_end - at, advice) != 0 && rc == 0)
                rc = -errno;
            at = gap_end;
            continue;
        }
        int e = advise_routed(r, advice);
        if (e < 0 && rc == 0)
            rc = e;
        at = r.end;
    }
    pthread_mutex_unlock(&pw_lock);
    return rc < 0 ? fail(rc) : 0;
}

PW_EXPORT int posix_madvise(void *a, size_t len, int advice) {
    /* As glibc: POSIX_MADV_DONTNEED is not MADV_DONTNEED (which destroys data), and is ignored. */
    if (advice == POSIX_MADV_DONTNEED)
        return 0;
    return madvise(a, len, advice) == 0 ? 0 : errno;
}

/* mlock and munlock: the kernel's for memory that is not routed. */
static int lock_calls(void *a, size_t len, long nr, long flags) {
    if (!watching() || !aligned(a) || len == 0)
        return (int)syscall(nr, a, len, flags);
    uintptr_t at = (uintptr_t)a, hi = at + pw_page_up(len);
    int rc = 0;
    pthread_mutex_lock(&pw_lock);
    while (at < hi) {
        struct pw_range r;
        int found = pw_ranges_next(&pw_routed, at, hi, &r);
        uintptr_t gap_end = found ? r.start : hi;
        if (gap_end > at && syscall(nr, (void *)at, gap_end - at, flags) != 0 && rc == 0)
            rc = -errno;
        at = found ? r.end : hi;
    }
    pthread_mutex_unlock(&pw_lock);
    return rc < 0 ? fail(rc) : 0;
}

PW_EXPORT int mlock(const void *a, size_t len) { return lock_calls((void *)a, len, SYS_mlock, 0); }
PW_EXPORT int mlock2(const void *a, size_t len, unsigned int flags) {
    return lock_calls((void *)a, len, SYS_mlock2, flags);
}
PW_EXPORT int munlock(const void *a, size_t len) { return lock_calls((void *)a, len, SYS_munlock, 0); }
