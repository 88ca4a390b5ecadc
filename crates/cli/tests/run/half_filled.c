/* A malloc'd block of 8 regions (2 MiB each; under `pagewise hps run` a block this large is an
 * arena of its own, which starts on a 2 MiB boundary) whose first four the program fills and
 * whose last four it fills half of (the first 1 MiB of each), all of it worked on hard. Run with
 * WAIT_SECONDS and TARGET_KB: it keeps working until its memory shows TARGET_KB of PMD-mapped
 * shared memory (/proc/self/smaps_rollup ShmemPmdMapped: regions HPS promoted) or WAIT_SECONDS
 * pass, then on for SETTLE_SECONDS (HPS may promote more meanwhile), and prints what is
 * PMD-mapped then. Promoting a half-filled region gives it 1 MiB the program never touched. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "shmem_pmd.h"

#define REGION (2UL << 20)
#define REGIONS 8
#define PAGE 4096UL

/* How much of region r the program uses: all of the first half of the block, half of the rest. */
static size_t used(int r) { return r < REGIONS / 2 ? REGION : REGION / 2; }

static uint64_t pass(uint8_t *a, uint64_t seed) {
    uint64_t sum = seed;
    for (int r = 0; r < REGIONS; r++)
        for (size_t i = 0; i < used(r); i += 64) {
            uint8_t *p = a + r * REGION + i;
            *p = (uint8_t)(*p * 31 + i + seed);
            sum = sum * 1000003 + *p;
        }
    return sum;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: half_filled WAIT_SECONDS TARGET_KB SETTLE_SECONDS\n");
        return 2;
    }
    int wait = atoi(argv[1]), settle = atoi(argv[3]);
    long target = atol(argv[2]);
    uint8_t *a = malloc(REGIONS * REGION);
    if (!a)
        return 1;
    for (int r = 0; r < REGIONS; r++)
        for (size_t i = 0; i < used(r); i += PAGE)
            a[r * REGION + i] = (uint8_t)(r + i);
    uint64_t sum = 0;
    for (int k = 0; k < 20; k++)
        sum ^= pass(a, k);
    printf("checksum %llu\n", (unsigned long long)sum);
    fflush(stdout);
    time_t end = time(NULL) + wait;
    while (time(NULL) < end && shmem_pmd_kb() < target)
        (void)pass(a, 1);
    end = time(NULL) + settle;
    while (time(NULL) < end)
        (void)pass(a, 1);
    fprintf(stderr, "half_filled: ShmemPmdMapped %ld kB\n", shmem_pmd_kb());
    free(a);
    return 0;
}
