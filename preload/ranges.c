/* Sets of disjoint address ranges (ranges.h). Lookups are binary searches; adding or cutting
 * moves the tail of the array, which is cheap next to the system calls that go with it. */
#include "ranges.h"

#include <errno.h>
#include <string.h>

extern void *__libc_realloc(void *, size_t);

/* Index of the first range whose end is above `addr` (t->n when none is). */
static size_t first_ending_after(const struct pw_ranges *t, uintptr_t addr) {
    size_t lo = 0, hi = t->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t->v[mid].end <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int reserve(struct pw_ranges *t, size_t more) {
    if (t->n + more <= t->cap)
        return 0;
    size_t cap = t->cap ? t->cap * 2 : 64;
    while (cap < t->n + more)
        cap *= 2;
    struct pw_range *v = __libc_realloc(t->v, cap * sizeof *v);
    if (!v)
        return -ENOMEM;
    t->v = v;
    t->cap = cap;
    return 0;
}

int pw_ranges_add(struct pw_ranges *t, uintptr_t start, uintptr_t end, uintptr_t tag) {
    if (reserve(t, 1) < 0)
        return -ENOMEM;
    size_t i = first_ending_after(t, start);
    memmove(&t->v[i + 1], &t->v[i], (t->n - i) * sizeof *t->v);
    t->v[i] = (struct pw_range){start, end, tag};
    t->n++;
    t->bytes += end - start;
    return 0;
}

int pw_ranges_next(const struct pw_ranges *t, uintptr_t lo, uintptr_t hi, struct pw_range *out) {
    size_t i = first_ending_after(t, lo);
    if (i == t->n || t->v[i].start >= hi)
        return 0;
    *out = t->v[i];
    if (out->start < lo)
        out->start = lo;
    if (out->end > hi)
        out->end = hi;
    return 1;
}

int pw_ranges_containing(const struct pw_ranges *t, uintptr_t addr, struct pw_range *out) {
    size_t i = first_ending_after(t, addr);
    if (i == t->n || t->v[i].start > addr)
        return 0;
    *out = t->v[i];
    return 1;
}

int pw_ranges_at(const struct pw_ranges *t, uintptr_t start, struct pw_range *out) {
    size_t i = first_ending_after(t, start);
    if (i == t->n || t->v[i].start != start)
        return 0;
    if (out)
        *out = t->v[i];
    return 1;
}

int pw_ranges_retag(struct pw_ranges *t, uintptr_t start, uintptr_t tag) {
    size_t i = first_ending_after(t, start);
    if (i == t->n || t->v[i].start != start)
        return 0;
    t->v[i].tag = tag;
    return 1;
}

int pw_ranges_any_tagged(const struct pw_ranges *t, uintptr_t lo, uintptr_t hi, uintptr_t tag) {
    for (size_t i = first_ending_after(t, lo); i < t->n && t->v[i].start < hi; i++)
        if (t->v[i].tag == tag)
            return 1;
    return 0;
}

int pw_ranges_remove(struct pw_ranges *t, uintptr_t lo, uintptr_t hi) {
    size_t i = first_ending_after(t, lo);
    if (i == t->n || t->v[i].start >= hi)
        return 0;
    struct pw_range *r = &t->v[i];
    if (r->start < lo && r->end > hi) {
        /* Split around [lo, hi). */
        if (reserve(t, 1) < 0)
            return -ENOMEM;
        r = &t->v[i];
        memmove(&t->v[i + 2], &t->v[i + 1], (t->n - i - 1) * sizeof *t->v);
        t->v[i + 1] = (struct pw_range){hi, r->end, r->tag};
        r->end = lo;
        t->n++;
        t->bytes -= hi - lo;
        return 0;
    }
    if (r->start < lo) {
        t->bytes -= r->end - lo;
        r->end = lo;
        i++;
    }
    size_t j = i;
    while (j < t->n && t->v[j].end <= hi) {
        t->bytes -= t->v[j].end - t->v[j].start;
        j++;
    }
    /* [i, j) lie wholly inside [lo, hi); v[j], if it starts below hi, loses its head. */
    if (j < t->n && t->v[j].start < hi) {
        t->bytes -= hi - t->v[j].start;
        t->v[j].start = hi;
    }
    memmove(&t->v[i], &t->v[j], (t->n - j) * sizeof *t->v);
    t->n -= j - i;
    return 0;
}

void pw_ranges_clear(struct pw_ranges *t) {
    t->n = 0;
    t->bytes = 0;
}
