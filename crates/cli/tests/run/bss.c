/* A large zero-initialised static array (.bss), filled and summed. */
#include <stdio.h>

static long big[(8 << 20) / sizeof(long)];

int main(void) {
    long n = sizeof big / sizeof big[0], sum = 0;
    for (long i = 0; i < n; i++) sum += big[i]; /* zero before anyone writes */
    for (long i = 0; i < n; i += 7) big[i] = i ^ 0x5a5a;
    for (long r = 0; r < 3; r++)
        for (long i = 0; i < n; i += 3) sum += big[i] + r;
    printf("bss n=%ld sum=%ld last=%ld\n", n, sum, big[n - 1 - (n - 1) % 7]);
    return 0;
}
