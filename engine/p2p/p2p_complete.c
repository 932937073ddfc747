/*
 * Completion and failure of point-to-point ops: an op ends (its status and message
 * under the engine's mu, its waiter woken), and a broken peer is reported to the
 * loop thread, which tells the job (hvdl__p2p_tend).
 *
 * Failure: a dead peer closes the connection; a stopped one is found by the engine's
 * heartbeats (liveness.c) within HOROVODLIKE_PEER_TIMEOUT_SECONDS. Either way the engine
 * fails with the peer's name, and the p2p thread fails its waiting ops with that message.
 */
#define _GNU_SOURCE
#include "p2p_internal.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void hvdl__p2p_finish(engine_t *e, pmsg_t *m, int status, const char *msg) {
    op_t *o = m->op;
    struct p2p *p = e->p2p;
    double now = hvdl_now();
    if (TL_ON(e) && status == HVDL_OK) {
        char args[160];
        snprintf(args, sizeof args, "\"peer\": %d, \"bytes\": %lld", m->peer,
                 (long long)(o->meta.op == HVDL_OP_SEND ? o->nbytes : o->result.nbytes));
        buf_t b = {0};
        hvdl__json_str(&b, o->name);
        if (b.data) {
            char *full = malloc((size_t)b.len + sizeof args + 16);
            if (full) {
                snprintf(full, (size_t)b.len + sizeof args + 16, "\"name\": %.*s, %s", (int)b.len,
                         (const char *)b.data, args);
                hvdl__tl_span(e, TL_P2P, hvdl__op_trace_name(o->meta.op), m->started, now, full);
                free(full);
            }
        }
        buf_free(&b);
    }
    pthread_mutex_lock(&e->mu);
    if (!atomic_load(&o->done)) {
        o->status = status;
        o->msg = msg ? strdup(msg) : NULL;
        atomic_store(&o->done, 1);
    }
    pthread_cond_broadcast(&e->done_cv);
    pthread_mutex_unlock(&e->mu);
    free(m);
    atomic_fetch_sub(&p->npending, 1);
}

/* Complete an op that has no pmsg (none could be allocated, or it was never queued). */
void hvdl__p2p_finish_bare(engine_t *e, op_t *o, int status, const char *msg) {
    pthread_mutex_lock(&e->mu);
    o->status = status;
    o->msg = strdup(msg);
    atomic_store(&o->done, 1);
    pthread_cond_broadcast(&e->done_cv);
    pthread_mutex_unlock(&e->mu);
}

/* An op whose peer closed its p2p connection: what it ends with. While the job runs the
 * peer was lost (the loop thread fails the job with that); after a shutdown the peer
 * simply left, without sending (or reading) this message. */
void hvdl__p2p_finish_closed(engine_t *e, pmsg_t *m, int over) {
    char why[HVDL_MSG_BYTES];
    const char *host = e->peers[m->peer].host;
    int send = m->op->meta.op == HVDL_OP_SEND;
    if (!over)
        snprintf(why, sizeof why,
                 "rank %d (host %s) was lost: its point-to-point connection closed", m->peer, host);
    else
        snprintf(why, sizeof why,
                 "%s '%.200s' on rank %d %s rank %d: rank %d (host %s) shut down or exited "
                 "without %s it",
                 hvdl_op_name(m->op->meta.op), m->op->name, e->rank, send ? "to" : "from", m->peer,
                 m->peer, host, send ? "receiving" : "sending");
    hvdl__p2p_finish(e, m, over ? HVDL_ERR_SHUT_DOWN : HVDL_ERR_PEER_LOST, why);
}

/* End a list's ops with (status, msg), or, msg NULL, each naming its peer, whose
 * connection closed after a shutdown (hvdl__p2p_finish_closed). What has no op is freed. */
void hvdl__p2p_fail_list(engine_t *e, plist_t *l, int status, const char *msg) {
    while (l->head) {
        pmsg_t *m = l->head;
        l->head = m->next;
        if (m->op && msg) hvdl__p2p_finish(e, m, status, msg);
        else if (m->op) hvdl__p2p_finish_closed(e, m, 1);
        else {
            free(m->name);
            free(m->data);
            free(m);
        }
    }
    l->tail = NULL;
}

/* Every op waiting on peer q ends: with (status, msg), or, msg NULL, naming q. */
static void fail_peer(engine_t *e, ppeer_t *q, int status, const char *msg) {
    plist_t half = {0};                             /* a recv half read, or half moved */
    pthread_mutex_lock(&q->rmu);
    if (q->rx_into && q->rx_into->op) {
        push(&half, q->rx_into);
        q->rx_into = NULL;
        q->rx_dst = NULL;
    }
    if (q->rx_ring_msg) push(&half, q->rx_ring_msg);
    q->rx_ring_msg = NULL;
    hvdl__p2p_fail_list(e, &half, status, msg);
    pthread_mutex_lock(&q->smu);
    q->cur = NULL;
    hvdl__p2p_fail_list(e, &q->sends, status, msg);
    hvdl__p2p_fail_list(e, &q->rts_wait, status, msg);
    hvdl__p2p_fail_list(e, &q->ctl, status, msg);
    pthread_mutex_unlock(&q->smu);
    hvdl__p2p_fail_list(e, &q->recvs, status, msg);
    hvdl__p2p_fail_list(e, &q->awaiting, status, msg);
    pthread_mutex_unlock(&q->rmu);
}

/* Everything this thread holds fails with one message (the engine failed or stopped). */
void hvdl__p2p_fail_all(engine_t *e, int status, const char *msg) {
    for (int i = 0; i < e->size; i++) fail_peer(e, &e->p2p->peers[i], status, msg);
}

/* The job was shut down (the loop thread has ended, without a failure): nothing will
 * tell this thread that a peer is gone but its connection closing, so the ops waiting on
 * a peer whose connection closed end here, each naming that peer. What the peer sent
 * before it closed has been read and matched already (a connection closes after its
 * last byte). */
void hvdl__p2p_finish_closed_peers(engine_t *e, int over) {
    for (int i = 0; i < e->size; i++) {
        ppeer_t *q = &e->p2p->peers[i];
        if (q->closed && (over || q->left)) fail_peer(e, q, 0, NULL);
    }
}

/* Tell the loop thread (which owns the control connections) that a peer broke. */
void hvdl__p2p_report_lost(engine_t *e, int peer, const char *why) {
    struct p2p *p = e->p2p;
    int none = -1;
    p->peers[peer].closed = 1;
    /* The first report wins: claimed (-2), its reason written, then published. */
    if (!atomic_compare_exchange_strong(&p->lost_peer, &none, -2)) return;
    snprintf(p->lost_why, sizeof p->lost_why, "%s", why);
    atomic_store(&p->lost_peer, peer);
    hvdl__wake(e);
}

/* An op meets a connection that closed while nothing waited on it (hvdl__p2p_read_peer reports a
 * close only then, as a peer may be leaving after a shutdown this rank has not heard
 * of yet). The op waits, and the loss goes to the loop thread like any other: it waits
 * for rank 0's verdict and fails the job (the p2p thread then fails the op with it), or
 * learns of the shutdown (and the op ends naming the peer that left). Failing the op
 * alone here would let its caller go on, even shut down, with the job not failed: the
 * goodbye would then turn the others' view of the loss into a plain shutdown. */
void hvdl__p2p_report_closed(engine_t *e, int peer) {
    hvdl__p2p_report_lost(e, peer, "its point-to-point connection closed");
    hvdl_wakefd_signal(e->p2p->wake_fd);            /* it watches the op from now on */
}

int hvdl__p2p_tend(engine_t *e) {
    struct p2p *p = e->p2p;
    if (!p) return 0;
    int published = 2;
    if (atomic_compare_exchange_strong(&p->stall_state, &published, 3)) {
        /* every rank ends with this reason, as a collective's stall shutdown does */
        hvdl__fail_job(e, HVDL_ERR_STALLED, "%s", p->stall_msg);
        return -1;
    }
    int peer = atomic_load(&p->lost_peer);
    if (peer < 0) return 0;                         /* none, or its reason not written yet */
    hvdl__peer_lost(e, peer, p->lost_why);
    return e->failed || e->stopped ? -1 : 0;
}
