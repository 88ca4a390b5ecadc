/* fork(2) without exec: the child reads its parent's large malloc'd and mmap'd memory, writes
 * its own copy, frees it; the parent writes its memory right after fork returns. Each must see
 * the memory as it was at the fork plus its own writes (Python's multiprocessing, redis's
 * BGSAVE). Prints one line per process; any difference is an error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { N = 24 << 20, HALF = N / 2 };

static unsigned char at(size_t i, unsigned seed) { return (unsigned char)(i * seed + (i >> 12) + 3); }

/* Errors in [0, HALF) against the pattern of `seed`, and in [HALF, N) against zeros (never
 * written: holes of the arena). */
static size_t check(const unsigned char *p, unsigned seed) {
    size_t bad = 0;
    for (size_t i = 0; i < HALF; i++) bad += p[i] != at(i, seed);
    for (size_t i = HALF; i < N; i++) bad += p[i] != 0;
    return bad;
}

int main(void) {
    unsigned char *a = malloc(N);
    unsigned char *m = mmap(NULL, N, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (!a || m == MAP_FAILED) return 2;
    for (size_t i = 0; i < HALF; i++) a[i] = at(i, 7), m[i] = at(i, 11);
    memset(a + HALF, 0, N - HALF); /* calloc-like: zeros, written */
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return 3;
    if (pid == 0) {
        /* Give the parent time to write first: its writes must not show here. */
        struct timespec t = {0, 50 * 1000 * 1000};
        nanosleep(&t, NULL);
        size_t bad = check(a, 7) + check(m, 11);
        for (size_t i = 0; i < HALF; i++) a[i] = at(i, 13), m[i] = at(i, 17);
        bad += check(a, 13) + check(m, 17);
        unsigned char *c = malloc(N); /* the child's own large block */
        if (!c) return 4;
        memset(c, 1, N);
        for (size_t i = 0; i < N; i += 4096) bad += c[i] != 1;
        free(c);
        free(a);
        munmap(m, N);
        printf("child errors %zu\n", bad);
        fflush(stdout);
        _exit(bad != 0);
    }
    /* Right after fork: the child must not see these. */
    for (size_t i = 0; i < HALF; i++) a[i] = at(i, 19), m[i] = at(i, 23);
    int st = 0;
    if (waitpid(pid, &st, 0) != pid) return 5;
    /* The child's writes must not show here. */
    size_t bad = check(a, 19) + check(m, 23);
    printf("parent errors %zu, child %s %d\n", bad, WIFEXITED(st) ? "exit" : "signal",
           WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    return bad != 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0;
}
