/*
 * Matching: a recv and what its peer sent meet here, whichever came first, by name
 * and in posting order among equal names (p2p.c). A message whose recv is posted
 * goes into that recv (hvdl__p2p_accept_into prepares its buffer, and refuses a recv_ whose
 * buffer differs from the message); one that came first waits among the
 * unexpected until a recv of its name takes it (deliver). An eager message that
 * meets its recv gives its charge back to the sender (hvdl__p2p_give_back: F_CREDIT,
 * p2p_credit.c). All under the peer's rmu.
 */
#define _GNU_SOURCE
#include "p2p_internal.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void shape_str(const p2p_hdr_t *h, char *out, size_t cap) {
    size_t k = (size_t)snprintf(out, cap, "[");
    for (int d = 0; d < h->ndim && k < cap; d++)
        k += (size_t)snprintf(out + k, cap - k, d ? ", %lld" : "%lld", (long long)h->shape[d]);
    if (k < cap) snprintf(out + k, cap - k, "]");
}

/* The posted recv from q for this name, or NULL. */
pmsg_t *hvdl__p2p_posted_for(ppeer_t *q, const char *name) {
    for (pmsg_t *m = q->recvs.head; m; m = m->next)
        if (!strcmp(m->op->name, name)) return m;
    return NULL;
}

/* A recv meets a message described by h: prepare its output. 0, or -1 after completing
 * the recv with the mismatch (its payload is then discarded). */
int hvdl__p2p_accept_into(engine_t *e, pmsg_t *r, const p2p_hdr_t *h, uint8_t **dst) {
    op_t *o = r->op;
    char why[HVDL_MSG_BYTES];
    if (o->meta.ndim >= 0) {                        /* recv_: the caller's buffer */
        const char *field = NULL;
        char mine[200], theirs[200];
        if (h->dtype != o->meta.dtype) {
            field = "dtype";
            snprintf(theirs, sizeof theirs, "%s", hvdl_dtype_name(h->dtype));
            snprintf(mine, sizeof mine, "%s", hvdl_dtype_name(o->meta.dtype));
        } else if (h->nbytes != o->nbytes) {
            p2p_hdr_t b = {.ndim = o->meta.ndim};
            memcpy(b.shape, o->meta.shape, sizeof b.shape);
            char s1[160], s2[160];
            shape_str(h, s1, sizeof s1);
            shape_str(&b, s2, sizeof s2);
            field = "size";
            snprintf(theirs, sizeof theirs, "%lld bytes (shape %s)", (long long)h->nbytes, s1);
            snprintf(mine, sizeof mine, "%lld bytes (shape %s)", (long long)o->nbytes, s2);
        }
        if (field) {
            snprintf(why, sizeof why,
                     "recv_ '%s' on rank %d from rank %d: the message and the buffer "
                     "differ in %s: rank %d sent %s, rank %d's buffer has %s",
                     o->name, e->rank, r->peer, field, r->peer, theirs, e->rank, mine);
            *dst = NULL;
            hvdl__p2p_finish(e, r, HVDL_ERR_MISMATCH, why);
            return -1;
        }
        *dst = o->output;
    } else {                                        /* recv: a new buffer, given away */
        if (h->nbytes && !(o->result.data = malloc((size_t)h->nbytes))) {
            snprintf(why, sizeof why,
                     "recv '%s' on rank %d from rank %d: out of memory for %lld bytes", o->name,
                     e->rank, r->peer, (long long)h->nbytes);
            *dst = NULL;
            hvdl__p2p_finish(e, r, HVDL_ERR_SYSTEM, why);
            return -1;
        }
        *dst = o->result.data;
    }
    o->result.nbytes = h->nbytes;
    o->result.dtype = h->dtype;
    o->result.ndim = h->ndim;
    o->result.peer = r->peer;
    memcpy(o->result.shape, h->shape, sizeof o->result.shape);
    o->result.first_dim = h->ndim ? h->shape[0] : 0;
    return 0;
}

/* An eager message from peer (header h) met its recv: its charge goes back to the sender
 * once a quarter of the budget has (F_CREDIT, p2p_credit.c). 0, or -1 when out of memory. */
int hvdl__p2p_give_back(engine_t *e, int peer, const p2p_hdr_t *h) {
    ppeer_t *q = &e->p2p->peers[peer];
    int64_t n = hvdl__credit_matched(&q->credit, &e->p2p->budget,
                                     hvdl__credit_charge(h->name_len, h->nbytes));
    p2p_hdr_t c = {.magic = F_CREDIT, .nbytes = n};
    return n ? hvdl__p2p_queue_ctl_locked(e, peer, &c, NULL) : 0;
}

/* An unexpected message m meets recv r: deliver it (or, announced, clear it) and free m. */
void hvdl__p2p_deliver(engine_t *e, pmsg_t *r, pmsg_t *m) {
    op_t *o = r->op;
    uint8_t *dst;
    int into = o->meta.ndim >= 0;
    if (m->kind == K_UNEXPECTED)
        hvdl__p2p_give_back(e, r->peer, &m->hdr); /* (failing, it fails the job) */
    if (m->kind == K_UNEXPECTED_RTS) {
        hvdl__p2p_clear_to_send(e, r, &m->hdr, m->name, m->addr);
    } else if (!into) {                             /* hand the buffer over, no copy */
        o->result.data = m->data;
        m->data = NULL;
        p2p_hdr_t h = m->hdr;
        h.nbytes = 0;                               /* nothing to allocate */
        hvdl__p2p_accept_into(e, r, &h, &dst);
        o->result.nbytes = m->hdr.nbytes;
        hvdl__p2p_finish(e, r, HVDL_OK, NULL);
    } else if (hvdl__p2p_accept_into(e, r, &m->hdr, &dst) == 0) {
        if (m->hdr.nbytes) memcpy(dst, m->data, (size_t)m->hdr.nbytes);
        hvdl__p2p_finish(e, r, HVDL_OK, NULL);
    }
    free(m->name);
    free(m->data);
    free(m);
}

/* A new recv: take an unexpected message of its name, or wait among the posted. A peer
 * whose connection closed sends nothing more: what it sent before is all there is. */
void hvdl__p2p_post_recv(engine_t *e, pmsg_t *r, int over) {
    ppeer_t *q = &e->p2p->peers[r->peer];
    r->kind = K_RECV;
    for (pmsg_t *m = q->unexpected.head; m; m = m->next)
        if (!strcmp(m->name, r->op->name)) {
            unlink_msg(&q->unexpected, m);
            if (m->kind == K_UNEXPECTED_RTS)
                hvdl__credit_unhold(&q->credit, hvdl__credit_charge(m->hdr.name_len, 0));
            if (m->kind == K_UNEXPECTED_RTS && q->closed) { /* announced, never to come */
                free(m->name);
                free(m);
                break;
            }
            hvdl__p2p_deliver(e, r, m);
            return;
        }
    if ((q->closed && over) || atomic_load(&q->left)) {   /* nothing more will come */
        hvdl__p2p_finish_closed(e, r, 1);
        return;
    }
    push(&q->recvs, r);
    if (q->closed) hvdl__p2p_report_closed(e, r->peer);
}
