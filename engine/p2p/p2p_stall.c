/*
 * The stall inspector of point-to-point ops: a send or recv waiting longer than
 * HOROVOD_STALL_CHECK_TIME_SECONDS is reported on its own rank with its name, its rank
 * and the peer it waits for (and, for a recv, the names that peer did send, which shows
 * a name mismatch). One waiting longer than HOROVOD_STALL_SHUTDOWN_TIME_SECONDS (if
 * set) fails the job with that report on every rank, as a stalled collective does.
 *
 * It runs on the p2p thread about once a second (hvdl__p2p_stall_check), under
 * each peer's locks in turn.
 */
#define _GNU_SOURCE
#include "p2p_internal.h"
#include <stdio.h>

/* An op has waited past HOROVOD_STALL_SHUTDOWN_TIME_SECONDS: 1 once the job is being
 * failed with msg (the first such op wins; the loop thread tells every rank). */
static int past_shutdown(engine_t *e, pmsg_t *m, double now) {
    return e->cfg.stall_shutdown > 0 && now - m->started > e->cfg.stall_shutdown;
}

static int stall_shutdown(engine_t *e, pmsg_t *m, double now, const char *msg) {
    struct p2p *p = e->p2p;
    if (!past_shutdown(e, m, now)) return 0;
    int none = 0;
    if (atomic_compare_exchange_strong(&p->stall_state, &none, 1)) {
        snprintf(p->stall_msg, sizeof p->stall_msg,
                 "stalled: %s (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS)", msg);
        atomic_store(&p->stall_state, 2);
        hvdl__wake(e);
    }
    return 1;
}

void hvdl__p2p_stall_check(engine_t *e, double now) {
    struct p2p *p = e->p2p;
    if (!e->cfg.stall_check || now - p->last_stall_check < 1.0) return;
    p->last_stall_check = now;
    for (int i = 0; i < e->size; i++) {
        ppeer_t *q = &p->peers[i];
        pthread_mutex_lock(&q->rmu);
        for (pmsg_t *m = q->recvs.head; m; m = m->next) {
            if (now - m->started < e->cfg.stall_warning) continue;
            if (now - m->warned < e->cfg.stall_warning && !past_shutdown(e, m, now)) continue;
            m->warned = now;
            char sent[512] = "", what[HVDL_MSG_BYTES - 64];
            int k = 0;
            for (pmsg_t *u = q->unexpected.head; u && k < (int)sizeof sent - 80; u = u->next)
                k += snprintf(sent + k, sizeof sent - (size_t)k, "%s'%.64s'", k ? ", " : "",
                              u->name);
            snprintf(what, sizeof what,
                     "recv '%.200s' on rank %d from rank %d has waited %.0f s; rank %d "
                     "has not sent it%s%s%s",
                     m->op->name, e->rank, i, now - m->started, i,
                     k ? " (it sent, unmatched: " : "", sent, k ? "; do the names match?)" : "");
            if (stall_shutdown(e, m, now, what)) {
                pthread_mutex_unlock(&q->rmu);
                return;
            }
            hvdl__log(e, HVDL_LOG_WARNING, "stall: %s", what);
        }
        pthread_mutex_unlock(&q->rmu);
        pthread_mutex_lock(&q->smu);
        /* the send being written, or the oldest announced one the peer has not cleared */
        pmsg_t *m = q->sends.head, *a = q->rts_wait.head;
        if (m && !m->op) m = m->next;               /* a mailbox switch: no op */
        if (!m || (a && a->started < m->started)) m = a;
        char what[HVDL_MSG_BYTES - 64];
        int warn = m && now - m->started >= e->cfg.stall_warning &&
                   (now - m->warned >= e->cfg.stall_warning || past_shutdown(e, m, now));
        if (warn) {
            m->warned = now;
            char how[160];
            if (m == a)
                snprintf(how, sizeof how,
                         "it has not cleared this %lld-byte message (no recv of its name, "
                         "rendezvous)",
                         (long long)m->hdr.nbytes);
            else
                snprintf(how, sizeof how, "%lld of %lld bytes sent",
                         (long long)(m->kind == K_SDATA ? m->moved : m->off),
                         (long long)(m->hdr.nbytes + (int64_t)sizeof m->hdr + m->hdr.name_len));
            snprintf(what, sizeof what,
                     "send '%.200s' on rank %d to rank %d has waited %.0f s; rank %d is "
                     "not reading (%s)",
                     m->op->name, e->rank, i, now - m->started, i, how);
            warn = stall_shutdown(e, m, now, what) ? 2 : 1;
        }
        pthread_mutex_unlock(&q->smu);
        if (warn == 2) return;
        if (warn) hvdl__log(e, HVDL_LOG_WARNING, "stall: %s", what);
    }
}
