/* A C program using the hp_alloc API: allocate, write, check stats, free, reject bad frees. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "pagewise.h"

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "FAILED %s:%d: %s\n", __FILE__, __LINE__, #c); return 1; } } while (0)

int main(void) {
    size_t big = 16u << 20;
    char *p = hp_alloc(big);
    CHECK(p != NULL);
    CHECK(((uintptr_t)p & ((2u << 20) - 1)) == 0);
    memset(p, 0x33, big);
    char *small = hp_alloc(100);
    CHECK(small != NULL && ((uintptr_t)small & 127) == 0);
    CHECK(small + 100 <= p || p + big <= small);
    struct hp_stats s;
    CHECK(hp_stats(&s) == 0);
    CHECK(s.requested_bytes == big + 100);
    CHECK(s.live_allocations == 2);
    CHECK(s.rss_bytes >= big);
    printf("backing %u hugepage_bytes %llu rss_bytes %llu\n", s.backing, (unsigned long long)s.hugepage_bytes,
           (unsigned long long)s.rss_bytes);
    if (s.backing == HP_BACKING_THP || s.backing == HP_BACKING_HUGETLB) CHECK(s.hugepage_bytes >= big / 2);
    CHECK(hp_free(p) == 0);
    CHECK(hp_free(p) == -EINVAL);
    CHECK(hp_free(small + 8) == -EINVAL);
    CHECK(hp_free(small) == 0);
    CHECK(hp_free(NULL) == 0);
    errno = 0;
    CHECK(hp_alloc(0) == NULL && errno == EINVAL);
    CHECK(hp_stats(NULL) == -EINVAL);
    CHECK(hp_stats(&s) == 0 && s.live_allocations == 0 && s.requested_bytes == 0);
    /* A late free of a block whose address was handed out again frees nothing. */
    uint64_t old_tag = 0, new_tag = 0;
    char *t1 = hp_alloc_tagged(200, &old_tag);
    CHECK(t1 != NULL && old_tag != 0);
    CHECK(hp_free_tagged(t1, old_tag) == 0);
    char *t2 = hp_alloc_tagged(200, &new_tag);
    CHECK(t2 != NULL && new_tag != old_tag);
    CHECK(hp_free_tagged(t2, old_tag) == -ESTALE);
    CHECK(hp_stats(&s) == 0 && s.live_allocations == 1);
    CHECK(hp_free_tagged(t2, new_tag) == 0);
    CHECK(hp_alloc_tagged(10, NULL) == NULL && errno == EINVAL);
    printf("C-HP-ALLOC-OK\n");
    return 0;
}
