/* A 5-point Jacobi stencil on malloc'd grids, realloc'd once, printed as a checksum. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
    int n = 512, iters = 8;
    double *u = malloc(sizeof(double) * n * n), *v = malloc(sizeof(double) * n * n);
    if (!u || !v) return 2;
    for (int i = 0; i < n * n; i++) u[i] = (i % 97) * 0.5;
    memcpy(v, u, sizeof(double) * n * n);
    for (int t = 0; t < iters; t++) {
        for (int i = 1; i < n - 1; i++)
            for (int j = 1; j < n - 1; j++)
                v[i * n + j] = 0.2 * (u[i * n + j] + u[(i - 1) * n + j] + u[(i + 1) * n + j] + u[i * n + j - 1] +
                                      u[i * n + j + 1]);
        double *s = u; u = v; v = s;
    }
    /* Grow one grid: the data must move along. */
    u = realloc(u, sizeof(double) * n * n * 2);
    if (!u) return 3;
    double sum = 0;
    for (int i = 0; i < n * n; i++) sum += u[i] * ((i % 13) + 1);
    printf("stencil sum=%.6f corner=%.6f mid=%.6f\n", sum, u[n + 1], u[(n / 2) * n + n / 2]);
    free(u);
    free(v);
    return 0;
}
