/* A model-based check of Linux memory semantics, run plain and under `pagewise run` /
 * `pagewise hps run`: random sequences of the calls allocators and runtimes make on their
 * memory — mmap (no address, hint, MAP_FIXED, MAP_FIXED_NOREPLACE, PROT_NONE reservations
 * committed later), munmap of any part, mremap in every form, mprotect, madvise with every
 * advice, aligned_alloc/realloc/free — with writes, and a digest of all readable memory.
 * Everything printed depends only on the seed and on what Linux guarantees, never on
 * addresses: the outputs of two runs must be identical.
 *
 * What Linux does not fix is left out: where the kernel places a mapping (so mremap growing in
 * place without MREMAP_MAYMOVE, whose success depends on the neighbours, is not asked), and
 * the content of pages after MADV_FREE (old data or zeros: such pages are left out of digests
 * until they are written whole again).
 *
 * Usage: model FIRST_SEED COUNT [OPS_PER_SEQUENCE]. Prints one line per operation that has a
 * result and one digest line per sequence; exits 0.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

#define PAGE 4096UL
#define SLOTS 8
#define MAX_PAGES 48

enum kind { NONE, MAPPED, BLOCK };

struct region {
    enum kind kind;
    unsigned char *p;
    size_t pages;
    /* per page: mapped, protection (PROT_*), defined content */
    unsigned char mapped[MAX_PAGES * 2], prot[MAX_PAGES * 2], defined[MAX_PAGES * 2];
    /* per page: the call that made its mapping what it is (mmap, MAP_FIXED, mprotect,
     * advice that changes the mapping's flags): pages of one segment lie in one kernel
     * mapping (VMA), which is what mremap asks of its range. */
    unsigned seg[MAX_PAGES * 2];
};
static unsigned segs;

static struct region R[SLOTS];
static uint64_t rng;

static uint64_t next(void) {
    uint64_t z = (rng += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static size_t pick(size_t n) { return (size_t)(next() % n); }

static int op_no;
static void result(const char *what, long ok) {
    printf("%d %s %s\n", op_no, what, ok >= 0 ? "ok" : strerror(errno));
}

static int all_mapped(struct region *r, size_t a, size_t n) {
    for (size_t i = a; i < a + n; i++)
        if (!r->mapped[i])
            return 0;
    return 1;
}

static void fresh(struct region *r, enum kind k, unsigned char *p, size_t pages, int prot) {
    r->kind = k;
    r->p = p;
    r->pages = pages;
    segs++;
    for (size_t i = 0; i < pages; i++) {
        r->mapped[i] = 1;
        r->prot[i] = (unsigned char)prot;
        r->defined[i] = 1;
        r->seg[i] = segs;
    }
}

static void new_segment(struct region *r, size_t a, size_t n) {
    segs++;
    for (size_t i = a; i < a + n; i++)
        r->seg[i] = segs;
}

/* A call changed pages [a, a+n) of the mappings they lie in: those mappings are cut at its
 * ends; pages of different mappings stay in different ones. */
static void split_segments(struct region *r, size_t a, size_t n) {
    for (size_t i = a; i < a + n; i++) {
        unsigned old = r->seg[i];
        segs++;
        size_t k = i;
        while (k < a + n && r->seg[k] == old)
            r->seg[k++] = segs;
        i = k - 1;
    }
}


/* A random live region of the given kind (0: any), or NULL. */
static struct region *some(enum kind k) {
    size_t s = pick(SLOTS);
    for (size_t i = 0; i < SLOTS; i++) {
        struct region *r = &R[(s + i) % SLOTS];
        if (r->kind != NONE && (k == NONE || r->kind == k))
            return r;
    }
    return NULL;
}

static struct region *empty(void) {
    for (size_t i = 0; i < SLOTS; i++)
        if (R[i].kind == NONE)
            return &R[i];
    return NULL;
}

/* A sub-range [a, a+n) of r's pages. */
static void sub(struct region *r, size_t *a, size_t *n) {
    *a = pick(r->pages);
    *n = 1 + pick(r->pages - *a);
}

/* A sub-range of r's pages that are all still mapped, or 0: a program calls munmap,
 * mprotect, madvise and MAP_FIXED on memory it owns, never on a hole it gave back (which the
 * kernel may have given to someone else since). */
static int owned(struct region *r, size_t *a, size_t *n) {
    sub(r, a, n);
    return all_mapped(r, *a, *n);
}

static uint64_t digest(void) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t s = 0; s < SLOTS; s++) {
        struct region *r = &R[s];
        if (r->kind == NONE)
            continue;
        for (size_t i = 0; i < r->pages; i++) {
            h = (h ^ (s * 131 + i)) * 1099511628211ULL;
            if (!r->mapped[i] || !(r->prot[i] & PROT_READ) || !r->defined[i])
                continue;
            const uint64_t *w = (const uint64_t *)(r->p + i * PAGE);
            for (size_t k = 0; k < PAGE / 8; k++)
                h = (h ^ w[k]) * 1099511628211ULL;
        }
    }
    return h;
}

static void do_write(void) {
    struct region *r = some(NONE);
    if (!r)
        return;
    size_t a, n;
    sub(r, &a, &n);
    for (size_t i = a; i < a + n; i++)
        if (!r->mapped[i] || !(r->prot[i] & PROT_WRITE))
            return;
    size_t from = a * PAGE + pick(PAGE), to = (a + n) * PAGE - pick(PAGE);
    if (to <= from)
        return;
    uint64_t v = next();
    for (size_t x = from; x < to; x++)
        r->p[x] = (unsigned char)(v + x * 7 + (x >> 12));
    for (size_t i = a; i < a + n; i++)
        if (from <= i * PAGE && to >= (i + 1) * PAGE)
            r->defined[i] = 1;
}

static void do_map(void) {
    struct region *r = empty();
    if (!r)
        return;
    size_t pages = 4 + pick(MAX_PAGES - 4);
    size_t len = pages * PAGE;
    int flavour = (int)pick(4);
    unsigned char *p;
    if (flavour == 3) {
        /* A reservation, committed now or later. */
        p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        result("reserve", p == MAP_FAILED ? -1 : 0);
        if (p != MAP_FAILED)
            fresh(r, MAPPED, p, pages, PROT_NONE);
        return;
    }
    void *hint = flavour == 1 ? (void *)(0x600000000000UL + pick(1 << 20) * PAGE) : NULL;
    p = mmap(hint, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | (flavour == 2 ? MAP_NORESERVE : 0),
             -1, 0);
    result("mmap", p == MAP_FAILED ? -1 : 0);
    if (p != MAP_FAILED)
        fresh(r, MAPPED, p, pages, PROT_READ | PROT_WRITE);
}

/* MAP_FIXED over part of a region: zeros, read-write (or a commit of a reservation). */
static void do_map_fixed(void) {
    struct region *r = some(MAPPED);
    size_t a, n;
    if (!r || !owned(r, &a, &n))
        return;
    int prot = pick(4) == 0 ? PROT_NONE : PROT_READ | PROT_WRITE;
    if (pick(5) == 0) {
        /* Over the program's own pages: EEXIST. */
        void *q = mmap(r->p + a * PAGE, n * PAGE, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        result("noreplace", q == MAP_FAILED ? -1 : 0);
        if (q != MAP_FAILED)
            munmap(q, n * PAGE); /* not expected; an old kernel took it as a hint */
        return;
    } else {
        void *q = mmap(r->p + a * PAGE, n * PAGE, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        result("fixed", q == MAP_FAILED ? -1 : 0);
        if (q == MAP_FAILED)
            return;
    }
    for (size_t i = a; i < a + n; i++) {
        r->mapped[i] = 1;
        r->prot[i] = (unsigned char)prot;
        r->defined[i] = 1;
    }
    new_segment(r, a, n);
}

static void do_unmap(void) {
    struct region *r = some(MAPPED);
    size_t a, n;
    if (!r || !owned(r, &a, &n))
        return;
    result("munmap", munmap(r->p + a * PAGE, n * PAGE));
    for (size_t i = a; i < a + n; i++)
        r->mapped[i] = 0;
    for (size_t i = 0; i < r->pages; i++)
        if (r->mapped[i])
            return;
    r->kind = NONE;
}

static void do_mprotect(void) {
    struct region *r = some(NONE);
    size_t a, n;
    if (!r || !owned(r, &a, &n))
        return;
    static const int prots[] = {PROT_NONE, PROT_READ, PROT_READ | PROT_WRITE, PROT_READ | PROT_WRITE};
    int prot = prots[pick(4)];
    int rc = mprotect(r->p + a * PAGE, n * PAGE, prot);
    result("mprotect", rc);
    if (rc == 0)
        for (size_t i = a; i < a + n; i++)
            r->prot[i] = (unsigned char)prot;
    split_segments(r, a, n);
}

static void do_madvise(void) {
    static const int advice[] = {MADV_DONTNEED, MADV_DONTNEED, MADV_FREE, MADV_REMOVE, MADV_WILLNEED,
                                 MADV_SEQUENTIAL, MADV_RANDOM, MADV_NORMAL, MADV_HUGEPAGE, MADV_NOHUGEPAGE,
                                 MADV_COLD, MADV_PAGEOUT, MADV_DONTDUMP, MADV_DODUMP, MADV_DONTFORK,
                                 MADV_DOFORK, 22 /* POPULATE_READ */, 23 /* POPULATE_WRITE */, 999};
    struct region *r = some(NONE);
    size_t a, n;
    if (!r || !owned(r, &a, &n))
        return;
    int adv = advice[pick(sizeof advice / sizeof *advice)];
    if (adv == 22 || adv == 23)
        for (size_t i = a; i < a + n; i++)
            if (r->prot[i] != (PROT_READ | PROT_WRITE))
                return;
    int rc = madvise(r->p + a * PAGE, n * PAGE, adv);
    char what[32];
    snprintf(what, sizeof what, "madvise(%d)", adv);
    result(what, rc);
    if (adv != MADV_DONTNEED && adv != MADV_FREE && adv != MADV_WILLNEED && adv != MADV_COLD && adv != MADV_PAGEOUT &&
        adv != 22 && adv != 23)
        split_segments(r, a, n); /* the advice changes the mappings' flags: the kernel cuts them */
    for (size_t i = a; i < a + n; i++) {
        if (adv == MADV_DONTNEED && rc == 0)
            r->defined[i] = 1; /* zeros */
        if (adv == MADV_FREE)
            r->defined[i] = 0; /* old data or zeros */
    }
}

static void do_mremap(void) {
    struct region *r = some(MAPPED);
    size_t a, n;
    if (!r || !owned(r, &a, &n))
        return;
    for (size_t i = a; i < a + n; i++)
        if (r->seg[i] != r->seg[a])
            return; /* several mappings: EFAULT or not, as the kernel merged them; not asked */
    int form = (int)pick(4);
    struct region *t = empty();
    if (!t)
        return;
    size_t new_pages = form == 0 ? 1 + pick(n) : form == 3 ? n : n + pick(MAX_PAGES - n + 1);
    if (new_pages > MAX_PAGES)
        new_pages = MAX_PAGES;
    int flags = form == 0 ? 0 : MREMAP_MAYMOVE;
    void *target = NULL;
    struct region *over = NULL;
    if (form == 2) {
        /* MREMAP_FIXED onto the start of another region, replacing its pages there. */
        over = some(MAPPED);
        if (!over || over == r || over->pages < new_pages || !all_mapped(over, 0, new_pages))
            return;
        flags |= MREMAP_FIXED;
        target = over->p;
    }
    if (form == 3)
        flags |= MREMAP_DONTUNMAP;
    unsigned char *q = mremap(r->p + a * PAGE, n * PAGE, new_pages * PAGE, flags, target);
    result("mremap", q == MAP_FAILED ? -1 : 0);
    if (q == MAP_FAILED)
        return;
    unsigned char prot = r->prot[a];
    struct region moved = {0};
    fresh(&moved, MAPPED, q, new_pages, prot);
    for (size_t i = 0; i < new_pages; i++)
        moved.defined[i] = i < n ? r->defined[a + i] : 1;
    if (form == 0) {
        /* Shrunk in place: the tail is gone. */
        for (size_t i = a + new_pages; i < a + n; i++)
            r->mapped[i] = 0;
        return;
    }
    if (over)
        for (size_t i = 0; i < new_pages; i++)
            over->mapped[i] = 0;
    for (size_t i = a; i < a + n; i++) {
        if (form == 3)
            r->defined[i] = 1; /* left mapped, empty: zeros */
        else
            r->mapped[i] = 0;
    }
    *t = moved;
    for (struct region *x = R; x < R + SLOTS; x++) {
        if (x->kind != MAPPED)
            continue;
        int any = 0;
        for (size_t i = 0; i < x->pages; i++)
            any |= x->mapped[i];
        if (!any)
            x->kind = NONE;
    }
}

static void do_block(void) {
    struct region *r = some(BLOCK);
    if (!r || pick(3) == 0) {
        r = empty();
        if (!r)
            return;
        size_t pages = 1 + pick(MAX_PAGES);
        int zeroed = pick(2);
        unsigned char *p = zeroed ? calloc(pages, PAGE) : aligned_alloc(PAGE, pages * PAGE);
        if (p && !zeroed)
            memset(p, 0, pages * PAGE); /* malloc's memory is not zeroed: the model's is */
        if (!p || ((uintptr_t)p & (PAGE - 1))) {
            /* calloc need not be page-aligned: then only its bytes are compared (no madvise). */
            if (p)
                free(p);
            p = aligned_alloc(PAGE, pages * PAGE);
            memset(p, 0, pages * PAGE);
        }
        result("alloc", p ? 0 : -1);
        if (p)
            fresh(r, BLOCK, p, pages, PROT_READ | PROT_WRITE);
        return;
    }
    for (size_t i = 0; i < r->pages; i++)
        if (r->prot[i] != (PROT_READ | PROT_WRITE) && mprotect(r->p + i * PAGE, PAGE, PROT_READ | PROT_WRITE) == 0)
            r->prot[i] = PROT_READ | PROT_WRITE;
    if (pick(2)) {
        size_t pages = 1 + pick(MAX_PAGES);
        unsigned char *q = realloc(r->p, pages * PAGE);
        result("realloc", q ? 0 : -1);
        if (!q)
            return;
        /* realloc keeps the bytes, not the page alignment: compare bytes, page by page. */
        size_t keep = pages < r->pages ? pages : r->pages;
        unsigned char *aligned = aligned_alloc(PAGE, pages * PAGE);
        memcpy(aligned, q, keep * PAGE);
        memset(aligned + keep * PAGE, 0, (pages - keep) * PAGE);
        free(q);
        struct region old = *r;
        fresh(r, BLOCK, aligned, pages, PROT_READ | PROT_WRITE);
        for (size_t i = 0; i < keep; i++)
            r->defined[i] = old.defined[i];
    } else {
        free(r->p);
        r->kind = NONE;
    }
}

static void clear_all(void) {
    for (size_t s = 0; s < SLOTS; s++) {
        struct region *r = &R[s];
        if (r->kind == MAPPED) {
            for (size_t i = 0; i < r->pages; i++)
                if (r->mapped[i])
                    munmap(r->p + i * PAGE, PAGE);
        } else if (r->kind == BLOCK) {
            for (size_t i = 0; i < r->pages; i++)
                if (r->prot[i] != (PROT_READ | PROT_WRITE))
                    mprotect(r->p + i * PAGE, PAGE, PROT_READ | PROT_WRITE);
            free(r->p);
        }
        r->kind = NONE;
    }
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: model FIRST_SEED COUNT [OPS]\n");
        return 2;
    }
    unsigned long first = strtoul(argv[1], NULL, 10), count = strtoul(argv[2], NULL, 10);
    int ops = argc > 3 ? atoi(argv[3]) : 40;
    setvbuf(stdout, NULL, _IOFBF, 1 << 16);
    for (unsigned long s = first; s < first + count; s++) {
        rng = s * 0x2545F4914F6CDD1DULL + 1;
        printf("seq %lu\n", s);
        /* Out before the sequence runs: a run that dies in it names it (tests/model.rs). */
        fflush(stdout);
        for (op_no = 0; op_no < ops; op_no++) {
            switch (pick(10)) {
            case 0: do_map(); break;
            case 1: do_map_fixed(); break;
            case 2: do_unmap(); break;
            case 3: do_mprotect(); break;
            case 4: do_madvise(); break;
            case 5: do_mremap(); break;
            case 6: do_block(); break;
            default: do_write(); break;
            }
            if (op_no % 8 == 7)
                printf("%d digest %016llx\n", op_no, (unsigned long long)digest());
        }
        printf("end digest %016llx\n", (unsigned long long)digest());
        clear_all();
    }
    return 0;
}
