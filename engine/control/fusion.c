/*
 * Fusion planning: which ready tensors travel as one response. Compatible allreduces
 * (same dtype, reduce op, scale factors and process set) are fused, in the order they
 * became ready, up to HOROVOD_FUSION_THRESHOLD bytes and HVDL_MAX_FUSED tensors; an
 * incompatible tensor keeps its place in the ready list for the next response. Every
 * other op travels alone. The tensors past HVDL_MAX_FUSED are not delayed: they go in the
 * next response of the same plan, in the same frame. exec.c packs a fused response into
 * the fusion buffer on the data side. The one-node segment's log fuses the ids a rank
 * completes by the same rule (hvdl__fuses).
 */
#include "control.h"

int hvdl__fusable(const meta_t *a, const meta_t *b) {
    return a->op == HVDL_OP_ALLREDUCE && b->op == HVDL_OP_ALLREDUCE && a->dtype == b->dtype &&
           a->reduce_op == b->reduce_op && a->prescale == b->prescale &&
           a->postscale == b->postscale && a->process_set == b->process_set;
}

/* The fusion rule, once: whether `next` joins the group that `first` starts, whose
 * tensors so far take *bytes (added to when it does). The count limit is the caller's:
 * a response's HVDL_MAX_FUSED, a segment log entry's ids. */
int hvdl__fuses(const engine_t *e, const meta_t *first, const meta_t *next, int64_t *bytes) {
    int64_t nb = hvdl__meta_bytes(next);
    if (!hvdl__fusable(first, next) || *bytes + nb > e->cfg.fusion_threshold) return 0;
    *bytes += nb;
    return 1;
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
        if (!p->error && hvdl__fuses(e, fm, &p->metas[p->ref], &bytes)) {
            *pp = p->next;
            p->next = NULL;
            last->next = p;
            last = p;
            n++;
        } else {
            pp = &p->next;
        }
    }
    c->ready_tail = NULL;
    for (pending_t *p = c->ready_head; p; p = p->next) c->ready_tail = p;
    *count = n;
    return first;
}
