/* Exactly three allocations of 1 MiB (every other is below 16 KiB), worked on for about 1.5 s
 * so that the runtime's own threads run meanwhile (HPS's tracker publishes its views, listing a
 * directory with a 32 KiB buffer). Prints a checksum. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BLOCK (1 << 20)

int main(void) {
    char *b[3];
    for (int i = 0; i < 3; i++) {
        b[i] = malloc(BLOCK);
        if (!b[i])
            return 2;
        memset(b[i], i + 1, BLOCK);
    }
    for (int round = 0; round < 30; round++) {
        for (int i = 0; i < 3; i++)
            memset(b[i], round + i, BLOCK);
        usleep(50000);
    }
    long sum = 0;
    for (int i = 0; i < 3; i++) {
        sum += b[i][12345] + b[i][BLOCK - 1];
        free(b[i]);
    }
    printf("%ld\n", sum);
    return 0;
}
