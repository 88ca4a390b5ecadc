/* The BT-like ADI solver of `pagewise eval dlm-autotune` (crates/eval/src/experiments/
 * dlm_pagesize.rs) as a plain C program with no Pagewise calls, for `pagewise eval dlm-vs-swap`:
 * it mallocs its seven N^3 arrays of doubles (u, rhs, forcing and four auxiliary arrays, x
 * fastest), runs a fixed number of iterations (a compute_rhs pass over every array, then one
 * tridiagonal solve per grid line along x, y and z, Thomas algorithm), and prints the time of
 * each iteration and a checksum of u. The same arithmetic in the same order in every run, so
 * the checksum is bit-identical whatever memory the arrays live in.
 *
 * Usage: bt_like N ITERATIONS
 * Output (stdout): "iteration K SECONDS" per iteration, "loop SECONDS", "checksum HEX". */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { ARRAYS = 7 };

static size_t n;
static double *a[ARRAYS]; /* a[0] = u, a[1] = rhs, a[2] = forcing, a[3..6] = auxiliary */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static size_t idx(size_t x, size_t y, size_t z) { return (z * n + y) * n + x; }

static void init(void) {
    /* One array after the other, sequentially. */
    for (int k = 0; k < ARRAYS; k++)
        for (size_t i = 0; i < n * n * n; i++) {
            size_t x = i % n, y = (i / n) % n, z = i / (n * n);
            a[k][i] = k == 2 ? (double)((x * 7 + y * 13 + z * 29) % 97) / 97.0 : 0.0;
        }
}

/* BT's compute_rhs: a pass over every array at once, point by point. */
static void compute_rhs(void) {
    double *u = a[0], *rhs = a[1], *forcing = a[2], *qs = a[3], *rho = a[4], *square = a[5], *ws = a[6];
    for (size_t i = 0; i < n * n * n; i++) {
        double v = u[i];
        double r = 1.0 / (1.0 + v * v);
        rho[i] = r;
        qs[i] = 0.5 * v * v * r;
        square[i] = v * r;
        ws[i] = v - qs[i];
        rhs[i] = forcing[i] + 0.1 * (square[i] - ws[i] * rho[i]);
    }
}

/* One line of n points from `start` with `stride`: (-1, 4, -1) u_new = u + rhs, c' in a
 * per-line buffer, d' in rhs. */
static void line(size_t start, size_t stride, double *c) {
    double *u = a[0], *rhs = a[1];
    double c_prev = 0.0, d_prev = 0.0;
    for (size_t k = 0; k < n; k++) {
        size_t i = start + k * stride;
        double b = 4.0 + c_prev;
        c[k] = -1.0 / b;
        double d = (u[i] + rhs[i] + d_prev) / b;
        rhs[i] = d;
        c_prev = c[k];
        d_prev = d;
    }
    double next = 0.0;
    for (size_t k = n; k-- > 0;) {
        size_t i = start + k * stride;
        double v = rhs[i] - c[k] * next;
        u[i] = v * 0.5;
        next = v;
    }
}

static void iterate(double *c) {
    compute_rhs();
    for (int dir = 0; dir < 3; dir++) {
        size_t stride = dir == 0 ? 1 : dir == 1 ? n : n * n;
        for (size_t q = 0; q < n; q++)
            for (size_t p = 0; p < n; p++) {
                size_t start = dir == 0 ? idx(0, p, q) : dir == 1 ? idx(p, 0, q) : idx(p, q, 0);
                line(start, stride, c);
            }
    }
}

static uint64_t checksum(void) {
    uint64_t h = 0;
    for (size_t i = 0; i < n * n * n; i++) {
        uint64_t bits;
        memcpy(&bits, &a[0][i], sizeof bits);
        h = ((h << 5) | (h >> 59)) ^ bits;
    }
    return h;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s N ITERATIONS\n", argv[0]);
        return 2;
    }
    char *end;
    long nn = strtol(argv[1], &end, 10);
    if (*end || nn < 2 || nn > 4096) {
        fprintf(stderr, "bt_like: N must be an integer in 2..4096, not %s\n", argv[1]);
        return 2;
    }
    long iters = strtol(argv[2], &end, 10);
    if (*end || iters < 1 || iters > 100000) {
        fprintf(stderr, "bt_like: ITERATIONS must be an integer in 1..100000, not %s\n", argv[2]);
        return 2;
    }
    n = (size_t)nn;
    for (int k = 0; k < ARRAYS; k++) {
        a[k] = malloc(n * n * n * sizeof(double));
        if (!a[k]) {
            fprintf(stderr, "bt_like: malloc of array %d (%zu bytes) failed\n", k, n * n * n * sizeof(double));
            return 1;
        }
    }
    double *c = malloc(n * sizeof(double));
    if (!c) return 1;
    init();
    double t0 = now();
    for (long it = 0; it < iters; it++) {
        double t = now();
        iterate(c);
        printf("iteration %ld %.6f\n", it, now() - t);
        fflush(stdout);
    }
    printf("loop %.6f\n", now() - t0);
    printf("checksum %016llx\n", (unsigned long long)checksum());
    for (int k = 0; k < ARRAYS; k++) free(a[k]);
    free(c);
    return 0;
}
