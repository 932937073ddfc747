/*
 * Sockets: the listening socket, the options every connection gets, blocking I/O with
 * a deadline (for start-up only), and closing everything. Who connects to whom is in
 * handshake.c; control frames are in net.c.
 */
#include "net.h"
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

void hvdl__tune_socket(engine_t *e, int fd) {
    int one = 1, sz = (int)e->cfg.socket_buffer;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
}

int hvdl__set_nonblocking(int fd) {
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

int hvdl__listen(engine_t *e) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    hvdl__tune_socket(e, fd);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    if (e->bind_addr[0] && inet_pton(AF_INET, e->bind_addr, &a.sin_addr) != 1) {
        close(fd);
        errno = EINVAL;
        return -1;
    }
    socklen_t al = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 256) ||
        getsockname(fd, (struct sockaddr *)&a, &al)) {
        close(fd);
        return -1;
    }
    e->listen_fd = fd;
    return ntohs(a.sin_port);
}

/* Blocking I/O with a deadline, for the handshake only: 0, or -1 with errno ETIMEDOUT
 * when the peer sent (or took) nothing until the deadline, ECONNRESET when it closed. */
int hvdl__io_full(int fd, void *p, size_t n, int writing, double deadline) {
    uint8_t *c = p;
    while (n) {
        struct pollfd pf = {fd, writing ? POLLOUT : POLLIN, 0};
        int ms = (int)((deadline - hvdl_now()) * 1000);
        int ready = ms > 0 ? poll(&pf, 1, ms) : 0;
        if (ready < 0 && errno == EINTR) continue;
        if (ready <= 0) {
            if (ready == 0) errno = ETIMEDOUT;    /* the peer was silent until the deadline */
            return -1;
        }
        ssize_t k = writing ? send(fd, c, n, MSG_NOSIGNAL) : recv(fd, c, n, 0);
        if (k <= 0) {
            if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
            if (k == 0) errno = ECONNRESET;       /* the peer closed the connection */
            return -1;
        }
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

void hvdl__close_all(engine_t *e) {
    for (int i = 0; e->peers && i < e->size; i++) {
        if (e->peers[i].data_fd >= 0) close(e->peers[i].data_fd);
        if (e->peers[i].ctrl.fd >= 0) close(e->peers[i].ctrl.fd);
        if (e->peers[i].p2p_fd >= 0) close(e->peers[i].p2p_fd);
        e->peers[i].data_fd = e->peers[i].ctrl.fd = e->peers[i].p2p_fd = -1;
        buf_free(&e->peers[i].ctrl.rx);
    }
    if (e->listen_fd >= 0) close(e->listen_fd);
    e->listen_fd = -1;
}
