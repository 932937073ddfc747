/*
 * Shutdown: ending is per rank, and the job's engines end together (as MPI_Finalize is
 * collective and torch's destroy_process_group is local).
 *
 * A rank that calls shutdown sends MSG_BYE to rank 0 (after announcing what it had
 * enqueued) and submits nothing more; its engine keeps serving (heartbeats, responses)
 * until the job ends. Rank 0 records each goodbye, its own included
 * (hvdl__coordinator_finish): from then on an op that needs the finished rank and that
 * it never submitted fails at once on the ranks that submit it, naming that rank, while
 * every other process set goes on as before. So one set finishing first never fails
 * another set's last ops. When every rank has said goodbye, rank 0 sends what is ready
 * and then MSG_BYE to every worker (hvdl__shutdown_due), and every rank stops: its loop
 * fails what is still unfinished with "shut down". A finished rank waits for the others
 * only while they live: a peer that goes silent is named after the peer timeout
 * (liveness.c), as at any other time.
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
#include "wire.h"
#include "fail.h"
#include "negotiation.h"
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
     * others wait on and `from` never submitted (frames.h) */
    char missing[HVDL_BYE_TEXT];
    hvdl__never_submitted(e, from, missing, sizeof missing);
    bye_t b = {.who = from,
               .has_pos = 1,
               .pos = e->negotiation->position(e),
               .text = missing,
               .ntext = (int)strlen(missing)};
    record_why(e, from, missing, (size_t)b.ntext);
    uint8_t msg[HVDL_BYE_MAX];
    int64_t len = hvdl__put_bye(msg, &b);
    for (int w = 1; w < e->size; w++)
        if (!e->peers[w].ctrl.eof) hvdl__send_frame(e, w, MSG_BYE, msg, len);
    return 0;
}

/* Rank 0: `from` has said goodbye. The job ends once every rank has (hvdl__shutdown_due). */
static int finished(engine_t *e, int from) {
    int n = hvdl__coordinator_finish(e, from);
    if (n < 0) return -1;
    if (n == e->size && e->coord->last_finished < 0) e->coord->last_finished = from;
    return 0;
}

int hvdl__shutdown_due(engine_t *e) {
    coordinator_t *c = e->coord;
    if (e->rank != 0 || c->last_finished < 0 || c->shutdown_from >= 0 || c->ready_head) return 0;
    return begin_shutdown(e, c->last_finished) || e->stopped;
}

int hvdl__say_bye(engine_t *e) {
    if (e->rank == 0) return finished(e, 0);
    bye_t b = {.who = e->rank};
    uint8_t msg[HVDL_BYE_MAX];
    return hvdl__send_frame(e, 0, MSG_BYE, msg, hvdl__put_bye(msg, &b));
}

int hvdl__bye_received(engine_t *e, int from, const uint8_t *p, int64_t n) {
    reader_t r = {.p = p, .left = n};
    bye_t b;
    if (hvdl__read_bye(&r, &b)) return hvdl__malformed(e, from, "goodbye", r.why);
    if (e->rank == 0) {
        if (b.has_pos || b.who != from)
            return hvdl__malformed(e, from, "goodbye", "more than its own rank");
        return finished(e, from);
    }
    if (b.has_pos && b.who >= 0 && b.who < e->size) record_why(e, b.who, b.text, (size_t)b.ntext);
    int rc = e->negotiation->finish_to(e, b.pos);   /* what rank 0 finished before it stopped */
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
        snprintf(msg, sizeof msg,
                 "rank %d (host %s) was lost: it did not finish shutting "
                 "down within %.0f s (HOROVODLIKE_PEER_TIMEOUT_SECONDS): the process is "
                 "stopped or hung",
                 w, e->peers[w].host, e->cfg.peer_timeout);
        hvdl__log(e, HVDL_LOG_ERROR, "%s", msg);
        hvdl__record_failure(e, HVDL_ERR_PEER_LOST, msg);   /* hvdl_shutdown reports it */
    }
}
