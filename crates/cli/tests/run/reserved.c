/* Reservations (PROT_NONE mappings) under the shim's bookkeeping:
 * - one committed in part, unmapped whole, and its address range mapped again: the shim must
 *   forget the whole reservation, not just the part after the routed one, or a later mprotect
 *   of the new mappings takes DLM's pages for the old reservation and protects them behind
 *   DLM's back (its next eviction of them fails);
 * - one with a page moved out by mremap(MREMAP_DONTUNMAP), which leaves the page where it was,
 *   then committed whole: one mapping to the kernel, so mremap of all of it succeeds (it must
 *   not be routed in two pieces around a plain page);
 * - one whose middle is shrunk in place by mremap (its tail unmapped), then committed across
 *   the point where the shrunk part began: the kernel keeps what is left one mapping, so an
 *   mremap of a range across that point succeeds (the shim forgot the shrunk part's rest and
 *   committed it as plain memory beside a routed head: EFAULT; found by the model program,
 *   seed 1012432 with --min-alloc 16K).
 * Prints checksums, the number of userfaultfd-armed mappings left without write permission (0:
 * nothing protected behind DLM's back), the second mremap's result and "ok". */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif
#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

#define PAGE 4096UL
#define HALF (512UL << 10)

static uint64_t fill(uint8_t *p, size_t n, uint8_t seed) {
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        p[i] = (uint8_t)(i * 7 + seed);
        sum = sum * 31 + p[i];
    }
    return sum;
}

static uint64_t checksum(const uint8_t *p, size_t n) {
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++)
        sum = sum * 31 + p[i];
    return sum;
}

/* Mappings armed for userfaultfd missing faults (VmFlags "um", DLM's views) that cannot be
 * written. */
static int armed_read_only(void) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return -1;
    char line[512], perms[8] = "";
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3)
            continue;
        if (strncmp(line, "VmFlags:", 8) == 0 && strstr(line, " um") && perms[1] != 'w')
            n++;
    }
    fclose(f);
    return n;
}

int main(void) {
    uint8_t *r = mmap(NULL, 2 * HALF, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED || mprotect(r + HALF, HALF, PROT_READ | PROT_WRITE) != 0)
        return 2;
    uint64_t committed = fill(r + HALF, HALF, 1);
    if (munmap(r, 2 * HALF) != 0)
        return 2;
    /* A small plain mapping where the reservation began, a large one after it. */
    uint8_t *a = mmap(r, 2 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    uint8_t *b = mmap(r + 2 * PAGE, 2 * HALF - 2 * PAGE, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (a != r || b != r + 2 * PAGE)
        return 3;
    uint64_t written = fill(r, 2 * HALF, 2);
    if (mprotect(r, 2 * HALF, PROT_READ) != 0)
        return 4;
    printf("committed %016llx written %016llx read %016llx\n", (unsigned long long)committed,
           (unsigned long long)written, (unsigned long long)checksum(r, 2 * HALF));
    printf("armed mappings without write permission: %d\n", armed_read_only());
    if (munmap(r, 2 * HALF) != 0)
        return 5;

    uint8_t *s = mmap(NULL, 2 * HALF, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED)
        return 6;
    void *moved = mremap(s + HALF - PAGE, PAGE, PAGE, MREMAP_MAYMOVE | MREMAP_DONTUNMAP, NULL);
    printf("mremap(MREMAP_DONTUNMAP) of a reserved page: %s\n", moved == MAP_FAILED ? strerror(errno) : "moved");
    if (mprotect(s, 2 * HALF, PROT_READ | PROT_WRITE) != 0)
        return 7;
    written = fill(s, 2 * HALF, 3);
    uint8_t *grown = mremap(s, 2 * HALF, 3 * HALF, MREMAP_MAYMOVE);
    if (grown == MAP_FAILED) {
        perror("mremap of the committed reservation");
    } else {
        printf("grown: written %016llx read %016llx\n", (unsigned long long)written,
               (unsigned long long)checksum(grown, 2 * HALF));
        munmap(grown, 3 * HALF);
    }
    if (moved != MAP_FAILED)
        munmap(moved, PAGE);

    uint8_t *t = mmap(NULL, 4 * HALF, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (t == MAP_FAILED)
        return 8;
    /* [HALF, 3*HALF) shrunk to its first half: [2*HALF, 3*HALF) unmapped. */
    if (mremap(t + HALF, 2 * HALF, HALF, 0) != t + HALF)
        return 9;
    if (mprotect(t, 2 * HALF, PROT_READ | PROT_WRITE) != 0)
        return 10;
    fill(t, 2 * HALF, 4);
    uint64_t piece = checksum(t + HALF / 2, HALF);
    uint8_t *across = mremap(t + HALF / 2, HALF, 2 * HALF, MREMAP_MAYMOVE);
    if (across == MAP_FAILED) {
        perror("mremap across the shrunk reservation's old start");
    } else {
        printf("across: written %016llx read %016llx\n", (unsigned long long)piece,
               (unsigned long long)checksum(across, HALF));
        munmap(across, 2 * HALF);
    }
    munmap(t, 4 * HALF);
    printf("ok\n");
    return 0;
}
