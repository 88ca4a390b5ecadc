/* fork(2) in a program whose allocator resets its state in a fork handler registered before
 * the shim's (forkfirst_lib.c): the child's copy of its parent's routed memory must be there
 * before that handler runs, and the handler's writes must stay the child's. Prints one line per
 * process; any difference is an error. */
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

int forkfirst_start(void);
size_t forkfirst_errors(void);

int main(void) {
    if (forkfirst_start() != 0)
        return 2;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        return 3;
    if (pid == 0) {
        size_t bad = forkfirst_errors();
        printf("child errors %zu\n", bad);
        fflush(stdout);
        _exit(bad != 0);
    }
    int st = 0;
    if (waitpid(pid, &st, 0) != pid)
        return 4;
    printf("parent errors %zu, child %s %d\n", forkfirst_errors(), WIFEXITED(st) ? "exit" : "signal",
           WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    return 0;
}
