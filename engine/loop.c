/*
 * The background loop: one thread per engine, and the only thread that does I/O.
 *
 * It sleeps in poll() until an enqueue (the wake eventfd) or a control frame arrives, so
 * an idle engine costs nothing. A request that finds nothing else in flight is announced
 * at once; requests that arrive while others are in flight wait out HOROVOD_CYCLE_TIME
 * from the oldest one, so that requests made close together (a backward pass) are
 * announced, negotiated and fused together; rank 0 also turns
 * whatever has become ready on every rank into responses and executes them. Workers
 * execute responses as their frames arrive (negotiate.c).
 *
 * Failure is sticky: hvdl__fail completes every unfinished op with the error, makes
 * later enqueues fail at once, and the loop exits. Sockets stay open until shutdown so
 * that peers blame the rank that really died, not the ranks that noticed it.
 */
#define _GNU_SOURCE          /* POLLRDHUP */
#include "internal.h"
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void hvdl__queue_push(op_queue_t *q, op_t *o) {
    o->next = NULL;
    if (q->tail) q->tail->next = o;
    else q->head = o;
    q->tail = o;
}

op_t *hvdl__queue_pop(op_queue_t *q) {
    op_t *o = q->head;
    if (!o) return NULL;
    q->head = o->next;
    if (!q->head) q->tail = NULL;
    o->next = NULL;
    return o;
}

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

/* Fail every unfinished op with one status and message. Called with mu held. */
static void complete_all_locked(engine_t *e, int status, const char *msg) {
    for (int i = 0; i < e->inflight.cap; i++) {
        op_t *o = e->inflight.vals ? e->inflight.vals[i] : NULL;
        if (o) complete_locked(e, o, status, msg);
    }
    pthread_cond_broadcast(&e->done_cv);
}

void hvdl__fail(engine_t *e, int status, const char *fmt, ...) {
    char msg[HVDL_MSG_BYTES];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&e->mu);
    int first = !e->failed;
    if (first) {
        e->failed = 1;
        e->fail_status = status;
        snprintf(e->fail_msg, sizeof e->fail_msg, "%s", msg);
        complete_all_locked(e, status, msg);
    }
    pthread_mutex_unlock(&e->mu);
    if (first && status != HVDL_ERR_SHUT_DOWN) hvdl__log(HVDL_LOG_ERROR, "%s", msg);
}

/* A peer died or broke the protocol. Rank 0 tells every other rank who it was, so the
 * whole job reports the same culprit; a worker tells rank 0, which relays it. */
void hvdl__peer_lost(engine_t *e, int peer, const char *why) {
    if (e->failed || e->stopped) return;
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
            snprintf(silent, sizeof silent, "its connection closed (rank %d gave up "
                     "meanwhile: %s)", peer, why);
        else
            snprintf(silent, sizeof silent, "it sent nothing for %.1f s (rank %d gave up "
                     "meanwhile: %s)", quiet, peer, why);
        peer = 0;
        why = silent;
    }
    snprintf(msg, sizeof msg, "rank %d (host %s) was lost: %s. horovodlike cannot go on "
             "without it; the job should be restarted", peer, e->peers[peer].host, why);
    hvdl__fail(e, HVDL_ERR_PEER_LOST, "%s", msg);
    for (int i = 0; i < e->size; i++) {
        if (i == peer || e->peers[i].ctrl.fd < 0) continue;
        hvdl__send_frame(e, i, MSG_ABORT, msg, (int64_t)strlen(msg));
    }
}

/* Move newly enqueued ops to the loop's own queue; returns whether shutdown was asked. */
static int take_incoming(engine_t *e) {
    hvdl_wakefd_drain(e->wake_fd);
    pthread_mutex_lock(&e->mu);
    op_t *o;
    while ((o = hvdl__queue_pop(&e->incoming))) {
        if (!e->unsent.head) e->first_unsent_at = hvdl_now();
        hvdl__queue_push(&e->unsent, o);
    }
    int bye = e->shutdown_requested;
    pthread_mutex_unlock(&e->mu);
    return bye;
}

/* How long poll() may sleep: until the cycle ends if requests wait to be announced,
 * a second if rank 0 has something to watch for stalls, else until woken. */
static int sleep_ms(engine_t *e, double now) {
    if (e->unsent.head && e->mine.count == 0) return 0;
    if (e->unsent.head) {
        double left = e->first_unsent_at + e->cfg.cycle_time - now;
        return left <= 0 ? 0 : (int)(left * 1000) + 1;
    }
    int ms = hvdl__coordinator_pending(e) && e->cfg.stall_check ? 1000 : -1;
    int beat = hvdl__liveness_ms(e);          /* heartbeats and the check on peers */
    return ms < 0 || (beat >= 0 && beat < ms) ? beat : ms;
}

void *hvdl__loop(void *arg) {
    engine_t *e = arg;
    while (!e->failed && !e->stopped) {
        int bye = take_incoming(e);
        double now = hvdl_now();
        if (hvdl__tl_mark_cycles(e)) hvdl__tl_instant(e, TL_CYCLES, "CYCLE_START", now, NULL);
        /* An engine with nothing awaiting a response announces at once: there is nothing
         * to fuse with, and waiting would only add latency. Requests that arrive while
         * others are in flight wait out the cycle and travel (and fuse) together. */
        int idle = e->mine.count == 0;
        if (e->unsent.head && (bye || idle || now - e->first_unsent_at >= e->cfg.cycle_time) &&
            hvdl__announce(e))
            break;
        if (bye && !e->bye_sent) {
            e->bye_sent = 1;
            if (hvdl__say_bye(e)) break;
        }
        if (e->rank == 0) {
            if (hvdl__coordinator_step(e)) break;
            hvdl__stall_check(e, now);
        }
        if (hvdl__liveness_check(e, hvdl_now())) break;
        if (e->failed || e->stopped) break;
        if (hvdl__pump_control(e, sleep_ms(e, hvdl_now()), e->wake_fd)) break;
    }
    /* From here on enqueue refuses (it checks this flag under mu), so every op that made
     * it in is completed below and none can slip in after. */
    pthread_mutex_lock(&e->mu);
    e->shutdown_requested = 1;
    if (!e->failed)
        complete_all_locked(e, HVDL_ERR_SHUT_DOWN,
                            "horovodlike was shut down (a rank called shutdown) before this op finished");
    pthread_mutex_unlock(&e->mu);
    if (e->stopped && !e->failed) hvdl__goodbye(e);
    return NULL;
}
