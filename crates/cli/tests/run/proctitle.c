/* A program that writes its process title over its arguments and environment, as
 * redis-server, nginx and PostgreSQL do (setproctitle): the environment moves to fresh copies
 * and the original strings are overwritten. Then it allocates, and starts a worker that
 * allocates too. Strings the shim kept from the environment at start-up must survive this. */
#define _GNU_SOURCE
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static uint64_t work(int seed) {
    size_t n = 4 << 20;
    unsigned char *a = malloc(n);
    if (!a)
        exit(1);
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++)
        a[i] = (unsigned char)(i * 7 + seed);
    for (size_t i = 0; i < n; i += 512)
        sum += a[i];
    free(a);
    return sum;
}

int main(int argc, char **argv) {
    if (argc == 2) {
        printf("worker: %llu\n", (unsigned long long)work(2));
        return 0;
    }
    /* The block from argv[0] to the end of the last environment string, as setproctitle finds it. */
    char *start = argv[0], *end = argv[argc - 1] + strlen(argv[argc - 1]) + 1;
    size_t n = 0;
    while (environ[n])
        n++;
    char **copy = calloc(n + 1, sizeof *copy);
    for (size_t i = 0; i < n; i++) {
        if (environ[i] == end)
            end += strlen(environ[i]) + 1;
        copy[i] = strdup(environ[i]);
    }
    environ = copy;
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len < 0)
        return 1;
    self[len] = 0;
    memset(start, 0, (size_t)(end - start));
    snprintf(start, (size_t)(end - start), "proctitle: serving");
    printf("program: %llu\n", (unsigned long long)work(1));
    char *args[] = {self, "worker", NULL};
    pid_t pid;
    int status;
    fflush(stdout);
    if (posix_spawn(&pid, self, NULL, NULL, args, environ) != 0 || waitpid(pid, &status, 0) != pid)
        return 1;
    return !WIFEXITED(status) || WEXITSTATUS(status) != 0;
}
