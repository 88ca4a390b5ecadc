/* Another process copies to and from this one's memory with process_vm_readv/writev, as Open
 * MPI's shared-memory transport does between ranks on one host (CMA), while this one sweeps
 * it. The kernel pins each page for the copy, and a pinned page cannot be moved: under
 * `pagewise run` with little local memory, the runtime meets pages it cannot evict.
 *
 * `cma`: the program. It fills BUF pages with a pattern, spawns itself as the peer
 * (posix_spawn: no fork) and sweeps BUF (reading and rewriting the pattern) until the peer
 * is done. The peer reads BUF at pseudo-random places and checks the pattern, and writes
 * every page of INBOX, each with its own pattern, which the program checks at the end. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAGE 4096
#define BUF_PAGES 6144   /* 24 MiB */
#define INBOX_PAGES 2048 /* 8 MiB */
#define BATCH 16         /* pages per copy */

extern char **environ;

static uint64_t pattern(uint64_t page, uint64_t salt) { return (page + 1) * 0x9e3779b97f4a7c15ULL ^ salt; }

static void fill(char *base, uint64_t first, uint64_t n, uint64_t salt) {
    for (uint64_t i = 0; i < n; i++) {
        uint64_t w = pattern(first + i, salt);
        memcpy(base + i * PAGE, &w, 8);
        uint64_t z = ~w;
        memcpy(base + i * PAGE + PAGE - 8, &z, 8);
    }
}

/* Pages of [base, base + n pages) that do not hold their pattern. */
static uint64_t wrong(const char *base, uint64_t first, uint64_t n, uint64_t salt) {
    uint64_t bad = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t w, z;
        memcpy(&w, base + i * PAGE, 8);
        memcpy(&z, base + i * PAGE + PAGE - 8, 8);
        bad += w != pattern(first + i, salt) || z != ~pattern(first + i, salt);
    }
    return bad;
}

static int peer(pid_t pid, uintptr_t buf, uintptr_t inbox) {
    static char copy[BATCH * PAGE];
    uint64_t x = 88172645463325252ULL, bad = 0, reads = 0;
    for (uint64_t j = 0; j < INBOX_PAGES; j += BATCH) {
        for (int k = 0; k < 4; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            uint64_t first = x % (BUF_PAGES - BATCH);
            struct iovec local = {copy, sizeof copy}, remote = {(void *)(buf + first * PAGE), sizeof copy};
            if (process_vm_readv(pid, &local, 1, &remote, 1, 0) != (ssize_t)sizeof copy) {
                perror("process_vm_readv");
                return 2;
            }
            bad += wrong(copy, first, BATCH, 1);
            reads++;
        }
        fill(copy, j, BATCH, 2);
        struct iovec local = {copy, sizeof copy}, remote = {(void *)(inbox + j * PAGE), sizeof copy};
        if (process_vm_writev(pid, &local, 1, &remote, 1, 0) != (ssize_t)sizeof copy) {
            perror("process_vm_writev");
            return 2;
        }
    }
    printf("peer: %" PRIu64 " copies read, %" PRIu64 " wrong page(s)\n", reads, bad);
    return bad != 0;
}

int main(int argc, char **argv) {
    if (argc == 4)
        return peer((pid_t)strtol(argv[1], NULL, 10), strtoull(argv[2], NULL, 16), strtoull(argv[3], NULL, 16));
    char *buf = mmap(NULL, (size_t)BUF_PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *inbox = mmap(NULL, (size_t)INBOX_PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED || inbox == MAP_FAILED)
        return perror("mmap"), 1;
    fill(buf, 0, BUF_PAGES, 1);
    /* The peer may read this process's memory (Yama's ptrace_scope 1 allows descendants only). */
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    char pid[24], b[24], in[24];
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    snprintf(b, sizeof b, "%" PRIxPTR, (uintptr_t)buf);
    snprintf(in, sizeof in, "%" PRIxPTR, (uintptr_t)inbox);
    char *args[] = {argv[0], pid, b, in, NULL};
    pid_t child;
    fflush(stdout);
    if (posix_spawn(&child, "/proc/self/exe", NULL, NULL, args, environ) != 0)
        return perror("posix_spawn"), 1;
    uint64_t sweeps = 0, bad = 0;
    int status;
    while (waitpid(child, &status, WNOHANG) == 0) {
        bad += wrong(buf, 0, BUF_PAGES, 1);
        fill(buf, 0, BUF_PAGES, 1);
        sweeps++;
    }
    int peer_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    printf("program: peer %s; %" PRIu64 " wrong page(s) in %s sweep(s); %" PRIu64 " wrong page(s) in its inbox\n",
           peer_ok ? "ok" : "failed", bad, sweeps > 0 ? "its" : "no", wrong(inbox, 0, INBOX_PAGES, 2));
    return bad != 0 || !peer_ok;
}
