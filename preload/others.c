/* What the processes the program started or forked did with large allocations, for the run's
 * report.
 *
 * Every process that loads the shim runs its own runtime: a program `pagewise run` starts, and
 * what that program starts in turn with exec — mpirun's ranks, make's compilers, a shell
 * script's commands. Only the first prints the end-of-run report (shim.c, `reports`). The
 * others used to say nothing, so `pagewise run -- mpirun -np 2 hpcc` warned that nothing ran
 * on DLM memory (mpirun itself allocates little) while both ranks did. A child made by fork(2)
 * routes nothing (shim.c, `child`): the work of a pre-fork server (PostgreSQL's backends) stayed
 * in local memory while the report warned that the program had made no large allocation.
 *
 * Now each other process that routed anything, and each forked child that made an allocation
 * the program's own process would have routed, leaves one line, at exit, in a file of its own
 * in PAGEWISE_PRELOAD_OTHERS (a directory in the run's private directory, which only the
 * run's user can write), and the wrapper sums them once the program has ended. The formats,
 * read by crates/cli/src/others.rs (`parse`), decimal counts:
 *
 *     started ARENA ALLOCATIONS BYTES PEAK_BYTES REFUSED\n
 *     forked ARENA ALLOCATIONS BYTES MIN_ALLOC\n
 *
 * `started`: as the report's own line gives them for the program. `forked`: the allocations
 * of at least MIN_ALLOC bytes the child made, all in local memory. A child that leaves with
 * _exit (Python's multiprocessing workers, redis's BGSAVE) runs no exit handler and leaves none.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shim.h"

/* PAGEWISE_PRELOAD_OTHERS, copied (pw_copy_env); empty: none. */
static char others_dir[4096];

void pw_others_configure(void) { pw_copy_env(others_dir, sizeof others_dir, "PAGEWISE_PRELOAD_OTHERS"); }

/* Leave one line (`fmt` and its arguments) in a file of this process's own, when the run has a
 * directory for them and there is something to count. */
__attribute__((format(printf, 2, 3))) static void leave(unsigned long count, const char *fmt, ...) {
    if (!others_dir[0] || count == 0)
        return;
    char line[160], path[4200];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n <= 0 || n >= (int)sizeof line)
        return;
    /* Named by the pid; a long run may see a pid again (make's thousands of processes). */
    int fd = -1;
    for (int again = 0; fd < 0 && again < 64; again++) {
        if (again)
            snprintf(path, sizeof path, "%s/%ld.%d", others_dir, (long)getpid(), again);
        else
            snprintf(path, sizeof path, "%s/%ld", others_dir, (long)getpid());
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0 && errno != EEXIST)
            return;
    }
    if (fd < 0)
        return;
    ssize_t w = write(fd, line, (size_t)n);
    (void)w; /* a short count leaves a line the wrapper does not parse: it is skipped */
    close(fd);
}

void pw_others_leave_counts(void) {
    unsigned long count = atomic_load(&pw_routed_count);
    leave(count, "started %s %lu %lu %lu %lu\n", pw_arena->name, count, atomic_load(&pw_routed_bytes),
          atomic_load(&pw_routed_peak), atomic_load(&pw_fallbacks));
}

/* What this forked child allocated that its parent would have routed; zeroed in each child. */
static _Atomic unsigned long kept_count, kept_bytes;

void pw_others_forked(void) {
    atomic_store(&kept_count, 0);
    atomic_store(&kept_bytes, 0);
}

void pw_others_kept_in_child(size_t len) {
    atomic_fetch_add_explicit(&kept_count, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&kept_bytes, len, memory_order_relaxed);
}

void pw_others_leave_child_counts(void) {
    unsigned long count = atomic_load(&kept_count);
    leave(count, "forked %s %lu %lu %zu\n", pw_arena->name, count, atomic_load(&kept_bytes), pw_min_alloc);
}

int pw_others_left_counts(void) {
    if (!others_dir[0])
        return 0;
    DIR *d = opendir(others_dir);
    if (!d)
        return 0;
    int found = 0;
    for (struct dirent *e; !found && (e = readdir(d));)
        found = e->d_name[0] != '.';
    closedir(d);
    return found;
}
