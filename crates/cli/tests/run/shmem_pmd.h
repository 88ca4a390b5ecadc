/* What HPS promoted, by the kernel's own account: kB of this process's shared memory mapped by
 * PMDs (/proc/self/smaps_rollup ShmemPmdMapped), 0 when it cannot be read. For the test
 * programs here that wait (bounded) for a promotion instead of racing it. */
#ifndef PAGEWISE_TEST_SHMEM_PMD_H
#define PAGEWISE_TEST_SHMEM_PMD_H

#include <stdio.h>

static long shmem_pmd_kb(void) {
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    char line[256];
    long kb = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "ShmemPmdMapped: %ld kB", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

#endif
