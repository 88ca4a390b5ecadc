/* A pre-fork server in small, as PostgreSQL runs its backends: the parent fills one 4 MiB
 * buffer of its own, then forks two workers one after the other. Each allocates 2 MiB three
 * times (malloc) and once with mmap, fills and sums what it allocated, and leaves with exit(3),
 * so its exit handlers run; the parent prints each worker's checksum and its own. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static uint64_t fill_and_sum(unsigned char *a, size_t n, int seed) {
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++)
        a[i] = (unsigned char)(i * 29 + seed);
    for (size_t i = 0; i < n; i += 512)
        sum += a[i];
    return sum;
}

static void worker(int id, int out) {
    const size_t n = 2 << 20;
    uint64_t sum = 0;
    for (int round = 0; round < 3; round++) {
        unsigned char *a = malloc(n);
        if (!a)
            exit(1);
        sum += fill_and_sum(a, n, id + round);
        free(a);
    }
    unsigned char *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        exit(1);
    sum += fill_and_sum(m, n, id + 7);
    munmap(m, n);
    if (write(out, &sum, sizeof sum) != sizeof sum)
        exit(1);
    exit(0);
}

int main(void) {
    const size_t n = 4 << 20;
    unsigned char *own = malloc(n);
    if (!own)
        return 1;
    uint64_t mine = fill_and_sum(own, n, 1);
    for (int id = 0; id < 2; id++) {
        int p[2];
        if (pipe(p) != 0)
            return 1;
        fflush(stdout);
        pid_t pid = fork();
        if (pid < 0)
            return 1;
        if (pid == 0) {
            close(p[0]);
            worker(id, p[1]);
        }
        close(p[1]);
        uint64_t sum = 0;
        int status;
        if (read(p[0], &sum, sizeof sum) != sizeof sum || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
            WEXITSTATUS(status) != 0)
            return 1;
        close(p[0]);
        printf("worker %d: %llu\n", id, (unsigned long long)sum);
    }
    printf("parent: %llu, still %llu\n", (unsigned long long)mine, (unsigned long long)fill_and_sum(own, n, 1));
    free(own);
    return 0;
}
