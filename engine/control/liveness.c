/*
 * Liveness: every rank notices a peer that stops, wherever it stops.
 *
 * The control star carries a heartbeat (MSG_HEARTBEAT, no payload) in each direction
 * whenever nothing else was sent on it for a heartbeat interval (a quarter of
 * HOROVODLIKE_PEER_TIMEOUT_SECONDS, at most 5 s): rank 0 to every worker, every worker
 * to rank 0. A control connection that brings nothing for HOROVODLIKE_PEER_TIMEOUT_SECONDS
 * means the process at the other end is stopped, hung or cut off:
 *   - rank 0 names the silent worker and sends ABORT naming it to everyone else;
 *   - a worker whose rank 0 went silent names rank 0 (every worker does, on its own).
 * So every survivor names the same rank, the one that stopped, and never a neighbour
 * that was only waiting for it. The ticks run in the loop and inside every wait (a TCP
 * transfer, a shared-memory phase, a blocked send), so a rank busy in a long collective
 * keeps beating. The data paths' own "no progress" timeouts wait one interval longer,
 * so that the heartbeat verdict, which names the right rank, comes first.
 *
 * The same holds at shutdown (shutdown.c): rank 0 names a worker that does not leave.
 *
 * A rank that was itself stopped (SIGSTOP, as mpirun's prterun resumes one to kill it)
 * or starved past the peer timeout finds, once it runs again, its peers gone or silent:
 * that is their answer to its silence, not their failure. Its own ticks show the gap
 * (hvdl__liveness_own_gap), so it names itself (fail.c) rather than a healthy rank.
 *
 * Cost on the hot path: one comparison of the clock against next_tick.
 */
#include "fail.h"
#include "net.h"
#include <stdio.h>

double hvdl__heartbeat_interval(const engine_t *e) {
    double hb = e->cfg.peer_timeout / 4;
    return hb > 5.0 ? 5.0 : hb < 0.05 ? 0.05 : hb;
}

void hvdl__liveness_start(engine_t *e) {
    double now = hvdl_now();
    for (int i = 0; i < e->size; i++) e->peers[i].ctrl.last_rx = e->peers[i].ctrl.last_tx = now;
    e->next_tick = now;
}

/* A gap since the last tick past the peer timeout less one interval means this rank
 * did not run: ticks come every half interval, and each leaves less than an interval
 * since the last frame it sent, so its peers may have heard nothing for the peer
 * timeout and given it up. (0: no such gap.) */
static double stood_still(const engine_t *e, double now) {
    double hb = hvdl__heartbeat_interval(e), gap = now - (e->next_tick - hb / 2);
    return gap > e->cfg.peer_timeout - hb ? gap : 0;
}

/* The gap the last tick saw; or, when no tick (nor a verdict wait) is under way to
 * explain a late one, the gap since then: a rank that wakes may find a loss before its
 * next tick does. */
double hvdl__liveness_own_gap(const engine_t *e, double now) {
    if (e->next_tick <= 0 || e->size < 2) return 0;
    if (e->stood_still || e->in_tick || e->awaiting_verdict) return e->stood_still;
    return stood_still(e, now);
}

int hvdl__liveness_tick(engine_t *e) {
    if (e->in_tick || e->failed || e->stopped || e->size < 2) return e->failed ? -1 : 0;
    double now = hvdl_now(), hb = hvdl__heartbeat_interval(e);
    e->stood_still = stood_still(e, now); /* for the losses this tick finds */
    e->next_tick = now + hb / 2;
    e->in_tick = 1;
    for (int i = 0; i < e->size && !e->failed && !e->stopped; i++) {
        conn_t *c = &e->peers[i].ctrl;
        if (c->fd < 0 || c->eof) continue;
        if (now - c->last_rx > e->cfg.peer_timeout) {
            /* Frames may be waiting unread (a transfer that never idles does not read
             * control sockets): look before judging. */
            if (hvdl__control_readable(e, i)) break;
            if (hvdl_now() - c->last_rx > e->cfg.peer_timeout) {
                char why[160];
                snprintf(why, sizeof why,
                         "it sent nothing for %.0f s (HOROVODLIKE_PEER_TIMEOUT_SECONDS): "
                         "the process is stopped, hung or cut off",
                         e->cfg.peer_timeout);
                hvdl__peer_lost(e, i, why);
                break;
            }
        }
        if (now - c->last_tx >= hb) hvdl__send_frame(e, i, MSG_HEARTBEAT, NULL, 0);
    }
    e->in_tick = 0;
    return e->failed ? -1 : 0;
}

int hvdl__liveness_ms(const engine_t *e) {
    if (e->size < 2) return -1;
    double left = e->next_tick - hvdl_now();
    return left <= 0 ? 0 : (int)(left * 1000) + 1;
}
