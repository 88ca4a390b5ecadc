/* exit_group: leaves as a Go program does, by the exit_group system call itself, so no exit
 * handler runs (no atexit, no destructor). Works on a large malloc'd array first. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(void) {
    size_t len = 16UL << 20;
    unsigned char *a = malloc(len);
    if (!a)
        return 1;
    memset(a, 7, len);
    unsigned long sum = 0;
    for (size_t i = 0; i < len; i += 4096)
        sum += a[i];
    printf("sum %lu\n", sum);
    fflush(stdout);
    syscall(SYS_exit_group, 0);
    return 1; /* not reached */
}
