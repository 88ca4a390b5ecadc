/* An allocator's fork handling, as jemalloc's: the library's constructor registers a child
 * handler that resets part of the allocator's state (jemalloc re-initialises each arena's
 * locks), and that state lies in a large mapping made later, once the program runs — routed
 * memory under the shim. A library the program links runs its constructor before the
 * preloaded shim's, so this handler was registered first. Linked into forkfirst.c. */
#include <pthread.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>

enum { STATE = 4 << 20, RESET = 64 << 10 };

static unsigned char *state;
static int in_child;

static unsigned char at(size_t i) { return (unsigned char)(i * 31 + (i >> 12) + 1); }

static void reset_in_child(void) {
    if (state)
        memset(state, 0, RESET);
    in_child = 1;
}

__attribute__((constructor)) static void start(void) { pthread_atfork(NULL, NULL, reset_in_child); }

/* Map and fill the state; 0, or -1 when it cannot be mapped. */
int forkfirst_start(void) {
    void *p = mmap(NULL, STATE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return -1;
    state = p;
    for (size_t i = 0; i < STATE; i++)
        state[i] = at(i);
    return 0;
}

/* Bytes of the state that differ from what this process must see: in a child, its reset
 * part zeros and the rest the pattern; in the parent, the pattern throughout. */
size_t forkfirst_errors(void) {
    size_t bad = 0;
    for (size_t i = 0; i < STATE; i++)
        bad += state[i] != (in_child && i < RESET ? 0 : at(i));
    return bad;
}
