/*
 * Fusion planning: which ready tensors travel as one response. Compatible allreduces
 * (same dtype, reduce op, scale factors and process set) are fused, in the order they
 * became ready, up to HOROVOD_FUSION_THRESHOLD bytes and HVDL_MAX_FUSED tensors; an
 * incompatible tensor keeps its place in the ready list for the next response. Every
 * other op travels alone. The tensors past HVDL_MAX_FUSED are not delayed: they go in the
 * next response of the same plan, in the same frame. exec.c packs a fused response into
 * the fusion buffer on the data side.
 */
#include "control.h"

int hvdl__fusable(const meta_t *a, const meta_t *b) {
    return a->op == HVDL_OP_ALLREDUCE && b->op == HVDL_OP_ALLREDUCE && a->dtype == b->dtype &&
           a->reduce_op == b->reduce_op && a->prescale == b->prescale &&
           a->postscale == b->postscale && a->process_set == b->process_set;
}

int64_t hvdl__meta_bytes(const meta_t *m) {
    int64_t n = hvdl_dtype_size(m->dtype);
    for (int d = 0; d < m->ndim; d++) n *= m->shape[d];
    return n;
}

/* Take the next group off the ready list, as a chain through ->next. */
pending_t *hvdl__fusion_take(engine_t *e, int *count) {
    coordinator_t *c = e->coord;
    pending_t *first = c->ready_head, *last = first;
    c->ready_head = first->next;
    first->next = NULL;
    int n = 1;
    const meta_t *fm = &first->metas[first->ref];
    int64_t bytes = hvdl__meta_bytes(fm);
    for (pending_t **pp = &c->ready_head; !first->error && *pp && n < HVDL_MAX_FUSED;) {
        pending_t *p = *pp;
        int64_t nb = hvdl__meta_bytes(&p->metas[p->ref]);
        if (!p->error && hvdl__fusable(fm, &p->metas[p->ref]) && bytes + nb <= e->cfg.fusion_threshold) {
            *pp = p->next;
            p->next = NULL;
            last->next = p;
            last = p;
            n++;
            bytes += nb;
        } else {
            pp = &p->next;
        }
    }
    c->ready_tail = NULL;
    for (pending_t *p = c->ready_head; p; p = p->next) c->ready_tail = p;
    *count = n;
    return first;
}
