/* hp_alloc: per-data hugepage placement (Pagewise, seed 001).
 *
 * Memory from hp_alloc() comes from the arena's own 2 MiB-aligned regions, which are backed by
 * hugepages: the reserved 2 MiB hugetlb pool when it has room, else THP (MADV_HUGEPAGE on
 * fresh mappings: the first touch of a region faults a hugepage), else MADV_COLLAPSE (Linux
 * 6.1). Nothing else lives in these regions, so data you place here is on hugepages and the
 * rest of your process is not. Freed regions are reused first (they keep their hugepages);
 * beyond PAGEWISE_HP_RETAIN_MB (default 256) they are given back to the kernel.
 *
 * Sizes up to 1 MiB come from power-of-two size classes (64 B .. 1 MiB) and are aligned to
 * their class; larger sizes are rounded up to whole 2 MiB regions and are 2 MiB-aligned.
 * Thread safe. Environment (read at the first call): PAGEWISE_HP_BACKING =
 * auto|hugetlb|thp|collapse|none, PAGEWISE_HP_SEGMENT_MB (default 64, a multiple of 2).
 */
#ifndef PAGEWISE_HP_ALLOC_H
#define PAGEWISE_HP_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HP_BACKING_NONE 0
#define HP_BACKING_THP 1
#define HP_BACKING_COLLAPSE 2
#define HP_BACKING_HUGETLB 3

struct hp_stats {
    uint64_t requested_bytes;   /* bytes asked for, of live allocations */
    uint64_t allocated_bytes;   /* after rounding to size classes / whole regions */
    uint64_t live_allocations;
    uint64_t mapped_bytes;      /* the arena's mappings */
    uint64_t recycled_bytes;    /* freed regions kept (populated) for reuse */
    uint64_t fresh_bytes;       /* never-used (or given back) regions */
    uint64_t hugepage_bytes;    /* AnonHugePages + Private_Hugetlb of the arena, from smaps */
    uint64_t rss_bytes;         /* Rss of the arena, from smaps */
    uint64_t collapse_failures; /* HP_BACKING_COLLAPSE only */
    uint32_t backing;           /* HP_BACKING_* */
    uint32_t reserved;
};

/* size bytes on hugepage-backed memory; NULL with errno EINVAL (0 or absurd size) or ENOMEM. */
void *hp_alloc(size_t size);
/* Return memory from hp_alloc. NULL is a no-op; any other pointer hp_alloc did not return,
 * or one already freed, gives -EINVAL and changes nothing. Like free(3), free each pointer
 * once: the arena reuses addresses, so a second hp_free after the address was handed out
 * again would free the new block. Where a free may come late (finalizers, cleaners, shared
 * owners), use the tagged pair below. */
int hp_free(void *ptr);
/* As hp_alloc, and the allocation's tag in *tag: a number no other allocation of the process
 * ever gets (never 0). NULL with errno EINVAL when tag is NULL. */
void *hp_alloc_tagged(size_t size, uint64_t *tag);
/* Free the allocation at ptr only if it is still the one tagged tag. A stale free (that block
 * was freed and its address handed out again) gives -ESTALE and frees nothing; -EINVAL as
 * hp_free. NULL is a no-op. */
int hp_free_tagged(void *ptr, uint64_t tag);
/* Fill *out (reads /proc/self/smaps). 0 or a negative errno. */
int hp_stats(struct hp_stats *out);

#ifdef __cplusplus
}
#endif

#endif /* PAGEWISE_HP_ALLOC_H */
