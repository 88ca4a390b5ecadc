/* A large malloc'd array whose first eighth is worked on hard: prints a checksum of a fixed
 * number of passes. With a WAIT_SECONDS argument > 0 it then keeps working the hot part (the
 * output does not change) until its memory shows a PMD-mapped hugepage of shared memory
 * (/proc/self/smaps_rollup ShmemPmdMapped: HPS promoted a region) or WAIT_SECONDS pass, and
 * says so with the CPUs it may run on at that moment (/proc/self/status Cpus_allowed_list). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "shmem_pmd.h"

#define N (64UL << 20) /* 64 MiB */
#define HOT (N / 8)

static void cpus_allowed(char *out, size_t len) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    snprintf(out, len, "?");
    if (!f)
        return;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Cpus_allowed_list: %63s", out) == 1)
            break;
    fclose(f);
}

static uint64_t pass(uint8_t *a, uint64_t seed) {
    uint64_t sum = seed;
    for (size_t i = 0; i < HOT; i += 64) {
        a[i] = (uint8_t)(a[i] * 31 + i + seed);
        sum = sum * 1000003 + a[i];
    }
    return sum;
}

int main(int argc, char **argv) {
    int wait = argc > 1 ? atoi(argv[1]) : 0;
    uint8_t *a = malloc(N);
    if (!a)
        return 1;
    for (size_t i = 0; i < N; i++)
        a[i] = (uint8_t)(i * 7);
    uint64_t sum = 0;
    for (int k = 0; k < 200; k++)
        sum ^= pass(a, k);
    for (size_t i = 0; i < N; i += 4096)
        sum += a[i];
    printf("checksum %llu\n", (unsigned long long)sum);
    fflush(stdout);
    /* Keep working a copy's worth of the hot part without changing the result. */
    time_t end = time(NULL) + wait;
    long pmd = 0;
    while (wait > 0 && time(NULL) < end && (pmd = shmem_pmd_kb()) == 0)
        for (int k = 0; k < 20; k++)
            (void)pass(a, k);
    if (wait > 0) {
        char cpus[64];
        cpus_allowed(cpus, sizeof cpus);
        fprintf(stderr, "hot_array: ShmemPmdMapped %ld kB, CPUs %s\n", pmd, cpus);
    }
    free(a);
    return 0;
}
