/* altstack: a thread whose signal stack (sigaltstack) lies in its large malloc'd memory keeps
 * discarding that stack (MADV_DONTNEED) while another thread signals it without pause, as Go's
 * runtime does (each thread's signal stack on its heap, SIGURG to preempt). Each discard is a
 * call into the runtime; a signal delivered as such a call returns from one of its system
 * calls writes its frame onto the discarded stack. Prints "ok" once the two seconds are over;
 * the counts go to stderr. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define STACK (64 * 1024)

static _Atomic long handled;
static _Atomic int done;
static _Atomic pid_t worker_tid;
static char *area;

static void on_signal(int sig) {
    (void)sig;
    handled++;
}

static void *worker(void *arg) {
    (void)arg;
    stack_t ss = {.ss_sp = area, .ss_size = STACK, .ss_flags = 0};
    if (sigaltstack(&ss, NULL) != 0) {
        perror("sigaltstack");
        exit(1);
    }
    worker_tid = (pid_t)syscall(SYS_gettid);
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    unsigned long discards = 0;
    do {
        if (madvise(area, STACK, MADV_DONTNEED) != 0) {
            perror("madvise");
            exit(1);
        }
        discards++;
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 2000000000L);
    done = 1;
    fprintf(stderr, "altstack: %lu discards, %ld signals handled\n", discards, (long)handled);
    return NULL;
}

int main(void) {
    size_t len = 8UL << 20;
    area = aligned_alloc(4096, len); /* page-aligned, as madvise wants */
    if (!area)
        return 1;
    memset(area, 1, len);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_ONSTACK | SA_RESTART;
    sigaction(SIGUSR1, &sa, NULL);
    pthread_t w;
    pthread_create(&w, NULL, worker, NULL);
    while (!worker_tid)
        usleep(100);
    while (!done) {
        syscall(SYS_tgkill, getpid(), worker_tid, SIGUSR1);
        for (volatile int i = 0; i < 500; i++)
            ;
    }
    pthread_join(w, NULL);
    puts("ok");
    return 0;
}
