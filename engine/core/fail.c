/*
 * Failure: sticky, and named by the site that saw it.
 *
 * hvdl__fail records a cause on this rank: every unfinished op completes with it, later
 * enqueues fail at once, and the loop exits. The first cause wins; nothing later (and
 * no catch-all) overwrites it. Sockets stay open until shutdown, so that peers blame the
 * rank that really failed, not the ranks that noticed it.
 *
 * A failure is the job's, not one rank's, so every cause travels: hvdl__fail_job (a
 * cause found here, such as out of memory) and hvdl__peer_lost (a peer that died or
 * broke the protocol) send MSG_ABORT with the message, a worker to rank 0, rank 0 to
 * every worker; rank 0 relays a worker's verdict. A worker that sees a neighbour vanish
 * first waits a moment for rank 0's verdict, which names the true cause, rather than
 * report the neighbour's disappearance.
 */
#define _GNU_SOURCE          /* POLLRDHUP */
#include "control.h"
#include "liveness.h"
#include "net.h"
#include "p2p.h"
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How long a worker waits for rank 0's verdict after a neighbour vanished. */
#define VERDICT_GRACE_S 1.0

/* Called with mu held. */
static void complete_locked(engine_t *e, op_t *o, int status, const char *msg) {
    if (atomic_load(&o->done)) return;
    o->status = status;
    o->msg = msg ? strdup(msg) : NULL;
    strmap_del(&e->inflight, o->name);
    atomic_store(&o->done, 1);
}

void hvdl__complete(engine_t *e, op_t *o, int status, const char *msg) {
    pthread_mutex_lock(&e->mu);
    complete_locked(e, o, status, msg);
    pthread_cond_broadcast(&e->done_cv);
    pthread_mutex_unlock(&e->mu);
}

/* Complete every unfinished op with one status and message. Called with mu held. */
void hvdl__complete_all_locked(engine_t *e, int status, const char *msg) {
    for (int i = 0; i < e->inflight.cap; i++) {
        op_t *o = e->inflight.vals ? e->inflight.vals[i] : NULL;
        if (o) complete_locked(e, o, status, msg);
    }
    pthread_cond_broadcast(&e->done_cv);
}

/* The first cause is recorded (1), or one was already (0). Ops are completed only by
 * release(), after the cause has been sent on: a caller woken by its op may end the
 * process at once, and the other ranks must have heard why by then. */
int hvdl__record_failure(engine_t *e, int status, const char *msg) {
    pthread_mutex_lock(&e->mu);
    int first = !e->failed;
    if (first) {
        e->failed = 1;
        e->fail_status = status;
        /* The one funnel of every cause: an empty one would reach the user as an error
         * with no text, so it is replaced by what is known. */
        if (msg && *msg) snprintf(e->fail_msg, sizeof e->fail_msg, "%s", msg);
        else
            snprintf(e->fail_msg, sizeof e->fail_msg,
                     "rank %d (host %s) failed (%s) without naming a cause "
                     "(a bug in horovodlike)",
                     e->rank, e->host, hvdl_status_name(status));
    }
    pthread_mutex_unlock(&e->mu);
    return first;
}

static int release(engine_t *e) {
    pthread_mutex_lock(&e->mu);
    hvdl__complete_all_locked(e, e->fail_status, e->fail_msg);
    pthread_mutex_unlock(&e->mu);
    hvdl__p2p_kick(e);      /* its ops end now, not at its next look (up to 100 ms) */
    /* In an elastic job a lost rank is recovered from: the binding says so, at warning
     * level, with the round it starts next (common/elastic.py). */
    int recovered = e->cfg.elastic && e->fail_status == HVDL_ERR_PEER_LOST;
    if (e->fail_status != HVDL_ERR_SHUT_DOWN)
        hvdl__log(e, recovered ? HVDL_LOG_DEBUG : HVDL_LOG_ERROR, "%s", e->fail_msg);
    return -1;
}

static int fail_msg(engine_t *e, int status, const char *msg) {
    return hvdl__record_failure(e, status, msg) ? release(e) : -1;
}

int hvdl__fail(engine_t *e, int status, const char *fmt, ...) {
    char msg[HVDL_MSG_BYTES];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return fail_msg(e, status, msg);
}

/* Send msg as MSG_ABORT: rank 0 to every worker but `except`, a worker to rank 0. */
static void tell_everyone(engine_t *e, const char *msg, int except) {
    for (int i = 0; e->peers && i < e->size; i++) {
        if (i == e->rank || i == except || (e->rank != 0 && i != 0)) continue;
        if (e->peers[i].ctrl.fd < 0 || e->peers[i].ctrl.eof) continue;
        hvdl__send_frame(e, i, MSG_ABORT, msg, (int64_t)strlen(msg));
    }
}

int hvdl__fail_job(engine_t *e, int status, const char *fmt, ...) {
    if (e->failed) return -1;            /* the first cause is already recorded and told */
    char cause[HVDL_MSG_BYTES], msg[HVDL_MSG_BYTES];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cause, sizeof cause, fmt, ap);
    va_end(ap);
    snprintf(msg, sizeof msg, "rank %d (host %s) failed: %.700s%s%s%s", e->rank, e->host, cause,
             e->injected ? " (injected by HOROVODLIKE_TEST_INJECT=" : "",
             e->injected ? hvdl__inject_site_name(e->cfg.inject_site) : "", e->injected ? ")" : "");
    if (!hvdl__record_failure(e, status, msg)) return -1;
    tell_everyone(e, msg, -1);
    return release(e);
}

int hvdl__oom(engine_t *e, const char *what, int64_t bytes) {
    return hvdl__fail_job(e, HVDL_ERR_SYSTEM, "out of memory for a %lld-byte %s", (long long)bytes,
                          what);
}

int hvdl__abort_received(engine_t *e, int from, const void *p, int64_t n) {
    char msg[HVDL_MSG_BYTES];
    snprintf(msg, sizeof msg, "%.*s", (int)(n < HVDL_MSG_BYTES - 1 ? n : HVDL_MSG_BYTES - 1),
             (const char *)p);
    if (!hvdl__record_failure(e, HVDL_ERR_PEER_LOST, msg)) return -1;
    /* rank 0 passes a worker's verdict on, so that every rank names the same cause */
    if (e->rank == 0) tell_everyone(e, msg, from);
    return release(e);
}

/* Before naming a lost peer: has the true cause already arrived? A rank that failed
 * told rank 0 why before it went, so rank 0 reads what its control connections hold; a
 * worker waits up to the grace for rank 0's verdict (a rank 0 that is gone shows it at
 * once: its connection is closed, behind any verdict it sent). */
static int verdict_arrived(engine_t *e, int peer) {
    if (e->awaiting_verdict || !e->peers || e->size < 2) return 0;
    e->awaiting_verdict = 1;
    if (e->rank == 0) {
        hvdl__watch_control(e, 0);
    } else if (e->peers[0].ctrl.fd >= 0 && !e->peers[0].ctrl.eof) {
        conn_t *c0 = &e->peers[0].ctrl;
        double until = hvdl_now() + VERDICT_GRACE_S;
        for (;;) {
            struct pollfd pf = {c0->fd, POLLIN, 0};
            double left = until - hvdl_now();
            if (poll(&pf, 1, left > 0 ? (int)(left * 1000) + 1 : 0) <= 0) break;
            if (hvdl__control_readable(e, 0) || e->failed || (pf.revents & (POLLHUP | POLLERR)))
                break;
            if (hvdl_now() >= until) break;
        }
    }
    e->awaiting_verdict = 0;
    return e->failed;
}

/* This rank did not run for `gap` s (hvdl__liveness_own_gap): the loss it sees now
 * (peer, why) is its peers' answer to its own silence, not their failure. It names
 * itself, as they do, and tells them so. */
static void lost_itself(engine_t *e, double gap, int peer, const char *why) {
    char seen[300] = "", msg[HVDL_MSG_BYTES];
    if (why) snprintf(seen, sizeof seen, " (it then found rank %d: %s)", peer, why);
    snprintf(msg, sizeof msg,
             "rank %d (host %s) was lost: it did not run for %.1f s "
             "(HOROVODLIKE_PEER_TIMEOUT_SECONDS is %g): the process was stopped or starved, "
             "and its peers gave up on it%s. %s",
             e->rank, e->host, gap, e->cfg.peer_timeout, seen,
             e->cfg.elastic ? "The elastic job goes on in a new round without it"
                            : "horovodlike cannot go on without it; the job should be restarted");
    if (!hvdl__record_failure(e, HVDL_ERR_PEER_LOST, msg)) return;
    tell_everyone(e, msg, -1);
    release(e);
}

/* A peer died or broke the protocol. Rank 0 tells every other rank who it was, so the
 * whole job reports the same culprit; a worker tells rank 0, which relays it. */
void hvdl__peer_lost(engine_t *e, int peer, const char *why) {
    if (e->failed || e->stopped) return;
    double gap = hvdl__liveness_own_gap(e, hvdl_now());
    if (gap > 0) {
        lost_itself(e, gap, peer, why);
        return;
    }
    if (verdict_arrived(e, peer) || e->failed || e->stopped) return;
    char msg[HVDL_MSG_BYTES], silent[160];
    /* A worker whose coordinator went silent cannot hear the others' verdicts (they
     * travel through rank 0), so a neighbour that gave up on rank 0 first and closed
     * looks lost itself. Rank 0 missing two heartbeats is the real story: name it. */
    const conn_t *c0 = e->rank != 0 && peer != 0 && e->peers ? &e->peers[0].ctrl : NULL;
    double quiet = c0 && c0->fd >= 0 && !c0->eof ? hvdl_now() - c0->last_rx : 0;
    /* The same when rank 0 has died: its control connection is closed, maybe behind
     * frames not read yet (POLLRDHUP sees past them). */
    struct pollfd pf = {c0 && c0->fd >= 0 ? c0->fd : -1, POLLRDHUP, 0};
    int closed = c0 && (c0->eof || (pf.fd >= 0 && poll(&pf, 1, 0) > 0 &&
                                    (pf.revents & (POLLRDHUP | POLLHUP | POLLERR))));
    if (closed || quiet > 2 * hvdl__heartbeat_interval(e)) {
        if (closed)
            snprintf(silent, sizeof silent,
                     "its connection closed (rank %d gave up "
                     "meanwhile: %s)",
                     peer, why);
        else
            snprintf(silent, sizeof silent,
                     "it sent nothing for %.1f s (rank %d gave up "
                     "meanwhile: %s)",
                     quiet, peer, why);
        peer = 0;
        why = silent;
    }
    /* rank 0 names the ops the others wait on that the lost rank never submitted */
    char missing[512] = "", never[600] = "";
    if (e->rank == 0) hvdl__never_submitted(e, peer, missing, sizeof missing);
    if (missing[0]) snprintf(never, sizeof never, " It never submitted %s.", missing);
    snprintf(msg, sizeof msg, "rank %d (host %s) was lost: %s.%s %s", peer, e->peers[peer].host,
             why, never,
             e->cfg.elastic ? "The elastic job goes on in a new round without it"
                            : "horovodlike cannot go on without it; the job should be restarted");
    if (!hvdl__record_failure(e, HVDL_ERR_PEER_LOST, msg)) return;
    tell_everyone(e, msg, peer);
    release(e);
}

/* A frame from `from` that this rank cannot accept: the sender is broken or hostile,
 * and the job cannot go on with it. */
int hvdl__malformed(engine_t *e, int from, const char *what, const char *why) {
    char msg[256];
    snprintf(msg, sizeof msg, "sent a malformed %s (%s)", what, why ? why : "unreadable");
    hvdl__peer_lost(e, from, msg);
    return -1;
}
