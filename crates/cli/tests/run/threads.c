/* Four threads fill and sum their slices of one malloc'd array, then each sums its
 * neighbour's slice. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define T 4
static long *arr;
static size_t per;
static long sums[T], cross[T];
static pthread_barrier_t bar;

static void *work(void *arg) {
    long t = (long)arg;
    long *mine = arr + t * per, *next = arr + ((t + 1) % T) * per;
    for (size_t i = 0; i < per; i++) mine[i] = (long)(i * (t + 3)) % 1009;
    for (size_t i = 0; i < per; i++) sums[t] += mine[i];
    pthread_barrier_wait(&bar);
    for (size_t i = 0; i < per; i += 3) cross[t] += next[i];
    return NULL;
}

int main(void) {
    per = (2 << 20) / sizeof(long);
    arr = malloc(T * per * sizeof(long));
    if (!arr) return 2;
    pthread_barrier_init(&bar, NULL, T);
    pthread_t th[T];
    for (long t = 0; t < T; t++) pthread_create(&th[t], NULL, work, (void *)t);
    for (int t = 0; t < T; t++) pthread_join(th[t], NULL);
    for (int t = 0; t < T; t++) printf("thread %d sum=%ld cross=%ld\n", t, sums[t], cross[t]);
    free(arr);
    return 0;
}
