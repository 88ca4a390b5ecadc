/* A program that pages (sweeps of a 4 MiB malloc'd array, for the tuner's windows), then
 * leaves a process behind that it started through the shell and that ends a second after it:
 * the run's report (the tuner's decisions) must stay this program's. Prints the sum. */
#include <stdio.h>
#include <stdlib.h>

int main(void) {
    size_t n = 4 << 20;
    unsigned char *p = malloc(n);
    if (!p) return 2;
    unsigned long s = 0;
    for (int round = 0; round < 40; round++)
        for (size_t i = 0; i < n; i += 512) s += p[i] += (unsigned char)(i + round);
    printf("sum=%lu\n", s);
    fflush(stdout);
    return system("sleep 1 &") == 0 ? 0 : 3;
}
