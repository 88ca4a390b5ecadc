/* A hot set that moves (for `pagewise hps run`'s convergence): a 64 MiB malloc'd array whose
 * first 8 MiB are worked hard until they show as PMD-mapped shared memory (HPS promoted them)
 * and the tracker publishes that tracking stopped ("# tracking converged" in
 * /run/pagewise/hps/PID.acs); then the hot set moves to [32, 40) MiB, never touched before,
 * which is worked until the PMD-mapped total has grown by those 8 MiB and the published state
 * has left "converged" (tracking restarted; not waited for if argv[2] is 0: with hugepages at
 * first touch the second hot set may need no tracking). Each wait is bounded by
 * WAIT_SECONDS (argv[1]). Prints "drift: phase1 KB converged 0|1 phase2 KB" on stdout. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "shmem_pmd.h"

#define N (64UL << 20)
#define HOT (8UL << 20)

static int converged(void) {
    char path[64], line[128];
    snprintf(path, sizeof path, "/run/pagewise/hps/%d.acs", (int)getpid());
    FILE *f = fopen(path, "r");
    int yes = 0;
    if (!f)
        return 0;
    while (!yes && fgets(line, sizeof line, f) && line[0] == '#')
        yes = strncmp(line, "# tracking converged", 20) == 0;
    fclose(f);
    return yes;
}

static void work(volatile uint8_t *a, size_t from) {
    for (int k = 0; k < 10; k++)
        for (size_t i = from; i < from + HOT; i += 64)
            a[i] = (uint8_t)(a[i] + i + k);
}

int main(int argc, char **argv) {
    int wait = argc > 1 ? atoi(argv[1]) : 60;
    int want_restart = argc > 2 ? atoi(argv[2]) : 1;
    uint8_t *a = malloc(N);
    if (!a)
        return 1;
    time_t end = time(NULL) + wait;
    long p1 = 0;
    while (time(NULL) < end && ((p1 = shmem_pmd_kb()) < (long)(HOT >> 10) || !converged()))
        work(a, 0);
    int conv = converged();
    end = time(NULL) + wait;
    long p2 = 0;
    int again = !want_restart; /* seen tracking again (published state no longer "converged") */
    while (time(NULL) < end && ((p2 = shmem_pmd_kb()) < p1 + (long)(HOT >> 10) || !again)) {
        work(a, 32UL << 20);
        again |= !converged();
    }
    printf("drift: phase1 %ld converged %d phase2 %ld\n", p1, conv, p2);
    free(a);
    return 0;
}
