/* What the processes the program started put on the arena, for the run's report.
 *
 * Every process that loads the shim runs its own runtime: a program `pagewise run` starts, and
 * what that program starts in turn with exec — mpirun's ranks, make's compilers, a shell
 * script's commands. Only the first prints the end-of-run report (shim.c, `reports`). The
 * others used to say nothing, so `pagewise run -- mpirun -np 2 hpcc` warned that nothing ran
 * on DLM memory (mpirun itself allocates little) while both ranks did.
 *
 * Now each other process that routed anything leaves its counts, at exit, in a file of its own
 * in PAGEWISE_PRELOAD_OTHERS (a directory in the run's private directory, which only the
 * run's user can write), and the wrapper sums them once the program has ended. The format,
 * one line, read by crates/cli/src/others.rs (`parse`):
 *
 *     ARENA ALLOCATIONS BYTES PEAK_BYTES REFUSED\n
 *
 * decimal counts, as the report's own line gives them for the program.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shim.h"

/* PAGEWISE_PRELOAD_OTHERS, copied (pw_copy_env); empty: none. */
static char others_dir[4096];

void pw_others_configure(void) { pw_copy_env(others_dir, sizeof others_dir, "PAGEWISE_PRELOAD_OTHERS"); }

void pw_others_leave_counts(void) {
    unsigned long count = atomic_load(&pw_routed_count);
    if (!others_dir[0] || count == 0)
        return;
    char path[4200], line[160];
    int n = snprintf(line, sizeof line, "%s %lu %lu %lu %lu\n", pw_arena->name, count,
                     atomic_load(&pw_routed_bytes), atomic_load(&pw_routed_peak), atomic_load(&pw_fallbacks));
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
