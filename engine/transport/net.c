/*
 * Control frames on the control star (workers <-> rank 0): reading and buffering them,
 * checking each header, sending, and waiting for control traffic. What is done with a
 * frame is the loop's business (loop.c); here frames are only moved and checked.
 *
 * Keeping control apart from data means an algorithm reads its data stream without ever
 * meeting a negotiation frame, and a control frame that arrives mid-transfer just waits
 * in the socket until the loop asks; only an ABORT is acted on at once, wherever it is
 * read, since it ends every wait. Control frames are {magic, type, length} + payload;
 * a frame with another magic, an unknown type or a length over HVDL_MAX_FRAME fails the
 * job naming the peer that sent it.
 */
#define _GNU_SOURCE
#include "fail.h"
#include "liveness.h"
#include "negotiation.h"
#include "net.h"
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* Read whatever peer's control socket has into its rx buffer. 0, or -1 when the peer is
 * gone (or this rank has failed: no memory to read into). */
int hvdl__ctrl_read(engine_t *e, int peer) {
    conn_t *c = &e->peers[peer].ctrl;
    for (;;) {
        if (buf_reserve(&c->rx, c->rx.len + 65536))
            return hvdl__oom(e, "control receive buffer", c->rx.len + 65536);
        ssize_t k = recv(c->fd, c->rx.data + c->rx.len, (size_t)(c->rx.cap - c->rx.len), 0);
        if (k > 0) {
            c->rx.len += k;
            c->last_rx = hvdl_now();
            continue;
        }
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
    case MSG_REQUESTS:
        return e->rank == 0 ? NULL : "sent a malformed control frame (requests to a worker)";
    case MSG_RESPONSES:
        return peer == 0 ? NULL
                         : "sent a malformed control frame (responses, but it is not rank 0)";
    case MSG_BYE:
    case MSG_ABORT:
    case MSG_HEARTBEAT: return NULL;
    case MSG_WAITS:
        return e->rank == 0 ? NULL : "sent a malformed control frame (a wait report to a worker)";
    case MSG_NODE_DONE:
    case MSG_NODE_POSTED:
        return e->rank == 0 ? NULL : "sent a malformed control frame (a node's report to a worker)";
    case MSG_NODE_CLOSE:
    case MSG_NODE_REOPEN:
        return peer == 0 ? NULL
                         : "sent a malformed control frame (a word order, but it is not rank 0)";
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
            hvdl__abort_received(e, peer, c->rx.data + at + sizeof h, h.len);
            return -1;
        }
        bye |= h.type == MSG_BYE;
        at += n;
    }
    if (n < 0) {
        hvdl__peer_lost(e, peer, why);
        return -1;
    }
    return bye;
}

/* Why a peer whose control connection closed is lost: whether it closed after its last
 * whole frame or in the middle of one (a sender that died while sending). */
const char *hvdl__closed_why(engine_t *e, int peer) {
    frame_hdr_t h;
    int64_t at = 0, n;
    const char *why = NULL;
    while ((n = next_frame(e, peer, &h, at, &why)) > 0) at += n;
    return e->peers[peer].ctrl.rx.len > at ? "its connection closed in the middle of a frame"
                                           : "its connection closed";
}

/* Called during a transfer when a control socket is readable. A peer that said goodbye
 * and then closed is not lost: it finished its share of every response before the
 * goodbye, so the transfer goes on and the loop handles the goodbye afterwards. */
int hvdl__control_readable(engine_t *e, int peer) {
    conn_t *c = &e->peers[peer].ctrl;
    int closed = hvdl__ctrl_read(e, peer);
    int bye = scan_frames(e, peer);
    if (bye < 0) return -1;
    if (closed && bye) {
        c->eof = 1;
        return 0;
    }
    if (closed) {
        hvdl__peer_lost(e, peer, hvdl__closed_why(e, peer));
        return -1;
    }
    return 0;
}

/* An ABORT may already sit in a receive buffer, read along with the frame being handled
 * (a response whose transfer now waits): the socket will not become readable for it, so
 * a wait looks there too. -1 once the engine has failed. */
int hvdl__buffered_abort(engine_t *e) {
    for (int i = 0; e->peers && i < e->size; i++)
        if (e->peers[i].ctrl.rx.len && scan_frames(e, i) < 0) return -1;
    return 0;
}

/* Wait up to timeout_ms for control traffic during a collective; -1 once the engine has
 * failed (an ABORT arrived or a peer's control connection died). */
int hvdl__watch_control(engine_t *e, int timeout_ms) {
    if (hvdl__buffered_abort(e)) return -1;
    int fds[e->size], ranks[e->size];
    int n = hvdl__control_fds(e, fds, ranks, e->size);
    struct pollfd pf[n + 1];
    for (int i = 0; i < n; i++) pf[i] = (struct pollfd){fds[i], POLLIN, 0};
    if (n <= 0 || poll(pf, (nfds_t)n, timeout_ms) <= 0) return e->failed ? -1 : 0;
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
    hvdl__ctrl_read(e, peer);
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
    if (HVDL_INJECT(e, INJ_CTRL_SEND))
        return hvdl__fail_job(e, HVDL_ERR_SYSTEM, "sending a control frame to rank %d failed",
                              peer);
    for (int i = 0; i < 2; i++) {
        int64_t off = 0;
        while (off < lens[i]) {
            ssize_t k = send(c->fd, parts[i] + off, (size_t)(lens[i] - off), MSG_NOSIGNAL);
            if (k > 0) {
                off += k;
                last = hvdl_now();
                continue;
            }
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

/* The next complete frame buffered from peer, consumed and copied out (handling it may
 * read more into rx and move its data): 1, 0 when none is complete, -1 on failure. */
int hvdl__frame_take(engine_t *e, int peer, int *type, uint8_t **payload, int64_t *len) {
    conn_t *c = &e->peers[peer].ctrl;
    frame_hdr_t h;
    const char *why = NULL;
    int64_t n = next_frame(e, peer, &h, 0, &why);
    if (n < 0) {
        hvdl__peer_lost(e, peer, why);
        return -1;
    }
    if (n == 0) return 0;
    uint8_t *p = HVDL_INJECT(e, INJ_FRAME_ALLOC) ? NULL : malloc((size_t)h.len + 1);
    if (!p) return hvdl__oom(e, "control frame", h.len + 1);
    memcpy(p, c->rx.data + sizeof h, (size_t)h.len);
    buf_consume(&c->rx, n);
    *type = (int)h.type;
    *payload = p;
    *len = h.len;
    return 1;
}

/* The loop's one blocking point: wait up to timeout_ms for an enqueue (wake_fd), control
 * traffic or the segment's log (its doorbell), buffering whatever arrives. Returns the
 * rank of a peer whose connection closed (frames it sent before are buffered), or -1. */
int hvdl__wait_control(engine_t *e, int timeout_ms, int wake_fd) {
    struct pollfd pf[e->size + 1];
    int ranks[e->size + 1], fds[e->size + 1];
    int n = hvdl__control_fds(e, fds, ranks, e->size);
    for (int i = 0; i < n; i++) pf[i] = (struct pollfd){fds[i], POLLIN, 0};
    pf[n] = (struct pollfd){wake_fd, POLLIN, 0};
    /* A blocking wake-up costs tens of microseconds; the next request or response often
     * arrives sooner than that, so look without sleeping for a moment first (never when
     * the ranks' threads outnumber cores: there a spinning thread steals a core that a
     * peer's or its own caller's thread needs; api.c sets spin_us). */
    int ready = 0;
    /* A one-node job's log (negotiate_shm.c) rings this rank's doorbell while it sleeps,
     * ending the sleep with EINTR; it says first that it sleeps, then looks once more. */
    if (e->negotiation->sleep_begin(e)) return -1;
    /* While it waits, a caller waiting for its op may run the loop's work (loop.c). */
    pthread_mutex_unlock(&e->drive);
    if (e->spin_us > 0 && timeout_ms != 0) {
        double until = hvdl_now() + e->spin_us * 1e-6;
        while (!(ready = poll(pf, (nfds_t)n + 1, 0)) && !e->negotiation->has_work(e) &&
               hvdl_now() < until)
            for (int k = 0; k < 32; k++) hvdl_pause();
    }
    /* Sleep even if the spin saw a new log entry: it may be waiting for its response
     * frame, which only this poll reads; an entry this rank can execute rang the
     * doorbell (or a caller watching executes it), so the poll returns at once. */
    if (!ready) ready = hvdl_poll_masked(pf, (nfds_t)n + 1, timeout_ms, e->poll_mask);
    pthread_mutex_lock(&e->drive);
    e->negotiation->sleep_end(e);
    if (ready <= 0 || e->failed) return -1;
    for (int i = 0; i < n; i++)
        if (pf[i].revents && hvdl__ctrl_read(e, ranks[i])) return ranks[i];
    return -1;
}

/* During start-up, before the loop reads control frames (clock sync reads them itself):
 * if a peer's control connection begins with an ABORT (a rank failed and says why),
 * take it and fail with its message (-1); anything else is left where it is. Waits up
 * to timeout_ms for one to arrive, and for the rest of one whose header has arrived (a
 * frame's header and payload are separate sends, so they can arrive apart). */
int hvdl__startup_abort(engine_t *e, int timeout_ms) {
    struct pollfd pf[e->size];
    int ranks[e->size], fds[e->size];
    int n = hvdl__control_fds(e, fds, ranks, e->size);
    double deadline = hvdl_now() + timeout_ms * 1e-3;
    if (n <= 0) return 0;
    for (;;) {
        for (int i = 0; i < n; i++) pf[i] = (struct pollfd){fds[i], POLLIN, 0};
        double left = deadline - hvdl_now();
        if (poll(pf, (nfds_t)n, left > 0 ? (int)(left * 1000) : 0) <= 0) return 0;
        int partial = 0;
        for (int i = 0; i < n; i++) {
            frame_hdr_t h;
            char msg[sizeof h + HVDL_MSG_BYTES];
            if (!(pf[i].revents & POLLIN) ||
                recv(fds[i], &h, sizeof h, MSG_PEEK | MSG_DONTWAIT) != (ssize_t)sizeof h ||
                h.magic != WIRE_MAGIC || h.type != MSG_ABORT || h.len < 0 ||
                h.len >= HVDL_MSG_BYTES)
                continue;
            ssize_t want = (ssize_t)(sizeof h + (size_t)h.len);
            if (recv(fds[i], msg, (size_t)want, MSG_PEEK | MSG_DONTWAIT) != want) {
                partial = 1;          /* its payload is on the way */
                continue;
            }
            if (recv(fds[i], msg, (size_t)want, MSG_DONTWAIT) != want) continue;
            return hvdl__abort_received(e, ranks[i], msg + sizeof h, h.len);
        }
        if (!partial || hvdl_now() >= deadline) return 0;
        usleep(200);
    }
}
