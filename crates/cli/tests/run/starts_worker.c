/* A program that does its work in processes it starts, as mpirun does with its ranks: it
 * allocates little itself, and starts two workers (posix_spawn of itself), each of which
 * allocates 8 MiB twice, fills it and prints a checksum. */
#define _GNU_SOURCE
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static int worker(int id) {
    uint64_t sum = 0;
    for (int round = 0; round < 2; round++) {
        size_t n = 8 << 20;
        unsigned char *a = malloc(n);
        if (!a)
            return 1;
        for (size_t i = 0; i < n; i++)
            a[i] = (unsigned char)(i * 31 + id + round);
        for (size_t i = 0; i < n; i += 4096)
            sum += a[i] + a[n - 1 - i];
        free(a);
    }
    printf("worker %d: %llu\n", id, (unsigned long long)sum);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2)
        return worker(atoi(argv[1]));
    int failed = 0;
    for (int id = 0; id < 2; id++) {
        char arg[8];
        snprintf(arg, sizeof arg, "%d", id);
        char *args[] = {argv[0], arg, NULL};
        pid_t pid;
        fflush(stdout);
        int status;
        if (posix_spawn(&pid, "/proc/self/exe", NULL, NULL, args, environ) != 0 || waitpid(pid, &status, 0) != pid ||
            !WIFEXITED(status) || WEXITSTATUS(status) != 0)
            failed++;
    }
    printf("workers failed: %d\n", failed);
    return failed != 0;
}
