/* fork(2) under the shim: a child sees its parent's routed memory as it was at the fork, and
 * keeps its own writes, as Linux gives for private anonymous memory.
 *
 * The child never calls into its parent's runtime (its threads are not in the child). How it
 * gets the routed ranges depends on the arena:
 * - HPS (`copy_in_child`): the arenas are memfds, inherited still shared; the child turns each
 *   routed range into its private copy while the forking thread waits on a pipe.
 * - DLM (`stream_to_child`): the areas are not inherited (MADV_DONTFORK: a child would see
 *   zeros where its parent's pages live on a server). The forking thread sends each range's
 *   bytes over a socket pair — reading its own memory, so the parent's runtime fetches what is
 *   on a server as for any read(2) — and the child receives them into fresh plain memory
 *   mapped over the range.
 * Either way the copy is eager, where the kernel would copy on write: the child holds every
 * page of the routed ranges that holds data (DLM: the runtime's `dlm_holds_data` says which
 * read as zeros; those are neither fetched nor sent), so a DLM copy is made only when the
 * ranges fit in half the memory available; otherwise the child goes without (it faults where
 * it reads the parent's memory) and says so. The child's blocks are then plain memory,
 * unmapped when freed. Writes other threads of the parent make during the copy may show in
 * the child. `--on-fork none` turns copies off, for programs that fork only to exec: each
 * such fork would otherwise wait for a copy the exec throws away.
 *
 * A forked child also gets the program's CPUs back when its parent was pinned to one CPU with
 * the runtime's handler (docs/dlm-run.md, "The handler keeps the program company"): the child has
 * no handler to keep it company. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "shim.h"

extern void *__libc_malloc(size_t);
extern void __libc_free(void *);

enum fork_plan { FORK_NONE, FORK_COPY, FORK_STREAM };

/* Decided in prepare (the parent, pw_lock held), seen by both sides after the fork. */
static enum fork_plan plan = FORK_NONE;
/* FORK_COPY: a pipe, the child writes one byte when done. FORK_STREAM: a socket pair, [0] the
 * parent's end. */
static int link_fd[2] = {-1, -1};
/* FORK_STREAM: the routed ranges at the fork, for the parent, which streams them after it has
 * let go of pw_lock (the child has the same in pw_routed). */
static struct pw_range *snapshot;
static size_t snapshot_n;
/* Bytes the child would have copied when the plan was FORK_NONE for want of memory. */
static size_t declined_bytes;

int pw_child_has_copies;
/* `--on-fork none` (PAGEWISE_PRELOAD_FORK=none): a child gets no copy; fork returns at once. */
static int copies_off;

void pw_fork_configure(const char *mode) {
    if (!mode || strcmp(mode, "copy") == 0)
        return;
    if (strcmp(mode, "none") == 0)
        copies_off = 1;
    else
        pw_note("pagewise: PAGEWISE_PRELOAD_FORK=%s is neither `copy` nor `none`: children get a copy\n", mode);
}

/* MemAvailable in bytes, or 0 when /proc/meminfo cannot be read. */
static size_t mem_available(void) {
    char buf[4096];
    int fd = open("/proc/meminfo", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    const char *p = strstr(buf, "MemAvailable:");
    return p ? (size_t)strtoull(p + strlen("MemAvailable:"), NULL, 10) << 10 : 0;
}

void pw_fork_prepare(void) {
    pthread_mutex_lock(&pw_lock);
    plan = FORK_NONE;
    declined_bytes = 0;
    if (!pw_arena || pw_routed.n == 0 || copies_off)
        return;
    if (pw_arena->copy_in_child) {
        /* Only pages in memory are copied: bounded by what the parent holds already. */
        if (pipe2(link_fd, O_CLOEXEC) == 0)
            plan = FORK_COPY;
    } else if (pw_arena->stream_to_child) {
        size_t total = 0;
        for (size_t i = 0; i < pw_routed.n; i++)
            total += pw_routed.v[i].end - pw_routed.v[i].start;
        if (total > mem_available() / 2) {
            declined_bytes = total;
            return;
        }
        snapshot = __libc_malloc(pw_routed.n * sizeof *snapshot);
        if (!snapshot)
            return;
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, link_fd) != 0) {
            __libc_free(snapshot);
            snapshot = NULL;
            return;
        }
        memcpy(snapshot, pw_routed.v, pw_routed.n * sizeof *snapshot);
        snapshot_n = pw_routed.n;
        plan = FORK_STREAM;
    }
}

/* The stream, range after range of the snapshot: extents, each a header followed by `len`
 * bytes of the range when `data`; an extent without data reads as zeros (never written, or
 * discarded: the arena's holds_data), and its bytes are neither read nor sent. */
struct extent {
    uint64_t len;
    uint64_t data;
};

/* Send [p, p+len) whole; a page another thread unmapped meanwhile (EFAULT) goes as zeros, so
 * the child's ranges stay in step. 0, or -1 when the child is gone. */
static int send_bytes(int fd, const char *p, size_t len) {
    static const char zeros[PW_PAGE];
    for (size_t at = 0; at < len;) {
        size_t n = len - at < (1UL << 20) ? len - at : (1UL << 20);
        ssize_t k = send(fd, p + at, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EFAULT) {
            n = PW_PAGE - ((uintptr_t)(p + at) & (PW_PAGE - 1));
            for (size_t z = 0; z < n;) {
                k = send(fd, zeros, n - z, MSG_NOSIGNAL);
                if (k < 0 && errno == EINTR)
                    continue;
                if (k <= 0)
                    return -1;
                z += (size_t)k;
            }
            at += n;
        } else if (k > 0) {
            at += (size_t)k;
        } else if (!(k < 0 && errno == EINTR)) {
            return -1;
        }
    }
    return 0;
}

/* Send [start, start+len) as extents, asking the arena which pages hold data a slice at a
 * time (every page does, for an arena that cannot tell). 0, or -1 when the child is gone. */
static int send_range(int fd, uintptr_t start, size_t len) {
    unsigned char vec[4096];
    const size_t slice = sizeof vec * PW_PAGE;
    for (size_t at = 0; at < len; at += slice) {
        size_t n = len - at < slice ? len - at : slice, pages = n / PW_PAGE;
        int rc = -1;
        if (pw_arena->holds_data) {
            sigset_t saved;
            pw_runtime_enter(&saved);
            rc = pw_arena->holds_data((void *)(start + at), n, vec);
            pw_runtime_leave(&saved);
        }
        if (rc != 0)
            memset(vec, 1, pages);
        for (size_t i = 0; i < pages;) {
            size_t j = i;
            while (j < pages && !vec[j] == !vec[i])
                j++;
            struct extent e = {(uint64_t)(j - i) * PW_PAGE, vec[i] != 0};
            if (send_bytes(fd, (const char *)&e, sizeof e) != 0 ||
                (e.data && send_bytes(fd, (const char *)(start + at + i * PW_PAGE), e.len) != 0))
                return -1;
            i = j;
        }
    }
    return 0;
}

void pw_fork_parent(void) {
    enum fork_plan p = plan;
    int fd = link_fd[0];
    if (link_fd[1] >= 0)
        close(link_fd[1]);
    link_fd[0] = link_fd[1] = -1;
    plan = FORK_NONE;
    struct pw_range *ranges = snapshot;
    size_t n = snapshot_n;
    snapshot = NULL;
    snapshot_n = 0;
    pthread_mutex_unlock(&pw_lock);
    if (fd < 0)
        return;
    if (p == FORK_STREAM) {
        /* Reading its own memory: what is on a server is fetched as for any read(2). */
        for (size_t i = 0; i < n && send_range(fd, ranges[i].start, ranges[i].end - ranges[i].start) == 0; i++) {
        }
        __libc_free(ranges);
    } else {
        /* Until the child has its copy, this thread must not write what the child copies. One
         * byte, or end of file if the child died first. */
        char c;
        while (read(fd, &c, 1) < 0 && errno == EINTR) {
        }
    }
    close(fd);
}

/* Receive exactly n bytes. 0 or a negative errno (EPIPE: the parent is gone). */
static int recv_all(int fd, char *p, size_t n) {
    for (size_t at = 0; at < n;) {
        ssize_t k = recv(fd, p + at, n - at, 0);
        if (k > 0)
            at += (size_t)k;
        else if (!(k < 0 && errno == EINTR))
            return k == 0 ? -EPIPE : -errno;
    }
    return 0;
}

/* Receive [start, start+len) into fresh plain memory mapped there: whatever the child has
 * there is what fork(2) left of the parent's routed range, which the copy replaces; extents
 * without data stay as the fresh mapping has them, zeros not yet in memory. 0 or a negative
 * errno (then nothing of the range is there). */
static int receive_range(int fd, uintptr_t start, size_t len) {
    char *copy = pw_sys_mmap((void *)start, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (copy == MAP_FAILED)
        return -errno;
    int rc = 0;
    for (size_t at = 0; at < len && rc == 0;) {
        struct extent e;
        rc = recv_all(fd, (char *)&e, sizeof e);
        if (rc == 0 && (e.len == 0 || e.len > len - at || e.len % PW_PAGE))
            rc = -EPROTO;
        if (rc == 0 && e.data)
            rc = recv_all(fd, copy + at, e.len);
        at += e.len;
    }
    if (rc < 0)
        pw_sys_munmap(copy, len);
    return rc;
}

/* The program's CPUs (PAGEWISE_PROGRAM_CPUS, a list such as "0-1,4") back, when this child
 * inherited a mask of exactly one CPU that is not all of them (a mask the user chose stays).
 * The rule of pagewise_kernel::colocate::widen_inherited_mask, here in C: in a child forked
 * from a threaded parent, the Rust one could wait forever on a lock (the environment's) that
 * another thread of the parent held at the fork. */
static void widen_inherited_mask(void) {
    const char *list = getenv("PAGEWISE_PROGRAM_CPUS");
    cpu_set_t now, want;
    if (!list || sched_getaffinity(0, sizeof now, &now) != 0 || CPU_COUNT(&now) != 1)
        return;
    CPU_ZERO(&want);
    for (const char *p = list; *p;) {
        char *end;
        unsigned long lo = strtoul(p, &end, 10), hi = lo;
        if (end == p)
            return;
        if (*end == '-')
            hi = strtoul(end + 1, &end, 10);
        for (unsigned long c = lo; c <= hi && c < CPU_SETSIZE; c++)
            CPU_SET(c, &want);
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return;
    }
    cpu_set_t both;
    CPU_AND(&both, &now, &want);
    if (CPU_COUNT(&want) > 1 && CPU_COUNT(&both) == 1)
        sched_setaffinity(0, sizeof want, &want);
}

/* Called by the shim's child handler, pw_lock held, before it forgets the routed ranges. */
void pw_fork_child(void) {
    widen_inherited_mask();
    pw_child_has_copies = plan != FORK_NONE;
    if (plan == FORK_STREAM && link_fd[0] >= 0) {
        /* The parent's end: closed here, so the parent's death ends the stream. */
        close(link_fd[0]);
        link_fd[0] = -1;
    }
    for (size_t i = 0; plan != FORK_NONE && i < pw_routed.n; i++) {
        struct pw_range r = pw_routed.v[i];
        int rc = plan == FORK_COPY     ? pw_arena->copy_in_child((void *)r.start, r.end - r.start)
                 : link_fd[1] >= 0     ? receive_range(link_fd[1], r.start, r.end - r.start)
                                       : -EPIPE;
        if (rc < 0) {
            /* Not the parent's memory to write into: gone from the child, which then faults
             * where it reads it (SIGSEGV), never corrupting its parent. */
            pw_note("pagewise: a child made by fork(2) could not copy %zu MiB of its parent's memory at %p (%s): "
                    "it is not there in the child\n",
                    (size_t)(r.end - r.start) >> 20, (void *)r.start, strerror(-rc));
            if (plan == FORK_COPY)
                pw_sys_munmap((void *)r.start, r.end - r.start);
            if (plan == FORK_STREAM && link_fd[1] >= 0) {
                /* The stream is out of step: nothing more comes. */
                close(link_fd[1]);
                link_fd[1] = -1;
            }
        }
    }
    if (plan == FORK_NONE && pw_arena->copy_in_child) {
        /* Inherited still shared with the parent (HPS's memfds), and no copy made: gone from
         * the child, which faults where it reads it, never writing into its parent's memory. */
        for (size_t i = 0; i < pw_routed.n; i++)
            pw_sys_munmap((void *)pw_routed.v[i].start, pw_routed.v[i].end - pw_routed.v[i].start);
    }
    if (declined_bytes)
        pw_note("pagewise: a child made by fork(2) does not get a copy of its parent's %zu MiB of %s memory "
                "(more than half the memory available): it faults where it reads that memory\n",
                declined_bytes >> 20, pw_arena->name);
    if (plan == FORK_COPY && link_fd[1] >= 0)
        (void)!write(link_fd[1], "", 1);
    for (int i = 0; i < 2; i++)
        if (link_fd[i] >= 0)
            close(link_fd[i]);
    link_fd[0] = link_fd[1] = -1;
    if (snapshot)
        __libc_free(snapshot);
    snapshot = NULL;
    plan = FORK_NONE;
}
