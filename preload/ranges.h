/* Sets of disjoint address ranges, sorted, for the preload shim: which parts of the address
 * space are routed into the arena (and to which area each belongs), which are the program's
 * reservations (PROT_NONE, not yet committed), and which blocks the shim's malloc handed out.
 * Pure data structure: no locking (the shim's lock), no system calls; its memory comes from
 * libc's own allocator (never the shim's). */
#ifndef PAGEWISE_PRELOAD_RANGES_H
#define PAGEWISE_PRELOAD_RANGES_H

#include <stddef.h>
#include <stdint.h>

struct pw_range {
    uintptr_t start, end; /* [start, end), start < end */
    uintptr_t tag;        /* routed: the area's start; blocks: the bytes asked for */
};

struct pw_ranges {
    struct pw_range *v; /* sorted by start, disjoint */
    size_t n, cap;
    size_t bytes; /* the ranges' total length */
};

/* Add [start, end) with `tag`; it must not overlap a range of the set. 0, or -ENOMEM. */
int pw_ranges_add(struct pw_ranges *t, uintptr_t start, uintptr_t end, uintptr_t tag);

/* The first range overlapping [lo, hi), clipped to it, into *out: 1, or 0 when none does. */
int pw_ranges_next(const struct pw_ranges *t, uintptr_t lo, uintptr_t hi, struct pw_range *out);

/* The range containing `addr`, unclipped, into *out: 1, or 0 when none does. */
int pw_ranges_containing(const struct pw_ranges *t, uintptr_t addr, struct pw_range *out);

/* The range that starts exactly at `start`, unclipped, into *out (may be NULL): 1 or 0. */
int pw_ranges_at(const struct pw_ranges *t, uintptr_t start, struct pw_range *out);

/* Set the tag of the range starting exactly at `start`: 1, or 0 when there is none. */
int pw_ranges_retag(struct pw_ranges *t, uintptr_t start, uintptr_t tag);

/* Whether some range of tag `tag` overlaps [lo, hi). */
int pw_ranges_any_tagged(const struct pw_ranges *t, uintptr_t lo, uintptr_t hi, uintptr_t tag);

/* Cut [lo, hi) out of the set: ranges inside it go, ranges across its ends are trimmed, a
 * range around it is split in two (keeping its tag). 0, or -ENOMEM (then nothing changed). */
int pw_ranges_remove(struct pw_ranges *t, uintptr_t lo, uintptr_t hi);

/* Empty the set (keeping its memory). */
void pw_ranges_clear(struct pw_ranges *t);

#endif
