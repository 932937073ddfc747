/*
 * Shutdown: any rank's shutdown is every rank's (as in Horovod).
 *
 * A rank that calls shutdown sends MSG_BYE to rank 0 (after announcing what it had
 * enqueued); rank 0 answers the first goodbye, its own included, with MSG_BYE to every
 * worker, and every rank then stops: its loop fails the unfinished ops with "shut down".
 *
 * Leaving is a handshake too: a worker half-closes its control connection as soon as
 * rank 0's goodbye has stopped it, and rank 0 waits (up to the peer timeout) for every
 * worker to do so, naming any that does not: a worker stopped while the job shuts down
 * would otherwise keep its launcher waiting forever.
 *
 * Rank 0's goodbye names the rank that asked, and the ops that others had submitted and
 * it never did: each rank's unfinished ops fail with that (bye_why), not a bare "shut down".
 *
 * On one node, rank 0's goodbye also says how far it executed the segment's log
 * (negotiate_shm.c): a worker first executes what it has not of that (a barrier that
 * finished on rank 0 finishes everywhere), as it would have executed the responses
 * that came before the goodbye on rank 0's connection.
 */
#include "fail.h"
#include "segment.h"
#include "net.h"
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

/* Why this rank's unfinished ops end: "rank 1 called shutdown() without submitting
 * allreduce 'x'". Nothing when this rank asked itself. */
static void record_why(engine_t *e, int from, const char *missing, size_t n) {
    if (from == e->rank) return;
    pthread_mutex_lock(&e->mu);
    snprintf(e->bye_why, sizeof e->bye_why, "rank %d called shutdown()%s%.*s", from,
             n ? " without submitting " : "", (int)n, missing);
    pthread_mutex_unlock(&e->mu);
}

static int begin_shutdown(engine_t *e, int from) {
    coordinator_t *c = e->coord;
    if (c->shutdown_from >= 0) return 0;
    c->shutdown_from = from;
    e->stopped = 1;          /* first: a peer that already left is no loss now */
    /* who asked, (one node) how far rank 0 executed the segment's log, and the ops that
     * others wait on and `from` never submitted */
    uint8_t msg[12 + 512];
    int32_t who = from;
    uint64_t pos = hvdl__neg_position(e);
    memcpy(msg, &who, 4);
    memcpy(msg + 4, &pos, 8);
    hvdl__never_submitted(e, from, (char *)msg + 12, sizeof msg - 12);
    size_t n = strlen((char *)msg + 12);
    record_why(e, from, (char *)msg + 12, n);
    for (int w = 1; w < e->size; w++)
        if (!e->peers[w].ctrl.eof) hvdl__send_frame(e, w, MSG_BYE, msg, 12 + (int64_t)n);
    return 0;
}

int hvdl__say_bye(engine_t *e) {
    if (e->rank == 0) return begin_shutdown(e, 0);
    int32_t me = e->rank;
    return hvdl__send_frame(e, 0, MSG_BYE, &me, sizeof me);
}

int hvdl__bye_received(engine_t *e, int from, const uint8_t *p, int64_t n) {
    if (e->rank == 0) return begin_shutdown(e, from);
    uint64_t pos = 0;
    int32_t who = -1;
    if (n >= 12) {
        memcpy(&who, p, 4);
        memcpy(&pos, p + 4, 8);
    }
    /* the ops' names, as text: at most 512 bytes, and any byte is harmless in %.*s */
    if (who >= 0 && who < e->size) record_why(e, who, (const char *)p + 12, n > 524 ? 512 : n > 12 ? (size_t)(n - 12) : 0);
    int rc = hvdl__neg_finish_to(e, pos);   /* what rank 0 finished before it stopped */
    e->stopped = 1;          /* rank 0 says everyone stops */
    return rc;
}

void hvdl__goodbye(engine_t *e) {
    if (e->rank != 0) {
        if (e->peers && e->peers[0].ctrl.fd >= 0) shutdown(e->peers[0].ctrl.fd, SHUT_WR);
        return;
    }
    double deadline = hvdl_now() + e->cfg.peer_timeout;
    struct pollfd pf[e->size];
    int who[e->size];
    for (;;) {
        int n = 0;
        for (int w = 1; w < e->size; w++) {
            conn_t *c = &e->peers[w].ctrl;
            if (c->fd < 0 || c->eof) continue;
            pf[n] = (struct pollfd){c->fd, POLLIN, 0};
            who[n++] = w;
        }
        double left = deadline - hvdl_now();
        if (!n) return;
        if (left <= 0) break;
        if (poll(pf, (nfds_t)n, (int)(left * 1000) + 1) <= 0) continue;
        for (int i = 0; i < n; i++) {
            conn_t *c = &e->peers[who[i]].ctrl;
            if (pf[i].revents && hvdl__ctrl_read(e, who[i])) c->eof = 1;   /* it left */
            c->rx.len = 0;                                         /* frames no longer matter */
        }
    }
    for (int w = 1; w < e->size; w++) {
        conn_t *c = &e->peers[w].ctrl;
        if (c->fd < 0 || c->eof) continue;
        char msg[HVDL_MSG_BYTES];
        snprintf(msg, sizeof msg, "rank %d (host %s) was lost: it did not finish shutting "
                 "down within %.0f s (HOROVODLIKE_PEER_TIMEOUT_SECONDS): the process is "
                 "stopped or hung", w, e->peers[w].host, e->cfg.peer_timeout);
        hvdl__log(e, HVDL_LOG_ERROR, "%s", msg);
        hvdl__record_failure(e, HVDL_ERR_PEER_LOST, msg);   /* hvdl_shutdown reports it */
    }
}
