/* fork(2) of a process whose large block is mostly never written: the child must see the
 * written part and zeros elsewhere, and (as with the kernel's copy on write) hold in memory
 * only about what was written: holes are not copied into it. Prints one line per process. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

enum { N = 64 << 20, WRITTEN = 1 << 20, PAGE = 4096 };

int main(void) {
    unsigned char *a = malloc(N);
    if (!a) return 2;
    for (size_t i = 0; i < WRITTEN; i++) a[i] = (unsigned char)(i * 7 + 1);
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return 3;
    if (pid == 0) {
        /* Before reading anything: how much of the block the child holds in memory. */
        static unsigned char vec[N / PAGE + 2];
        unsigned char *first = (unsigned char *)((size_t)a & ~(size_t)(PAGE - 1)); /* malloc's header */
        size_t pages = (size_t)(a + N - first + PAGE - 1) / PAGE;
        if (mincore(first, pages * PAGE, vec) != 0) return 4;
        size_t resident = 0;
        for (size_t i = 0; i < pages; i++) resident += vec[i] & 1;
        size_t bad = 0;
        for (size_t i = 0; i < N; i++) bad += a[i] != (i < WRITTEN ? (unsigned char)(i * 7 + 1) : 0);
        printf("child errors %zu, holds %s of the block\n", bad, resident <= N / PAGE / 8 ? "little" : "most");
        fflush(stdout);
        _exit(bad != 0);
    }
    int st = 0;
    if (waitpid(pid, &st, 0) != pid) return 5;
    printf("parent: child %s %d\n", WIFEXITED(st) ? "exit" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    free(a);
    return !WIFEXITED(st) || WEXITSTATUS(st) != 0;
}
