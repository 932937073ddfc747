/*
 * Sockets: the listening socket and address blob, the start-up clock sync, control
 * frames, and waiting on control traffic. (Who connects to whom, and the hello that
 * authenticates each connection, are in handshake.c.)
 *
 * Keeping control apart from data means an algorithm reads its data stream without ever
 * meeting a negotiation frame, and a control frame that arrives mid-transfer just waits
 * in the socket until the loop asks. Control frames are {magic, type, length} + payload;
 * a frame with another magic, an unknown type or a length over HVDL_MAX_FRAME fails the
 * job naming the peer that sent it.
 */
#define _GNU_SOURCE
#include "internal.h"
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>


typedef struct blob {
    uint32_t magic, version;
    uint64_t nonce;
    int32_t port, pad;
    agreed_t agreed;         /* settings every rank must share */
    char ip[64];
    char host[128];
} blob_t;
_Static_assert(sizeof(blob_t) <= HVDL_BLOB_BYTES, "blob too large");

typedef struct frame_hdr {
    uint32_t magic, type;
    int64_t len;
} frame_hdr_t;

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

/* Blob encode/decode live here because only net.c knows the blob's layout. */
void hvdl__blob_write(engine_t *e, int port, const char *ip, char *out) {
    blob_t b = {.magic = WIRE_MAGIC, .version = WIRE_VERSION, .nonce = e->nonce, .port = port};
    hvdl__config_agreed(&e->cfg, &b.agreed);
    snprintf(b.ip, sizeof b.ip, "%s", ip);
    snprintf(b.host, sizeof b.host, "%s", e->host);
    memset(out, 0, HVDL_BLOB_BYTES);
    memcpy(out, &b, sizeof b);
}

int hvdl__blob_read(const char *in, peer_t *p) {
    blob_t b;
    memcpy(&b, in, sizeof b);
    if (b.magic != WIRE_MAGIC || b.version != WIRE_VERSION) return -1;
    b.ip[sizeof b.ip - 1] = b.host[sizeof b.host - 1] = 0;
    memcpy(p->host, b.host, sizeof p->host);
    memcpy(p->ip, b.ip, sizeof p->ip);
    p->port = b.port;
    p->nonce = b.nonce;
    p->agreed = b.agreed;
    return 0;
}

/* Blocking I/O with a deadline, for the handshake only. */
int hvdl__io_full(int fd, void *p, size_t n, int writing, double deadline) {
    uint8_t *c = p;
    while (n) {
        struct pollfd pf = {fd, writing ? POLLOUT : POLLIN, 0};
        int ms = (int)((deadline - hvdl_now()) * 1000);
        if (ms <= 0 || poll(&pf, 1, ms) <= 0) return -1;
        ssize_t k = writing ? send(fd, c, n, MSG_NOSIGNAL) : recv(fd, c, n, 0);
        if (k <= 0) {
            if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
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
        e->peers[i].data_fd = e->peers[i].ctrl.fd = -1;
        buf_free(&e->peers[i].ctrl.rx);
    }
    if (e->listen_fd >= 0) close(e->listen_fd);
    e->listen_fd = -1;
}

/* ---- start-up clock sync ---- */

static double wall_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* Measure rank 0's wall clock minus ours (NTP's estimate: of a few ping-pongs, trust the
 * one with the shortest round trip). Blocking, before the loop starts; costs a few ms. */
int hvdl__clock_sync(engine_t *e) {
    enum { ROUNDS = 5 };
    double deadline = hvdl_now() + e->cfg.start_timeout;
    frame_hdr_t h;
    if (e->rank == 0) {
        for (int w = 1; w < e->size; w++) {
            for (int k = 0; k < ROUNDS; k++) {
                double now;
                if (hvdl__io_full(e->peers[w].ctrl.fd, &h, sizeof h, 0, deadline) || h.magic != WIRE_MAGIC || h.type != MSG_PING ||
                    h.len != 0)
                    goto lost;
                now = wall_us();
                frame_hdr_t pong = {WIRE_MAGIC, MSG_PONG, sizeof now};
                uint8_t msg[sizeof pong + sizeof now];
                memcpy(msg, &pong, sizeof pong);
                memcpy(msg + sizeof pong, &now, sizeof now);
                if (hvdl__io_full(e->peers[w].ctrl.fd, msg, sizeof msg, 1, deadline)) goto lost;
                continue;
            lost:
                hvdl__fail(e, HVDL_ERR_PEER_LOST, "rank %d (host %s) failed the start-up clock sync",
                           w, e->peers[w].host);
                return -1;
            }
        }
        return 0;
    }
    double best_rtt = 1e18;
    for (int k = 0; k < ROUNDS; k++) {
        frame_hdr_t ping = {WIRE_MAGIC, MSG_PING, 0};
        double t0 = wall_us(), remote;
        if (hvdl__io_full(e->peers[0].ctrl.fd, &ping, sizeof ping, 1, deadline) ||
            hvdl__io_full(e->peers[0].ctrl.fd, &h, sizeof h, 0, deadline) || h.magic != WIRE_MAGIC || h.type != MSG_PONG ||
            h.len != sizeof remote || hvdl__io_full(e->peers[0].ctrl.fd, &remote, sizeof remote, 0, deadline)) {
            hvdl__fail(e, HVDL_ERR_PEER_LOST, "rank 0 (host %s) failed the start-up clock sync", e->peers[0].host);
            return -1;
        }
        double t1 = wall_us();
        if (t1 - t0 < best_rtt) {
            best_rtt = t1 - t0;
            e->clock_offset_us = remote - (t0 + t1) / 2;
        }
    }
    return 0;
}

/* ---- control plane ---- */

/* Read whatever a control socket has into its rx buffer. 0, or -1 when the peer is gone. */
int hvdl__ctrl_read(conn_t *c) {
    for (;;) {
        if (buf_reserve(&c->rx, c->rx.len + 65536)) return -1;
        ssize_t k = recv(c->fd, c->rx.data + c->rx.len, (size_t)(c->rx.cap - c->rx.len), 0);
        if (k > 0) { c->rx.len += k; c->last_rx = hvdl_now(); continue; }
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (k < 0 && errno == EINTR) continue;
        return -1;
    }
}

/* Why a frame header from peer cannot be taken by this rank, or NULL. Checked as soon
 * as the header is in, before waiting for (or buffering) the payload it announces. */
static const char *header_problem(engine_t *e, int peer, const frame_hdr_t *h) {
    if (h->magic != WIRE_MAGIC) return "sent a malformed control frame (bad magic number)";
    if (h->len < 0 || h->len > HVDL_MAX_FRAME)
        return "sent a malformed control frame (its length is negative or over 256 MiB)";
    switch (h->type) {
    case MSG_REQUESTS: return e->rank == 0 ? NULL : "sent a malformed control frame (requests to a worker)";
    case MSG_RESPONSES: return peer == 0 ? NULL : "sent a malformed control frame (responses, but it is not rank 0)";
    case MSG_BYE: case MSG_ABORT: case MSG_HEARTBEAT: return NULL;
    default: return "sent a malformed control frame (an unknown type, or one out of place)";
    }
}

/* If rx holds a complete frame, point at it and return its total size; 0 if not; -1
 * (with *why) if the frame cannot be taken. */
static int64_t next_frame(engine_t *e, int peer, frame_hdr_t *h, int64_t at, const char **why) {
    conn_t *c = &e->peers[peer].ctrl;
    if (c->rx.len - at < (int64_t)sizeof *h) return 0;
    memcpy(h, c->rx.data + at, sizeof *h);
    if ((*why = header_problem(e, peer, h))) return -1;
    return c->rx.len - at >= (int64_t)sizeof *h + h->len ? (int64_t)sizeof *h + h->len : 0;
}

void hvdl__peer_lost(engine_t *e, int peer, const char *why);

/* Looks at frames buffered from peer without consuming them: an ABORT fails the engine
 * now (the other frames wait for the loop). Returns -1 once the engine has failed, else
 * whether a goodbye (MSG_BYE) is among them. */
static int scan_frames(engine_t *e, int peer) {
    conn_t *c = &e->peers[peer].ctrl;
    frame_hdr_t h;
    int64_t at = 0, n;
    int bye = 0;
    const char *why = NULL;
    while ((n = next_frame(e, peer, &h, at, &why)) > 0) {
        if (h.type == MSG_ABORT) {
            hvdl__handle_frame(e, peer, MSG_ABORT, c->rx.data + at + sizeof h, h.len);
            return -1;
        }
        bye |= h.type == MSG_BYE;
        at += n;
    }
    if (n < 0) { hvdl__peer_lost(e, peer, why); return -1; }
    return bye;
}

/* Called during a transfer when a control socket is readable. A peer that said goodbye
 * and then closed is not lost: it finished its share of every response before the
 * goodbye, so the transfer goes on and the loop handles the goodbye afterwards. */
int hvdl__control_readable(engine_t *e, int peer) {
    conn_t *c = &e->peers[peer].ctrl;
    int closed = hvdl__ctrl_read(c);
    int bye = scan_frames(e, peer);
    if (bye < 0) return -1;
    if (closed && bye) {
        c->eof = 1;
        return 0;
    }
    if (closed) {
        hvdl__peer_lost(e, peer, "its connection closed");
        return -1;
    }
    return 0;
}

/* Wait up to timeout_ms for control traffic during a collective; -1 once the engine has
 * failed (an ABORT arrived or a peer's control connection died). */
int hvdl__watch_control(engine_t *e, int timeout_ms) {
    int fds[e->size], ranks[e->size];
    int n = hvdl__control_fds(e, fds, ranks, e->size);
    struct pollfd pf[n + 1];
    for (int i = 0; i < n; i++) pf[i] = (struct pollfd){fds[i], POLLIN, 0};
    if (n == 0 || poll(pf, (nfds_t)n, timeout_ms) <= 0) return e->failed ? -1 : 0;
    for (int i = 0; i < n; i++)
        if (pf[i].revents && hvdl__control_readable(e, ranks[i])) return -1;
    return 0;
}

int hvdl__control_fds(engine_t *e, int *fds, int *ranks, int cap) {
    int n = 0;
    for (int i = 0; i < e->size && n < cap; i++) {
        if (e->peers[i].ctrl.fd < 0 || e->peers[i].ctrl.eof) continue;
        fds[n] = e->peers[i].ctrl.fd;
        ranks[n++] = i;
    }
    return n;
}

/* Whether peer's goodbye (MSG_BYE) has arrived, read or not; the connection is then
 * marked as closed after a goodbye. */
static int said_bye(engine_t *e, int peer) {
    conn_t *c = &e->peers[peer].ctrl;
    hvdl__ctrl_read(c);
    if (scan_frames(e, peer) <= 0) return 0;
    c->eof = 1;
    return 1;
}

int hvdl__send_frame(engine_t *e, int peer, int type, const void *p, int64_t n) {
    conn_t *c = &e->peers[peer].ctrl;
    frame_hdr_t h = {WIRE_MAGIC, (uint32_t)type, n};
    const uint8_t *parts[2] = {(const uint8_t *)&h, p};
    int64_t lens[2] = {sizeof h, n};
    double last = hvdl_now();
    for (int i = 0; i < 2; i++) {
        int64_t off = 0;
        while (off < lens[i]) {
            ssize_t k = send(c->fd, parts[i] + off, (size_t)(lens[i] - off), MSG_NOSIGNAL);
            if (k > 0) { off += k; last = hvdl_now(); continue; }
            if (k < 0 && errno != EAGAIN && errno != EINTR) {
                int err = errno;
                /* A peer that said goodbye and closed with our last frame unread resets
                 * the connection; its goodbye, still readable here, makes this no loss:
                 * the loop handles it next. */
                if (said_bye(e, peer)) return 0;
                hvdl__peer_lost(e, peer, strerror(err));
                return -1;
            }
            /* Read while we wait so that two ranks sending to each other never deadlock. */
            struct pollfd pf = {c->fd, POLLOUT | POLLIN, 0};
            poll(&pf, 1, 100);
            if ((pf.revents & (POLLIN | POLLHUP | POLLERR)) && hvdl__control_readable(e, peer))
                return -1;
            if (hvdl__liveness_check(e, hvdl_now())) return -1;
            if (hvdl_now() - last > e->cfg.peer_timeout) {
                hvdl__peer_lost(e, peer, "it stopped reading its control connection");
                return -1;
            }
        }
    }
    c->last_tx = last;
    return 0;
}

/* Dispatch every complete frame buffered from peer. Returns how many, or -1. */
static int dispatch(engine_t *e, int peer) {
    conn_t *c = &e->peers[peer].ctrl;
    frame_hdr_t h;
    int64_t n;
    int count = 0;
    const char *why = NULL;
    while ((n = next_frame(e, peer, &h, 0, &why)) > 0) {
        /* Copy out first: handling may read more into rx and move its data. */
        uint8_t *payload = malloc((size_t)h.len + 1);
        if (!payload) return -1;
        memcpy(payload, c->rx.data + sizeof h, (size_t)h.len);
        buf_consume(&c->rx, n);
        int rc = hvdl__handle_frame(e, peer, (int)h.type, payload, h.len);
        free(payload);
        if (rc) return -1;
        count++;
    }
    if (n < 0) { hvdl__peer_lost(e, peer, why); return -1; }
    return count;
}

/* The loop's one blocking point: wait up to timeout_ms for an enqueue (wake_fd) or a
 * control frame, and handle every frame that has arrived. Frames already buffered
 * (read during a data transfer) are handled first without waiting. */
int hvdl__pump_control(engine_t *e, int timeout_ms, int wake_fd) {
    int handled = 0;
    for (int i = 0; i < e->size; i++) {
        if (e->peers[i].ctrl.fd < 0) continue;
        int k = dispatch(e, i);
        if (k < 0) return -1;
        handled += k;
        if (e->peers[i].ctrl.eof && !e->stopped) {
            /* closed after its goodbye, and the goodbye did not stop us: it was a worker
             * telling rank 0, which has now answered everyone */
            hvdl__peer_lost(e, i, "its connection closed");
            return -1;
        }
    }
    if (handled || e->stopped) return 0;
    struct pollfd pf[e->size + 1];
    int ranks[e->size + 1], fds[e->size + 1];
    int n = hvdl__control_fds(e, fds, ranks, e->size);
    for (int i = 0; i < n; i++) pf[i] = (struct pollfd){fds[i], POLLIN, 0};
    pf[n] = (struct pollfd){wake_fd, POLLIN, 0};
    /* A blocking wake-up costs tens of microseconds; the next request or response often
     * arrives sooner than that, so look without sleeping for a moment first (never when
     * ranks outnumber cores: there a spinning thread steals its peer's core). */
    int ready = 0;
    if (e->spin_us > 0 && timeout_ms != 0) {
        double until = hvdl_now() + e->spin_us * 1e-6;
        while (!(ready = poll(pf, (nfds_t)n + 1, 0)) && hvdl_now() < until)
            for (int k = 0; k < 32; k++) hvdl_pause();
    }
    if (!ready && poll(pf, (nfds_t)n + 1, timeout_ms) <= 0) return 0;
    for (int i = 0; i < n; i++) {
        if (!pf[i].revents) continue;
        if (hvdl__ctrl_read(&e->peers[ranks[i]].ctrl)) {
            /* A frame that came before the close (a BYE, an ABORT) still counts. */
            if (dispatch(e, ranks[i]) < 0 || e->failed) return -1;
            hvdl__peer_lost(e, ranks[i], "its connection closed");
            return -1;
        }
        if (dispatch(e, ranks[i]) < 0) return -1;
    }
    return 0;
}
