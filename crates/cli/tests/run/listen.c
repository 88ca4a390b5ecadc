/* listen(2) through the preload shim keeps its meaning: a socket bound to the loopback
 * listens (0) and takes a connection; a bad descriptor gives -1 with EBADF, a file ENOTSOCK.
 * Prints one line per case; the output must be the same with and without the shim. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int main(void) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) < 0 || getsockname(s, (struct sockaddr *)&a, &len) < 0)
        return 1;
    printf("listen on a bound socket: %d\n", listen(s, 4));
    int c = socket(AF_INET, SOCK_STREAM, 0);
    printf("connect: %d\n", connect(c, (struct sockaddr *)&a, sizeof a));
    int in = accept(s, NULL, NULL);
    printf("accept: %s\n", in >= 0 ? "ok" : strerror(errno));
    errno = 0;
    int rc = listen(-1, 4);
    printf("listen on -1: %d %s\n", rc, strerror(errno));
    errno = 0;
    rc = listen(1, 4); /* stdout: not a socket */
    printf("listen on stdout: %d %s\n", rc, strerror(errno));
    return 0;
}
