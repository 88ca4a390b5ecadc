/* --bss: the main executable's zero-initialised data, its whole pages, into the arena
 * (`pagewise run --bss`). Runs in the shim's constructor, before the program's main.
 *
 * What is there already is kept: copy relocations put objects of shared libraries into the
 * executable's .bss (`environ`, `stdout`, `optarg`...), which libc reads and writes, and
 * constructors may have written more. Every page that is not all zeros is saved first and
 * written back after the area replaced the pages. Each page is read to find out — not asked
 * of mincore(2): a page that is not resident may be swapped out, not zero. Between the
 * replacement and the write-back nothing may read those objects, so the arena prepares the
 * area fully (servers, mappings of its own) before it maps over the pages, and the window
 * holds only that mapping and its registration (`Dlm::alloc_at`).
 */
#define _GNU_SOURCE
#include <elf.h>
#include <errno.h>
#include <link.h>
#include <string.h>

#include "shim.h"

extern void *__libc_malloc(size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);

struct bss {
    uintptr_t start, end;
};

static int find_bss(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    struct bss *out = data;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_W) && ph->p_memsz > ph->p_filesz) {
            uintptr_t zero = info->dlpi_addr + ph->p_vaddr + ph->p_filesz;
            out->start = pw_page_up(zero);
            out->end = pw_page_up(info->dlpi_addr + ph->p_vaddr + ph->p_memsz);
        }
    }
    return 1; /* the first object is the main program */
}

static int all_zero(const unsigned long *w) {
    for (size_t k = 0; k < PW_PAGE / sizeof *w; k++)
        if (w[k])
            return 0;
    return 1;
}

void pw_route_bss(void) {
    struct bss z = {0, 0};
    dl_iterate_phdr(find_bss, &z);
    if (z.end <= z.start || z.end - z.start < pw_min_alloc) {
        pw_note("pagewise: --bss: the program's zero-initialised data (%zu bytes in whole pages) is below "
                "--min-alloc; left in place\n", (size_t)(z.end > z.start ? z.end - z.start : 0));
        return;
    }
    if (!pw_arena->alloc_at) {
        pw_note("pagewise: --bss: the %s arena cannot map at a fixed address\n", pw_arena->name);
        return;
    }
    size_t len = z.end - z.start, pages = len / PW_PAGE;
    unsigned char *saved = NULL;
    size_t nsaved = 0, *which = NULL;
    for (size_t i = 0; i < pages; i++) {
        const unsigned long *w = (const unsigned long *)(z.start + i * PW_PAGE);
        if (all_zero(w))
            continue;
        unsigned char *s = __libc_realloc(saved, (nsaved + 1) * PW_PAGE);
        size_t *k = s ? __libc_realloc(which, (nsaved + 1) * sizeof *which) : NULL;
        if (s)
            saved = s;
        if (!k) {
            pw_note("pagewise: --bss: out of memory saving the program's static data; left in place\n");
            __libc_free(saved);
            __libc_free(which);
            return;
        }
        which = k;
        memcpy(saved + nsaved * PW_PAGE, w, PW_PAGE);
        which[nsaved++] = i;
    }
    sigset_t signals;
    pw_runtime_enter(&signals);
    void *p = pw_arena->alloc_at((void *)z.start, len);
    pw_runtime_leave(&signals);
    if (p)
        for (size_t i = 0; i < nsaved; i++)
            memcpy((void *)(z.start + which[i] * PW_PAGE), saved + i * PW_PAGE, PW_PAGE);
    __libc_free(saved);
    __libc_free(which);
    if (!p) {
        pw_note("pagewise: --bss: the %s arena could not take %zu bytes at %p (%s); left in place\n", pw_arena->name,
                len, (void *)z.start, strerror(errno));
        return;
    }
    pthread_mutex_lock(&pw_lock);
    pw_ranges_add(&pw_routed, z.start, z.end, z.start);
    pw_tables_changed();
    pthread_mutex_unlock(&pw_lock);
    pw_count_routed(len);
    pw_note("pagewise: --bss: %zu bytes of static data at %p on %s memory (%zu page(s) kept)\n", len,
            (void *)z.start, pw_arena->name, nsaved);
}
