/* fork + exec with a large malloc'd array in the parent: the child (this program again, in
 * "child" mode) allocates and checks its own; the parent's array is intact afterwards. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static unsigned long fill_and_sum(unsigned char *p, size_t n, unsigned seed) {
    unsigned long s = 0;
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * seed + 3);
    for (size_t i = 0; i < n; i += 61) s += p[i];
    return s;
}

int main(int argc, char **argv) {
    size_t n = 3 << 20;
    if (argc > 1 && strcmp(argv[1], "child") == 0) {
        unsigned char *c = malloc(n);
        if (!c) return 2;
        printf("child sum=%lu\n", fill_and_sum(c, n, 13));
        fflush(stdout);
        return 0;
    }
    unsigned char *p = malloc(n);
    if (!p) return 2;
    unsigned long before = fill_and_sum(p, n, 7);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/proc/self/exe", argv[0], "child", (char *)NULL);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    unsigned long after = 0;
    for (size_t i = 0; i < n; i += 61) after += p[i];
    printf("parent sum=%lu after=%lu child_exit=%d\n", before, after, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    free(p);
    return 0;
}
