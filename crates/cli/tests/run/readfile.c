/* read(2), fread and an anonymous mmap: the kernel writes a file into a malloc'd array. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    size_t n = 3 << 20;
    unsigned char *w = malloc(n);
    if (!w) return 2;
    for (size_t i = 0; i < n; i++) w[i] = (unsigned char)((i * 31) ^ (i >> 9));
    FILE *f = fopen(argv[1], "wb");
    if (!f || fwrite(w, 1, n, f) != n || fclose(f)) return 3;
    free(w);
    unsigned char *r = malloc(n);
    int fd = open(argv[1], O_RDONLY);
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, r + got, n - got);
        if (k <= 0) { perror("read"); return 4; }
        got += (size_t)k;
    }
    close(fd);
    unsigned char *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return 5;
    FILE *g = fopen(argv[1], "rb");
    if (!g || fread(m, 1, n, g) != n) { perror("fread"); return 6; }
    fclose(g);
    unsigned long s1 = 0, s2 = 0, bad = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char want = (unsigned char)((i * 31) ^ (i >> 9));
        bad += r[i] != want || m[i] != want;
        s1 += r[i];
        s2 += m[i] * (i % 7);
    }
    printf("readfile got=%zu s1=%lu s2=%lu bad=%lu\n", got, s1, s2, bad);
    munmap(m, n);
    free(r);
    return 0;
}
