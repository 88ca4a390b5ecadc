/* The runtime's descriptors, kept out of the program's reach.
 *
 * The runtime behind the shim holds descriptors in the program's own table: its userfaultfds,
 * the memfds of HPS's arenas, DLM's connections to its servers, HPS's service pipe, and the
 * shim's copy of stderr. They sit high, 128 below the soft RLIMIT_NOFILE
 * (crates/kernel/src/fd.rs `out_of_the_way`), out of the way of a program that places its own
 * by number. A program that closes every descriptor it did not open itself still finds them:
 * a daemon closing all but 0-2 (Python's os.closerange, closefrom(3), close_range(3, ~0U)), a
 * loop over /proc/self/fd. Closing DLM's userfaultfd ended the run with SIGABRT ("reading the
 * userfaultfd failed: Bad file descriptor"); closing the shim's stderr lost the end-of-run
 * report.
 *
 * So each such descriptor is registered here (`pagewise_runtime_fd`, which the runtime calls
 * when the shim is in the process), and the program's calls treat it as the kernel treats a
 * descriptor outside the program's range: close and dup2/dup3 onto it fail with EBADF, and
 * close_range/closefrom close everything around it. The runtime's own calls (a thread the
 * shim counts as inside it: pw_in_shim) pass, and a close by the runtime takes the number
 * out of the registry, so the program may hold that number later. A child made by fork(2)
 * does not run the runtime: it closes its copies (an inherited memfd would keep the memory of
 * an area its parent freed) and keeps only the shim's stderr.
 *
 * Not covered: a program that makes the system call itself (syscall(SYS_close_range), Go's
 * runtime); a descriptor the runtime opens and closes again within one call.
 *
 * Async-signal-safe throughout: close and dup2 are (signal-safety(7)), and a program may call
 * them from a signal handler, so the registry is a fixed array of atomics.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim.h"

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

/* glibc's own entry points, under the names it exports besides the ones the shim takes. */
extern int __close(int fd);
extern int __dup2(int oldfd, int newfd);

/* Registered descriptors, each stored as fd + 1 (0: a free slot). The runtime holds a
 * handful (a few per arena, one per server connection). */
#define GUARDED_MAX 128
static _Atomic int guarded[GUARDED_MAX];
/* The lowest number ever registered: a program's descriptors lie below it, and their close
 * is one compare away from the kernel. */
static _Atomic int guarded_floor = INT_MAX;

static int find(int fd) {
    for (int i = 0; i < GUARDED_MAX; i++)
        if (atomic_load_explicit(&guarded[i], memory_order_acquire) == fd + 1)
            return i;
    return -1;
}

static inline int is_guarded(int fd) {
    return fd >= atomic_load_explicit(&guarded_floor, memory_order_relaxed) && find(fd) >= 0;
}

void pw_fds_guard(int fd) {
    if (fd < 0 || find(fd) >= 0)
        return;
    for (int i = 0; i < GUARDED_MAX; i++) {
        int free_slot = 0;
        if (atomic_compare_exchange_strong(&guarded[i], &free_slot, fd + 1)) {
            int floor = atomic_load(&guarded_floor);
            while (fd < floor && !atomic_compare_exchange_weak(&guarded_floor, &floor, fd))
                ;
            return;
        }
    }
    /* Full: this one stays as reachable as any descriptor. */
}

static void unguard(int fd) {
    int i = find(fd);
    if (i >= 0)
        atomic_store(&guarded[i], 0);
}

/* Called by the runtime (crates/kernel/src/fd.rs) for each descriptor it keeps. */
PW_EXPORT void pagewise_runtime_fd(int fd) { pw_fds_guard(fd); }

void pw_fds_close_in_child(int keep) {
    for (int i = 0; i < GUARDED_MAX; i++) {
        int v = atomic_load(&guarded[i]);
        if (v != 0 && v - 1 != keep) {
            atomic_store(&guarded[i], 0);
            __close(v - 1);
        }
    }
}

PW_EXPORT int close(int fd) {
    if (__builtin_expect(is_guarded(fd), 0)) {
        if (!pw_in_shim) {
            errno = EBADF;
            return -1;
        }
        unguard(fd); /* the runtime closes its own: the number is free again */
    }
    return __close(fd);
}

PW_EXPORT int dup2(int oldfd, int newfd) {
    if (__builtin_expect(is_guarded(newfd), 0) && !pw_in_shim) {
        errno = EBADF;
        return -1;
    }
    return __dup2(oldfd, newfd);
}

PW_EXPORT int dup3(int oldfd, int newfd, int flags) {
    if (__builtin_expect(is_guarded(newfd), 0) && !pw_in_shim) {
        errno = EBADF;
        return -1;
    }
    return (int)syscall(SYS_dup3, oldfd, newfd, flags);
}

static int sys_close_range(unsigned lo, unsigned hi, int flags) {
    return (int)syscall(SYS_close_range, lo, hi, flags);
}

/* close_range(2) over [lo, hi] but for the registered descriptors in it: the gaps between them,
 * lowest first. CLOSE_RANGE_CLOEXEC only marks (the runtime's already are), so it goes whole. */
PW_EXPORT int close_range(unsigned lo, unsigned hi, int flags) {
    if (pw_in_shim || (flags & CLOSE_RANGE_CLOEXEC) || lo > hi)
        return sys_close_range(lo, hi, flags);
    int inside[GUARDED_MAX], n = 0;
    for (int i = 0; i < GUARDED_MAX; i++) {
        int v = atomic_load(&guarded[i]);
        if (v != 0 && (unsigned)(v - 1) >= lo && (unsigned)(v - 1) <= hi) {
            int j = n++;
            for (; j > 0 && inside[j - 1] > v - 1; j--)
                inside[j] = inside[j - 1];
            inside[j] = v - 1;
        }
    }
    unsigned from = lo;
    for (int k = 0; k < n; k++) {
        unsigned fd = (unsigned)inside[k];
        if (fd > from && sys_close_range(from, fd - 1, flags) < 0)
            return -1;
        from = fd + 1;
    }
    return from <= hi ? sys_close_range(from, hi, flags) : 0;
}

/* glibc's closefrom calls its internal close_range, not the one above. */
PW_EXPORT void closefrom(int lowfd) {
    if (lowfd < 0)
        lowfd = 0;
    if (close_range((unsigned)lowfd, UINT_MAX, 0) == 0)
        return;
    /* No close_range(2) (before Linux 5.9): one at a time, as far as the table may reach. */
    long max = sysconf(_SC_OPEN_MAX);
    for (long fd = lowfd; fd < max; fd++)
        close((int)fd);
}
