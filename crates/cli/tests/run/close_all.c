/* close_all: what a daemon does once its memory is in use — closes every descriptor but 0-2
 * (close_range, closefrom, then close on each one /proc/self/fd still lists) and tries dup2
 * onto what is left — then checks that memory, makes more, and forks a child that reads it.
 * Prints checksums, and whether any descriptor the program did not open stayed within its
 * reach, or reached a forked child as one of a runtime's own (a memfd, a userfaultfd, a
 * socket). The same lines on its own and under `pagewise run` / `pagewise hps run`. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MIB (1UL << 20)

static uint64_t fill(uint64_t *p, size_t n, uint64_t seed) {
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += p[i] = (i + seed) * 0x9E3779B97F4A7C15ULL;
    return sum;
}

static uint64_t sum(const uint64_t *p, size_t n) {
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++)
        s += p[i];
    return s;
}

/* The descriptors above 2 that /proc/self/fd lists (the listing's own left out), up to max. */
static int open_fds(int *out, int max) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) {
        perror("opendir /proc/self/fd");
        exit(1);
    }
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        int fd = atoi(e->d_name);
        if (e->d_name[0] != '.' && fd > 2 && fd != dirfd(d))
            out[n++] = fd;
    }
    closedir(d);
    return n;
}

static int is_runtime_kind(int fd) {
    char path[64], link[256];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, link, sizeof link - 1);
    if (n < 0)
        return 0;
    link[n] = 0;
    return strstr(link, "memfd:") || strstr(link, "[userfaultfd]") || strncmp(link, "socket:", 7) == 0;
}

int main(void) {
    size_t n = 32 * MIB / 8;
    uint64_t *a = malloc(n * 8);
    if (!a)
        return 1;
    uint64_t expect = fill(a, n, 1);

    if (close_range(3, ~0U, 0) != 0) {
        perror("close_range");
        return 1;
    }
    closefrom(3);
    int fds[256], left = open_fds(fds, 256), reachable = 0;
    for (int i = 0; i < left; i++) {
        if (close(fds[i]) == 0 || errno != EBADF)
            reachable++; /* the program's own would have gone with close_range already */
        if (dup2(1, fds[i]) >= 0 || errno != EBADF)
            reachable++;
    }
    printf("descriptors within reach after closing all: %d\n", reachable);
    printf("first area %s\n", sum(a, n) == expect ? "intact" : "CHANGED");

    uint64_t *b = malloc(n * 8);
    if (!b)
        return 1;
    uint64_t expect_b = fill(b, n, 2);
    printf("second area %s, sums %llx %llx\n", sum(b, n) == expect_b ? "intact" : "CHANGED",
           (unsigned long long)sum(a, n), (unsigned long long)sum(b, n));
    fflush(stdout);

    pid_t pid = fork();
    if (pid == 0) {
        int inherited = open_fds(fds, 256), runtime = 0;
        for (int i = 0; i < inherited; i++)
            runtime += is_runtime_kind(fds[i]);
        printf("child: %d runtime descriptor(s), areas %s\n", runtime,
               sum(a, n) == expect && sum(b, n) == expect_b ? "intact" : "CHANGED");
        fflush(stdout);
        _exit(0);
    }
    int status;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return 1;
    free(a);
    free(b);
    return 0;
}
