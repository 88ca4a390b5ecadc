/* A signal handler that stores to memory while the program's one thread waits on a fault:
 * under `pagewise run` (faults served by the handler thread) the waiting thread runs its
 * signal handlers, so the handler's store can land on a unit the runtime is installing at that
 * moment. Every such store must survive the unit's eviction. A timer fires SIGALRM every few
 * tens of microseconds while the main thread walks a large array; the handler adds 1 to a word
 * of the unit being walked and counts its stores in ordinary memory; at the end each word must
 * equal its count. Prints "lost 0" (and on stderr how many stores the handler made). Also
 * catches a runtime thread that takes the program's signals: its handler storing to DLM
 * memory would wait on the fault that thread itself serves. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>

#define UNIT (128UL << 10)
#define UNITS 256

static unsigned long *volatile target;
static volatile unsigned long counts[UNITS];
static volatile int current;
static volatile unsigned long stores, calls;

static void on_alarm(int sig) {
    (void)sig;
    unsigned long *t = (unsigned long *)target;
    calls++;
    if (t) {
        (*t)++;
        counts[current]++;
        stores++;
    }
}

int main(void) {
    unsigned char *a = mmap(NULL, UNITS * UNIT, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED)
        return 2;
    for (size_t i = 0; i < UNITS * UNIT; i += 4096)
        a[i] = (unsigned char)i; /* every page written home once */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 20}, {0, 20}};
    setitimer(ITIMER_REAL, &it, NULL);
    unsigned long sum = 0;
    unsigned long x = 88172645463325252UL;
    for (int step = 0; step < 8 * UNITS; step++) {
        /* Units in a random order: each visit a fault of its own, no read-ahead. */
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int u = (int)(x % UNITS);
        current = u;
        /* The word the handler stores to: near the end of the unit, the fault at its start
         * (a read, so the unit is installed clean). */
        target = (unsigned long *)(a + u * UNIT + UNIT - 64);
        sum += ((volatile unsigned char *)a)[u * UNIT];
        target = NULL;
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    unsigned long lost = 0;
    for (int u = 0; u < UNITS; u++)
        lost += *(unsigned long *)(a + u * UNIT + UNIT - 64) != counts[u];
    printf("lost %lu (sum %lu)\n", lost, sum);
    fprintf(stderr, "sigstore: %lu signal(s), %lu store(s) while a unit was faulted on\n", calls, stores);
    return lost != 0;
}
