/* Matrix multiply on malloc'd arrays: C = A x B, printed as a checksum. */
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 256;
    double *a = malloc(sizeof(double) * n * n), *b = malloc(sizeof(double) * n * n);
    double *c = calloc((size_t)n * n, sizeof(double));
    if (!a || !b || !c) return 2;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            a[i * n + j] = (i * 7 + j * 3) % 17 - 8;
            b[i * n + j] = (i * 5 + j * 11) % 13 - 6;
        }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < n; k++) {
            double x = a[i * n + k];
            for (int j = 0; j < n; j++) c[i * n + j] += x * b[k * n + j];
        }
    double sum = 0, wsum = 0;
    for (long i = 0; i < (long)n * n; i++) {
        sum += c[i];
        wsum += c[i] * (double)(i % 101);
    }
    printf("matmul n=%d sum=%.1f wsum=%.1f c[17]=%.1f\n", n, sum, wsum, c[17]);
    free(a);
    free(b);
    free(c);
    return 0;
}
