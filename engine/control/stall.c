/*
 * The stall inspector (rank 0): names that some ranks submitted and others did not.
 * After HOROVOD_STALL_CHECK_TIME_SECONDS it warns, naming the missing ranks, and again
 * each period after; after HOROVOD_STALL_SHUTDOWN_TIME_SECONDS (if set) it fails the
 * job with that message on every rank. Checked at most once a second.
 */
#include "fail.h"
#include "negotiation.h"
#include "net.h"
#include <stdio.h>
#include <string.h>

void hvdl__stall_check(engine_t *e, double now) {
    coordinator_t *c = e->coord;
    if (!c || !e->cfg.stall_check || now - c->last_stall_check < 1.0) return;
    c->last_stall_check = now;
    took_t t;
    hvdl__took_init(&t);
    /* words stuck partly set in a segment become pending (negotiation.h) */
    if (e->negotiation->stall_scan(e, now, &t) || hvdl__coordinator_take_bits(e, &t)) {
        hvdl__took_free(&t);
        return;
    }
    for (int i = 0; i < c->pending.cap; i++) {
        pending_t *p = c->pending.vals ? c->pending.vals[i] : NULL;
        if (!p || now - p->first_at < e->cfg.stall_warning) continue;
        /* on several nodes, bits posted in the segments come to rank 0 first */
        int asked = e->negotiation->before_stall(e, p, &t);
        if (asked < 0 || hvdl__coordinator_take_bits(e, &t)) {
            hvdl__took_free(&t);
            return;
        }
        if (asked || strmap_get(&c->pending, p->name) != p)
            continue;   /* next check; or it is ready */
        const group_t *g = e->sets[p->metas[p->ref].process_set];
        char missing[512] = "";
        int k = 0;
        for (int i = 0; g && i < g->n && k < (int)sizeof missing - 16; i++)
            if (!p->have[g->ranks[i]])
                k += snprintf(missing + k, sizeof missing - (size_t)k, k ? ", %d" : "%d",
                              g->ranks[i]);
        if (e->cfg.stall_shutdown > 0 && now - p->first_at > e->cfg.stall_shutdown) {
            char msg[HVDL_MSG_BYTES];
            snprintf(msg, sizeof msg,
                     "stalled: '%s' was submitted by some ranks %.0f s ago but ranks "
                     "[%s] never submitted it (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS)",
                     p->name, now - p->first_at, missing);
            /* every rank ends with this reason, rather than later with "rank 0 was lost";
             * told first, since a caller woken by the failure may end the process */
            for (int w = 1; w < e->size; w++)
                if (e->peers[w].ctrl.fd >= 0 && !e->peers[w].ctrl.eof)
                    hvdl__send_frame(e, w, MSG_ABORT, msg, (int64_t)strlen(msg));
            hvdl__fail(e, HVDL_ERR_STALLED, "%s", msg);
            return;
        }
        if (now - p->warned_at < e->cfg.stall_warning) continue;
        p->warned_at = now;
        hvdl__log(e, HVDL_LOG_WARNING,
                  "stall: '%s' has waited %.0f s; ranks [%s] have not submitted it. "
                  "One or more ranks may be behind or took a different code path.",
                  p->name, now - p->first_at, missing);
    }
}
