/* A C program using the dlm_* API: integrity of a 64 MiB area with 4 MiB local memory, a set
 * count change, stats, fork (the child never touches the parent's runtime; the parent loses
 * nothing), the calls on part of an area (discard, unmap, detach), and the error convention.
 * Prints "C-DLM-OK" and exits 0 on success. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pagewise.h"

#define CHECK(cond, ...)                                  \
    do {                                                  \
        if (!(cond)) {                                    \
            fprintf(stderr, "FAILED %s: ", #cond);        \
            fprintf(stderr, __VA_ARGS__);                 \
            fprintf(stderr, "\n");                        \
            return 1;                                     \
        }                                                 \
    } while (0)

#include <stdlib.h>

int main(void) {
    /* A secret the servers do not share: refused at connect, and nothing is started. */
    struct dlm_config wrong = {0};
    wrong.servers = getenv("PAGEWISE_DLM_SERVERS");
    wrong.fault_mode = DLM_FAULT_AUTO;
    wrong.readahead = -1;
    wrong.secret = "not the servers' secret, long enough";
    int rc = dlm_init(&wrong);
    CHECK(rc == -EACCES, "a wrong secret must be -EACCES: %d", rc);
    wrong.secret = "short";
    CHECK(dlm_init(&wrong) == -EINVAL, "a short secret must be -EINVAL");

    rc = dlm_init(NULL); /* PAGEWISE_DLM_* from the environment, PAGEWISE_DLM_SECRET too */
    CHECK(rc == 0, "dlm_init: %d", rc);
    CHECK(dlm_init(NULL) == -EBUSY, "second init must be -EBUSY");

    size_t len = 64u << 20;
    uint64_t *a = NULL;
    rc = dlm_alloc(len, (void **)&a);
    CHECK(rc == 0 && a != NULL, "dlm_alloc: %d", rc);
    size_t words = len / 8;
    for (size_t i = 0; i < words; i += 512)
        a[i] = i * 2654435761u + 1;
    CHECK(dlm_set_count(3) == -EINVAL, "set count 3 must be refused");
    CHECK(dlm_set_count(2) == 0, "set count 2");
    for (size_t i = 0; i < words; i += 512)
        CHECK(a[i] == i * 2654435761u + 1, "word %zu: %llu", i, (unsigned long long)a[i]);
    for (size_t i = 256; i < words; i += 4096)
        a[i] ^= 0xffff;
    CHECK(dlm_set_count(8) == 0, "set count 8");
    for (size_t i = 256; i < words; i += 4096)
        CHECK(a[i] == 0xffff, "word %zu after xor: %llu", i, (unsigned long long)a[i]);

    struct dlm_stats st;
    memset(&st, 0, sizeof st);
    CHECK(dlm_stats(&st) == 0, "dlm_stats");
    CHECK(st.peak_resident_bytes <= st.local_limit, "resident %llu over %llu",
          (unsigned long long)st.peak_resident_bytes, (unsigned long long)st.local_limit);
    CHECK(st.evictions > 0 && st.writebacks > 0 && st.fetched_units > 0, "no paging happened");
    CHECK(st.set_count == 8 && st.base_page == 16384, "set %u base %llu", st.set_count,
          (unsigned long long)st.base_page);
    printf("mode %d faults %llu evictions %llu writebacks %llu\n", st.mode, (unsigned long long)st.faults,
           (unsigned long long)st.evictions, (unsigned long long)st.writebacks);

    /* A measured loop: dlm_start/dlm_end return the loop's unit size in KiB; the decision log
     * is JSON with the seed's table. */
    CHECK(dlm_end(5) == -EINVAL, "dlm_end without dlm_start");
    CHECK(dlm_start(5) == 0, "dlm_start");
    CHECK(dlm_start(6) == -EINVAL, "loops do not nest");
    uint64_t sum = 0;
    for (size_t i = 0; i < words; i += 512)
        sum += a[i];
    rc = dlm_end(5);
    CHECK(rc >= 16 && rc <= 128, "dlm_end: unit %d KiB", rc);
    long need = dlm_decisions_json(NULL, 0);
    char json[4096];
    CHECK(need > 0 && need < (long)sizeof json, "decisions length %ld", need);
    CHECK(dlm_decisions_json(json, sizeof json) == need && strstr(json, "\"loop_id\":5") && strstr(json, "table"),
          "decisions: %s", json);
    printf("loop unit %d KiB, sum %llu\n", rc, (unsigned long long)sum);

    /* fork: DLM memory is not inherited and the runtime is the parent's; the child's calls
     * are refused without a word on the parent's connections, and the parent's data, resident
     * or not, is intact after the child is gone. */
    pid_t child = fork();
    CHECK(child >= 0, "fork");
    if (child == 0) {
        void *q = NULL;
        int ok = dlm_alloc(1 << 20, &q) == -ECHILD && dlm_free(a) == -ECHILD && dlm_discard(a, 4096) == -ECHILD &&
                 dlm_stats(&st) == -ECHILD && dlm_shutdown() == -ECHILD;
        exit(ok ? 0 : 3);
    }
    int status = 0;
    CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "the child's calls were not refused (status %d)", status);
    for (size_t i = 0; i < words; i += 512)
        CHECK(a[i] == ((i % 4096 == 256) ? 0xffff : i * 2654435761u + 1), "word %zu after fork", i);

    /* Calls on part of an area: a discarded range reads as zeros (also mid-page), an unmapped
     * one is gone, a detached one keeps its data as plain memory that mprotect can make
     * read-only. */
    size_t page = 4096;
    CHECK(dlm_discard(a + 512 * 3 + 7, 3 * page) == 0, "dlm_discard");
    CHECK(a[1536] == (size_t)1536 * 2654435761u + 1 && a[3584] == (size_t)3584 * 2654435761u + 1,
          "words around the discard");
    for (size_t i = 512 * 3 + 7; i < 512 * 3 + 7 + 3 * 512; i++)
        CHECK(a[i] == 0, "discarded word %zu: %llu", i, (unsigned long long)a[i]);
    char *bytes = (char *)a;
    rc = dlm_unmap(bytes + 16 * page, 8 * page);
    CHECK(rc == 0, "dlm_unmap: %d", rc);
    unsigned char vec[8];
    CHECK(mincore(bytes + 16 * page, 8 * page, vec) == -1 && errno == ENOMEM, "unmapped range still mapped");
    CHECK(dlm_detach(bytes + 64 * page, 16 * page) == 0, "dlm_detach");
    CHECK(mprotect(bytes + 64 * page, 16 * page, PROT_READ) == 0, "mprotect of detached memory");
    for (size_t i = 64 * 512; i < 80 * 512; i += 512)
        CHECK(a[i] == ((i % 4096 == 256) ? 0xffff : i * 2654435761u + 1), "detached word %zu", i);
    CHECK(mprotect(bytes + 64 * page, 16 * page, PROT_READ | PROT_WRITE) == 0, "mprotect back");

    int x;
    CHECK(dlm_free(&x) == -EINVAL, "freeing a non-DLM pointer must be -EINVAL");
    CHECK(dlm_free(a) == 0, "dlm_free");
    CHECK(dlm_alloc(0, (void **)&a) == -EINVAL, "zero-length alloc");
    CHECK(dlm_shutdown() == 0, "dlm_shutdown");
    CHECK(dlm_shutdown() == -ENODEV, "shutdown twice");

    struct dlm_config bad = {0};
    bad.servers = "127.0.0.1:1";
    bad.page_size = 5000;
    CHECK(dlm_init(&bad) == -EINVAL, "bad page size must be -EINVAL");
    printf("C-DLM-OK\n");
    return 0;
}
