/* Many 1-2 MiB blocks (packed by `pagewise hps run` into shared arenas): fill, free every
 * other, calloc new ones (must read zero), grow some with realloc, check every surviving
 * block's content, free all and do it again. Prints a checksum and the number of errors. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NB 96

static size_t size_of(int i) { return (1UL << 20) + (size_t)(i % 5) * 200000; }

int main(void) {
    uint8_t *b[NB];
    size_t len[NB];
    unsigned long errors = 0, sum = 0;
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < NB; i++) {
            len[i] = size_of(i + round);
            b[i] = malloc(len[i]);
            if (!b[i])
                return 2;
            memset(b[i], (i * 13 + round) & 0xff, len[i]);
        }
        for (int i = 0; i < NB; i += 2)
            free(b[i]);
        for (int i = 0; i < NB; i += 2) {
            len[i] = size_of(i * 3);
            b[i] = calloc(1, len[i]);
            if (!b[i])
                return 2;
            for (size_t k = 0; k < len[i]; k += 512)
                errors += b[i][k] != 0;
            memset(b[i], (i * 13 + round) & 0xff, len[i]);
        }
        for (int i = 1; i < NB; i += 4) {
            size_t n = len[i] * 2;
            b[i] = realloc(b[i], n);
            if (!b[i])
                return 2;
            memset(b[i] + len[i], (i * 13 + round) & 0xff, n - len[i]);
            len[i] = n;
        }
        for (int i = 0; i < NB; i++) {
            for (size_t k = 0; k < len[i]; k += 97) {
                errors += b[i][k] != ((i * 13 + round) & 0xff);
                sum += b[i][k];
            }
            free(b[i]);
        }
    }
    printf("sum %lu errors %lu\n", sum, errors);
    return errors != 0;
}
