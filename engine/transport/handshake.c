/*
 * Start-up connections: who connects to whom, and the hello that proves a connection
 * comes from this job's rank `from_rank`, meant for this rank, on the expected channel.
 *
 * Topology: a full mesh of data sockets (rank j connects to every i < j), a second full
 * mesh for point-to-point messages (p2p.c), and a star of control sockets (every worker
 * connects to rank 0, before its data sockets). A hello is accepted only in that
 * direction: a data or p2p hello from a higher rank, a control hello only by rank 0. A
 * start-up that fails names the rank that stopped it: silent (a connector read nothing
 * until the deadline), closed, or never arrived (name_missing).
 *
 * The hello with a job key (HMAC-SHA256 challenge-response, mutual):
 *
 *   connector -> acceptor  hello {magic, version, from, to, channel, keyed=1,
 *                                 the acceptor's nonce, challenge Cc (32 random bytes)}
 *   acceptor -> connector  reply {magic, challenge Ca, HMAC(key, "hvdl accept " || hello || Ca)}
 *   connector -> acceptor  HMAC(key, "hvdl connect" || hello || Ca)
 *
 * Each side checks the other's HMAC before trusting the connection; the key never
 * crosses the wire, the labels keep one side's answer from being replayed as the
 * other's, and fresh challenges keep an old answer from being replayed at all. Without
 * a key (a single rank, or a caller that has none) the hello carries keyed=0 and the
 * nonce from the acceptor's blob is the only check, as before.
 *
 * The acceptor reads every pending hello at once (poll over all of them), each with its
 * own deadline, so silent or slow connections never hold up the genuine ones; when the
 * table of pending connections is full the oldest is dropped. Nothing is read from a
 * connection before its hello has passed. The listener is closed once every peer is in.
 */
#define _GNU_SOURCE
#include "fail.h"
#include "net.h"
#include "auth.h"
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

enum { CH_DATA = 0, CH_CONTROL = 1, CH_P2P = 2 };   /* p2p: point-to-point messages (p2p.c) */
#define HELLO_SECONDS 10.0     /* one connection's hello must complete within this */
#define CHALLENGE 32

typedef struct hello {
    uint32_t magic, version, from_rank, to_rank, channel, keyed;
    uint64_t nonce;                     /* the acceptor's, from its blob */
    uint8_t challenge[CHALLENGE];       /* the connector's (zeros when keyed = 0) */
} hello_t;

typedef struct reply {
    uint32_t magic, pad;
    uint8_t challenge[CHALLENGE];       /* the acceptor's */
    uint8_t proof[HVDL_SHA256_BYTES];   /* the acceptor's answer to the connector's */
} reply_t;

static const char LABEL_ACCEPT[] = "hvdl accept ", LABEL_CONNECT[] = "hvdl connect";
_Static_assert(sizeof LABEL_ACCEPT == sizeof LABEL_CONNECT, "labels of one length");

static void proof(engine_t *e, const char *label, const hello_t *h,
                  const uint8_t *acceptor_challenge, uint8_t out[HVDL_SHA256_BYTES]) {
    const void *parts[3] = {label, h, acceptor_challenge};
    size_t lens[3] = {sizeof LABEL_ACCEPT - 1, sizeof *h, CHALLENGE};
    hvdl__hmac_sha256(e->key, (size_t)e->key_len, 3, parts, lens, out);
}

/* ---- connecting ---- */

/* connect() bounded by the deadline; the socket is left non-blocking. */
static int connect_by(int fd, const struct sockaddr_in *a, double deadline) {
    if (hvdl__set_nonblocking(fd)) return -1;
    if (connect(fd, (const struct sockaddr *)a, sizeof *a) == 0) return 0;
    if (errno != EINPROGRESS) return -1;
    struct pollfd pf = {fd, POLLOUT, 0};
    int ms = (int)((deadline - hvdl_now()) * 1000);
    if (ms <= 0 || poll(&pf, 1, ms) <= 0) {
        errno = ETIMEDOUT;
        return -1;
    }
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) || err) {
        errno = err ? err : errno;
        return -1;
    }
    return 0;
}

/* Our side of the hello on a connected socket: 0, or -1 after hvdl__fail. */
static int hello_as_connector(engine_t *e, int fd, int peer, int channel, double deadline) {
    peer_t *p = &e->peers[peer];
    hello_t h = {WIRE_MAGIC,        WIRE_VERSION,   (uint32_t)e->rank, (uint32_t)peer,
                 (uint32_t)channel, e->key_len > 0, p->nonce,          {0}};
    if (e->key_len && hvdl_random_bytes(h.challenge, CHALLENGE)) {
        hvdl__fail(e, HVDL_ERR_SYSTEM, "no random bytes for the connection handshake: %s",
                   strerror(errno));
        return -1;
    }
    if (hvdl__io_full(fd, &h, sizeof h, 1, deadline)) goto lost;
    if (!e->key_len) return 0;
    reply_t r;
    uint8_t want[HVDL_SHA256_BYTES], mine[HVDL_SHA256_BYTES];
    if (hvdl__io_full(fd, &r, sizeof r, 0, deadline)) {
        /* Only a failed proof (below) means another key: a peer that says nothing is
         * stopped or hung, and one that hangs up exited or turned the hello away. */
        if (errno == ETIMEDOUT)
            hvdl__fail(
                e, HVDL_ERR_PEER_LOST,
                "rank %d (host %s) was lost: it accepted the start-up "
                "connection (%s:%d) but was silent until the start-up deadline, %.0f s "
                "(horovodlikerun --start-timeout, or HOROVODLIKE_START_TIMEOUT): it is stopped, hung or overloaded",
                peer, p->host, p->ip, p->port, e->cfg.start_timeout);
        else
            hvdl__fail(e, HVDL_ERR_PEER_LOST,
                       "rank %d (host %s) was lost: it closed the start-up "
                       "connection (%s:%d) before answering the hello: it exited, or that port is "
                       "not this job's rank %d",
                       peer, p->host, p->ip, p->port, peer);
        return -1;
    }
    proof(e, LABEL_ACCEPT, &h, r.challenge, want);
    if (r.magic != WIRE_MAGIC || !hvdl__equal_ct(want, r.proof, sizeof want)) {
        hvdl__fail(e, HVDL_ERR_PEER_LOST,
                   "rank %d (host %s, %s:%d) did not prove that it holds the "
                   "job key: the ranks were not given the same key, or another process answers "
                   "on that port",
                   peer, p->host, p->ip, p->port);
        return -1;
    }
    proof(e, LABEL_CONNECT, &h, r.challenge, mine);
    if (hvdl__io_full(fd, mine, sizeof mine, 1, deadline)) goto lost;
    return 0;
lost:
    hvdl__fail(e, HVDL_ERR_PEER_LOST,
               "rank %d (host %s) was lost: the start-up connection (%s:%d) "
               "failed during the hello: %s",
               peer, p->host, p->ip, p->port,
               errno == ETIMEDOUT ? "it took nothing until the start-up deadline"
                                  : strerror(errno));
    return -1;
}

static int connect_to(engine_t *e, int peer, int channel, double deadline) {
    peer_t *p = &e->peers[peer];
    /* Every peer is dialled at the address it advertised, which is where it listens
     * (loopback for a single-host job, one interface otherwise). A peer on our own node
     * is reached through the loopback device either way: the kernel routes a local
     * address there, so dialling 127.0.0.1 would gain nothing and finds nobody when the
     * peer listens on its interface only. */
    const char *ip = p->ip;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p->port)};
    if (inet_pton(AF_INET, ip, &a.sin_addr) != 1) {
        hvdl__fail(e, HVDL_ERR_INVALID, "rank %d (host %s) advertised a bad address '%s'", peer,
                   p->host, ip);
        return -1;
    }
    for (;;) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            hvdl__fail(e, HVDL_ERR_SYSTEM,
                       "cannot open a socket to connect to rank %d (host %s): %s", peer, p->host,
                       strerror(errno));
            return -1;
        }
        hvdl__tune_socket(e, fd);
        if (connect_by(fd, &a, deadline) == 0) {
            /* Connected: the hello either passes or fails the job (no retry, so a
             * mismatched key is reported at once rather than after the deadline). */
            if (hello_as_connector(e, fd, peer, channel, deadline) == 0) return fd;
            close(fd);
            return -1;
        }
        int err = errno;
        close(fd);
        if (hvdl_now() > deadline) {
            hvdl__fail(e, HVDL_ERR_PEER_LOST,
                       "could not connect to rank %d (host %s, %s:%d) within "
                       "%.0f s (horovodlikerun --start-timeout, or HOROVODLIKE_START_TIMEOUT): %s",
                       peer, p->host, ip, p->port, e->cfg.start_timeout, strerror(err));
            return -1;
        }
        usleep(20000);
    }
}

/* ---- accepting ---- */

typedef struct pending_conn {
    int fd;
    double deadline;
    int proving;                        /* hello read, reply sent; reading the proof */
    size_t got;                         /* bytes of the current message read so far */
    hello_t h;
    uint8_t challenge[CHALLENGE];       /* ours, sent in the reply */
    uint8_t answer[HVDL_SHA256_BYTES];
    char who[64];                       /* the remote address, for messages */
} pending_conn_t;

typedef struct acceptor {
    pending_conn_t *v;
    int n, cap;
    int rejected;                       /* how many were turned away (logs are capped) */
    const engine_t *e;                  /* whose log says so */
} acceptor_t;

static void drop(acceptor_t *a, int i, const char *why) {
    if (why && a->rejected++ < 8)
        hvdl__log(a->e, HVDL_LOG_WARNING, "rejected a connection from %s: %s", a->v[i].who, why);
    close(a->v[i].fd);
    a->v[i] = a->v[--a->n];
}

/* Why this hello is not one we expect, or NULL. */
static const char *hello_problem(engine_t *e, const hello_t *h) {
    if (h->magic != WIRE_MAGIC || h->version != WIRE_VERSION)
        return "not a horovodlike hello (another program, or another horovodlike version)";
    if (h->keyed != (uint32_t)(e->key_len > 0))
        return h->keyed ? "it offers a job key and this rank has none"
                        : "it has no job key and this job has one";
    if (h->to_rank != (uint32_t)e->rank) return "it was meant for another rank";
    if (h->nonce != e->nonce) return "its nonce is not this rank's (not meant for this job)";
    if (h->from_rank >= (uint32_t)e->size || h->from_rank == (uint32_t)e->rank) return "bad rank";
    if ((h->channel == CH_DATA || h->channel == CH_P2P) && h->from_rank < (uint32_t)e->rank)
        return "a data connection from a lower rank (they only connect upwards)";
    if (h->channel == CH_CONTROL && e->rank != 0) return "a control connection to a worker";
    if (h->channel > CH_P2P) return "unknown channel";
    return NULL;
}

/* The connection passed: file it under its rank and channel. */
static int admit(engine_t *e, acceptor_t *a, int i, int *expected) {
    hello_t *h = &a->v[i].h;
    peer_t *p = &e->peers[h->from_rank];
    int *slot = h->channel == CH_DATA  ? &p->data_fd
                : h->channel == CH_P2P ? &p->p2p_fd
                                       : &p->ctrl.fd;
    if (*slot >= 0) {
        drop(a, i, "a second connection for the same rank and channel");
        return 0;
    }
    *slot = a->v[i].fd;
    a->v[i] = a->v[--a->n];
    (*expected)--;
    return 0;
}

/* Read what connection i has; advance its hello. */
static void advance(engine_t *e, acceptor_t *a, int i, int *expected) {
    pending_conn_t *c = &a->v[i];
    uint8_t *dst = c->proving ? c->answer : (uint8_t *)&c->h;
    size_t want = c->proving ? sizeof c->answer : sizeof c->h;
    ssize_t k = recv(c->fd, dst + c->got, want - c->got, 0);
    if (k == 0) {
        drop(a, i, "closed before finishing its hello");
        return;
    }
    if (k < 0) {
        if (errno != EAGAIN && errno != EINTR) drop(a, i, strerror(errno));
        return;
    }
    if ((c->got += (size_t)k) < want) return;
    c->got = 0;
    if (!c->proving) {
        const char *why = hello_problem(e, &c->h);
        if (why) {
            drop(a, i, why);
            return;
        }
        if (!e->key_len) {
            admit(e, a, i, expected);
            return;
        }
        reply_t r = {WIRE_MAGIC, 0, {0}, {0}};
        if (hvdl_random_bytes(c->challenge, CHALLENGE)) {
            drop(a, i, "no random bytes");
            return;
        }
        memcpy(r.challenge, c->challenge, CHALLENGE);
        proof(e, LABEL_ACCEPT, &c->h, c->challenge, r.proof);
        /* 72 bytes into an empty socket buffer: all or nothing */
        if (send(c->fd, &r, sizeof r, MSG_NOSIGNAL) != (ssize_t)sizeof r) {
            drop(a, i, "could not reply");
            return;
        }
        c->proving = 1;
        return;
    }
    uint8_t want_proof[HVDL_SHA256_BYTES];
    proof(e, LABEL_CONNECT, &c->h, c->challenge, want_proof);
    if (!hvdl__equal_ct(want_proof, c->answer, sizeof want_proof)) {
        drop(a, i, "wrong answer to the challenge (it does not hold this job's key)");
        return;
    }
    admit(e, a, i, expected);
}

/* Take one connection off the listener into the table (dropping the oldest if full). */
static void take(engine_t *e, acceptor_t *a, double deadline) {
    struct sockaddr_in from;
    socklen_t len = sizeof from;
    int fd = accept4(e->listen_fd, (struct sockaddr *)&from, &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    if (a->n == a->cap) {
        int oldest = 0;
        for (int i = 1; i < a->n; i++)
            if (a->v[i].deadline < a->v[oldest].deadline) oldest = i;
        drop(a, oldest, "too many connections waiting to say hello");
    }
    pending_conn_t *c = &a->v[a->n++];
    memset(c, 0, sizeof *c);
    c->fd = fd;
    double mine = hvdl_now() +
                  (HELLO_SECONDS < e->cfg.start_timeout ? HELLO_SECONDS : e->cfg.start_timeout);
    c->deadline = mine < deadline ? mine : deadline;
    char ip[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &from.sin_addr, ip, sizeof ip);
    snprintf(c->who, sizeof c->who, "%s:%d", ip, ntohs(from.sin_port));
}

/* The start-up deadline passed with connections missing: name the rank that never
 * arrived. A rank that connected none of the connections it owes us comes first (it is
 * the one that is stopped or gone; a rank that got part of the way is held up by it), and
 * the message says "rank N (host H) was lost" as every other report of a lost rank does,
 * so the launcher names the same rank. */
static void name_missing(engine_t *e) {
    int culprit = -1, partial = -1, others = 0;
    for (int r = 0; r < e->size; r++) {
        if (r == e->rank) continue;
        int owed = 0, came = 0;
        if (r > e->rank) {
            owed += 2;
            came += (e->peers[r].data_fd >= 0) + (e->peers[r].p2p_fd >= 0);
        }
        if (e->rank == 0) {
            owed++;
            came += e->peers[r].ctrl.fd >= 0;
        }
        if (came == owed) continue;
        if (came == 0 && culprit < 0) culprit = r;
        else if (came > 0 && partial < 0) partial = r;
        else others++;
    }
    if (culprit < 0 && partial < 0) {
        hvdl__fail(e, HVDL_ERR_PEER_LOST,
                   "rank %d: start-up did not finish within %.0f s "
                   "(horovodlikerun --start-timeout, or HOROVODLIKE_START_TIMEOUT)",
                   e->rank, e->cfg.start_timeout);
        return;
    }
    int r = culprit >= 0 ? culprit : partial;
    if (culprit >= 0 && partial >= 0) others++;
    hvdl__fail(
        e, HVDL_ERR_PEER_LOST,
        "rank %d (host %s) was lost: %s within %.0f s of start-up "
        "(horovodlikerun --start-timeout, or HOROVODLIKE_START_TIMEOUT): it is stopped, hung or gone%s",
        r, e->peers[r].host,
        culprit >= 0 ? "it never connected to this rank" : "it connected only part of the way",
        e->cfg.start_timeout,
        others ? " (connections of other ranks are missing too, maybe held up by it)" : "");
}

/* Accept until every expected connection has passed its hello; reject anything else. */
static int accept_expected(engine_t *e, int expected, double deadline) {
    acceptor_t a = {.e = e};
    a.cap = 2 * e->size + 64;
    a.v = calloc((size_t)a.cap, sizeof *a.v);
    struct pollfd *pf = calloc((size_t)a.cap + 1, sizeof *pf);
    int rc = a.v && pf ? 0
                       : hvdl__fail(e, HVDL_ERR_SYSTEM,
                                    "out of memory for the table of %d start-up "
                                    "connections",
                                    a.cap);
    while (!rc && expected > 0) {
        double now = hvdl_now();
        if (now >= deadline) {
            name_missing(e);
            rc = -1;
            break;
        }
        for (int i = 0; i < a.n;)           /* a hello past its deadline is dropped */
            if (a.v[i].deadline <= now) drop(&a, i, "no complete hello in time");
            else i++;
        double next = deadline;
        for (int i = 0; i < a.n; i++) {
            pf[i] = (struct pollfd){a.v[i].fd, POLLIN, 0};
            if (a.v[i].deadline < next) next = a.v[i].deadline;
        }
        pf[a.n] = (struct pollfd){e->listen_fd, POLLIN, 0};
        int n = a.n;
        if (poll(pf, (nfds_t)n + 1, (int)((next - now) * 1000) + 1) <= 0) continue;
        /* Walk backwards: advance() may move the last entry into slot i. */
        for (int i = n - 1; i >= 0; i--)
            if (pf[i].revents) advance(e, &a, i, &expected);
        if (pf[n].revents) take(e, &a, deadline);
    }
    while (a.n) drop(&a, a.n - 1, NULL);
    free(a.v);
    free(pf);
    return rc;
}

int hvdl__connect_all(engine_t *e) {
    double deadline = hvdl_now() + e->cfg.start_timeout;
    /* Control to rank 0 first, then data upwards from rank 0: a rank that waits on a
     * stopped peer has already given rank 0 everything it owes it, so rank 0 can tell the
     * stopped rank (nothing arrived) from those it holds up (see name_missing). */
    if (e->rank > 0 && (e->peers[0].ctrl.fd = connect_to(e, 0, CH_CONTROL, deadline)) < 0)
        return -1;
    for (int i = 0; i < e->rank; i++) {
        if ((e->peers[i].data_fd = connect_to(e, i, CH_DATA, deadline)) < 0) return -1;
        if ((e->peers[i].p2p_fd = connect_to(e, i, CH_P2P, deadline)) < 0) return -1;
    }
    int expected = 2 * (e->size - 1 - e->rank) + (e->rank == 0 ? e->size - 1 : 0);
    if (accept_expected(e, expected, deadline)) return -1;
    /* Every peer is in: nobody else may connect (nor have the kernel queue data for us). */
    close(e->listen_fd);
    e->listen_fd = -1;
    for (int i = 0; i < e->size; i++) {
        if (e->peers[i].data_fd >= 0) hvdl__set_nonblocking(e->peers[i].data_fd);
        if (e->peers[i].ctrl.fd >= 0) hvdl__set_nonblocking(e->peers[i].ctrl.fd);
        if (e->peers[i].p2p_fd >= 0) hvdl__set_nonblocking(e->peers[i].p2p_fd);
    }
    return 0;
}
