/*
 * The TCP transport: one exchange = send a byte range to one peer while receiving a byte
 * range from another, on non-blocking sockets, handing each received chunk to a callback
 * as soon as it is complete.
 *
 * That callback is what makes the algorithms pipelined: while the engine reduces chunk k
 * the kernel keeps receiving chunk k+1 into the socket buffer and the peer keeps sending,
 * so arithmetic and transfer overlap without a second thread, and the staging buffer is
 * one chunk, not one segment.
 *
 * Waiting blocks in poll() (never spins) on the two data sockets and on the control
 * sockets, so an ABORT from rank 0 or a dead peer ends the wait at once. A transfer that
 * makes no progress for HOROVODLIKE_PEER_TIMEOUT_SECONDS names the peer it waits on.
 */
#include "fail.h"
#include "liveness.h"
#include "net.h"
#include <errno.h>
#include <stdio.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef struct tcp {
    transport_t base;
    engine_t *e;
} tcp_t;

/* Largest single send/recv call: big enough to amortise the syscall, small enough to
 * interleave sending and receiving. */
#define MAX_IO (1 << 20)

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* A failure the exchange met: reported now, or, detached (d set), kept for the engine's
 * thread (transport.h). peer -1: a failure of this rank's own (status SYSTEM). */
static int failed(engine_t *e, detached_t *d, int peer, const char *why) {
    if (!d) {
        if (peer < 0) return hvdl__fail_job(e, HVDL_ERR_SYSTEM, "%s", why);
        hvdl__peer_lost(e, peer, why);
        return -1;
    }
    if (!d->failed) {
        d->peer = peer;
        snprintf(d->why, sizeof d->why, "%s", why);
        d->failed = 1;
    }
    return -1;
}

static int exchange(engine_t *e, const xfer_t *x, detached_t *d) {
    int sfd = x->slen > 0 ? e->peers[x->send_peer].data_fd : -1;
    int rfd = x->rlen > 0 ? e->peers[x->recv_peer].data_fd : -1;
    int64_t sent = 0, rcvd = 0, fill = 0;
    double last = hvdl_now();
    struct pollfd pf[e->size + 2];
    int ranks[e->size + 2];
    char why[64];

    while (sent < x->slen || rcvd < x->rlen) {
        int progress = 0;
        if (sent < x->slen) {
            if (HVDL_INJECT(e, INJ_TCP_SEND)) {
                snprintf(why, sizeof why, "sending data to rank %d failed", x->send_peer);
                return failed(e, d, -1, why);
            }
            ssize_t k = send(sfd, (const uint8_t *)x->sbuf + sent,
                             (size_t)min64(x->slen - sent, MAX_IO), MSG_NOSIGNAL | MSG_DONTWAIT);
            if (k > 0) {
                sent += k;
                progress = 1;
            } else if (errno != EAGAIN && errno != EINTR) {
                return failed(e, d, x->send_peer, strerror(errno));
            }
        }
        if (rcvd < x->rlen) {
            int64_t want = x->on_chunk ? min64(x->chunk - fill, x->rlen - rcvd)
                                       : min64(x->rlen - rcvd, MAX_IO);
            uint8_t *dst = x->on_chunk ? (uint8_t *)x->rbuf + fill : (uint8_t *)x->rbuf + rcvd;
            ssize_t k = recv(rfd, dst, (size_t)want, MSG_DONTWAIT);
            if (k > 0) {
                rcvd += k;
                fill += k;
                progress = 1;
                if (x->on_chunk && (fill == x->chunk || rcvd == x->rlen)) {
                    x->on_chunk(x->ctx, rcvd - fill, x->rbuf, fill);
                    fill = 0;
                }
            } else if (k == 0) {
                return failed(e, d, x->recv_peer, "its connection closed");
            } else if (errno != EAGAIN && errno != EINTR) {
                return failed(e, d, x->recv_peer, strerror(errno));
            }
        }
        if (progress) {
            last = hvdl_now();
            if (d ? atomic_load(&d->cancel) : hvdl__liveness_check(e, last)) return -1;
            continue;
        }

        if (d ? atomic_load(&d->cancel) : hvdl__buffered_abort(e)) return -1;
        int n = 0;
        if (sent < x->slen) {
            pf[n] = (struct pollfd){sfd, POLLOUT, 0};
            ranks[n++] = -1;
        }
        if (rcvd < x->rlen) {
            pf[n] = (struct pollfd){rfd, POLLIN, 0};
            ranks[n++] = -1;
        }
        if (d) {
            /* the engine's thread watches control and liveness meanwhile */
            poll(pf, (nfds_t)n, 50);
            if (atomic_load(&d->cancel)) return -1;
        } else {
            int fds[e->size], who[e->size];
            int nc = hvdl__control_fds(e, fds, who, e->size);
            for (int i = 0; i < nc; i++) {
                pf[n] = (struct pollfd){fds[i], POLLIN, 0};
                ranks[n++] = who[i];
            }
            poll(pf, (nfds_t)n, 200);
            for (int i = 0; i < n; i++)
                if (ranks[i] >= 0 && pf[i].revents && hvdl__control_readable(e, ranks[i]))
                    return -1;
            if (hvdl__liveness_check(e, hvdl_now())) return -1;
        }
        /* One heartbeat interval later than liveness.c, whose verdict names the rank that
         * stopped rather than a neighbour that waits for it as we do. */
        if (hvdl_now() - last > e->cfg.peer_timeout + hvdl__heartbeat_interval(e)) {
            int peer = rcvd < x->rlen ? x->recv_peer : x->send_peer;
            return failed(e, d, peer, "no data moved for HOROVODLIKE_PEER_TIMEOUT_SECONDS");
        }
    }
    return 0;
}

static int tcp_exchange(transport_t *t, const xfer_t *x) {
    return exchange(((tcp_t *)t)->e, x, NULL);
}

static int detached_exchange(transport_t *t, const xfer_t *x) {
    detached_t *d = (detached_t *)t;
    return exchange(((tcp_t *)d->of)->e, x, d);
}

void hvdl__detached_init(detached_t *d, transport_t *tcp) {
    d->base = (transport_t){"tcp (detached)", detached_exchange};
    d->of = tcp;
    atomic_init(&d->cancel, 0);
    d->failed = 0;
    d->peer = -1;
    d->why[0] = 0;
}

int hvdl__detached_report(detached_t *d) {
    if (!d->failed) return 0;
    return failed(((tcp_t *)d->of)->e, NULL, d->peer, d->why);
}

transport_t *hvdl__tcp_transport(engine_t *e) {
    static const transport_t base = {"tcp", tcp_exchange};
    tcp_t *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->base = base;
    t->e = e;
    return &t->base;
}
