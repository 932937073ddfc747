/*
 * Checks on what peers send, before anything trusts it. A connection has proved the job
 * key (handshake.c), but a buggy or hostile peer must still never make this process read
 * or write out of bounds: every enum is range-checked, every count is bounded by the
 * bytes that carry it, every size is computed without overflow, and a response is
 * executed only if it agrees with the op this rank enqueued (the bytes the engine moves
 * come from that op's buffers, so they must be the sizes the response implies).
 *
 * Each check returns NULL when all is well, else a short reason that ends up in the
 * error naming the peer.
 */
#include "control.h"
#include <string.h>

/* Bytes of a tensor of meta m (validated), or -1 on overflow. */
static int64_t checked_bytes(const meta_t *m) {
    int64_t n = hvdl_dtype_size(m->dtype);
    for (int d = 0; d < m->ndim; d++) {
        if (m->shape[d] && n > INT64_MAX / m->shape[d]) return -1;
        n *= m->shape[d];
    }
    return n;
}

const char *hvdl__meta_problem(engine_t *e, const meta_t *m) {
    if (m->op < HVDL_OP_ALLREDUCE || m->op > HVDL_OP_JOIN) return "an unknown op";
    if (!hvdl_dtype_size(m->dtype)) return "an unknown dtype";
    if (m->reduce_op < HVDL_SUM || m->reduce_op > HVDL_ADASUM) return "an unknown reduce op";
    if (m->process_set < 0 || m->process_set >= HVDL_MAX_SETS)
        return "a process set id out of range";
    if (m->ndim < 0 || m->ndim > HVDL_MAX_DIMS) return "a number of dimensions out of range";
    if (m->op == HVDL_OP_BROADCAST && (m->root_rank < 0 || m->root_rank >= e->size))
        return "a root rank out of range";
    for (int d = 0; d < m->ndim; d++)
        if (m->shape[d] < 0) return "a negative dimension";
    if (checked_bytes(m) < 0) return "a size that overflows 64 bits";
    return NULL;
}

const char *hvdl__splits_problem(const meta_t *m, const int64_t *splits, uint32_t n, int nmembers) {
    if (m->op != HVDL_OP_ALLTOALL) return n ? "splits on an op that is not alltoall" : NULL;
    if (m->ndim < 1) return "an alltoall without a first dimension";
    if (nmembers >= 0 && n != (uint32_t)nmembers)
        return "a number of splits that is not the set's size";
    int64_t sum = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (splits[i] < 0 || splits[i] > m->shape[0] - sum)
            return "splits that do not add up to the rows";
        sum += splits[i];
    }
    return sum == m->shape[0] ? NULL : "splits that do not add up to the rows";
}

/* Does the response's tensor meta t agree with what this rank enqueued (o)? */
static const char *agrees(const response_t *r, const meta_t *t, const op_t *o) {
    const meta_t *m = &o->meta;
    if (t->op != r->meta.op || m->op != t->op) return "another op than this rank enqueued";
    if (m->op == HVDL_OP_BARRIER || m->op == HVDL_OP_JOIN) return NULL;
    if (t->dtype != r->meta.dtype || m->dtype != t->dtype)
        return "another dtype than this rank enqueued";
    if (m->process_set != t->process_set || t->process_set != r->meta.process_set)
        return "another process set than this rank enqueued";
    if (m->reduce_op != r->meta.reduce_op || m->prescale != r->meta.prescale ||
        m->postscale != r->meta.postscale || m->root_rank != r->meta.root_rank)
        return "another reduce op, scale or root than this rank enqueued";
    int from = m->op == HVDL_OP_ALLGATHER || m->op == HVDL_OP_ALLTOALL ? 1 : 0;
    if (m->ndim != t->ndim) return "another shape than this rank enqueued";
    for (int d = from; d < m->ndim; d++)
        if (m->shape[d] != t->shape[d]) return "another shape than this rank enqueued";
    return NULL;
}

/* Sum of n row counts times row bytes, or -1 if negative or overflowing. */
static int64_t rows_bytes(const int64_t *rows, int n, int stride, int64_t row) {
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        int64_t k = rows[(int64_t)i * stride];
        if (k < 0 || (row && k > (INT64_MAX - total) / row)) return -1;
        total += k * row;
    }
    return total;
}

const char *hvdl__response_problem(engine_t *e, const group_t *g, const response_t *r,
                                   op_t *const *ops) {
    if (!g || g->me < 0) return "a response for a process set this rank is not in";
    if (r->kind != RESP_OK) return NULL;           /* nothing moves; each op gets the error */
    if (r->meta.op == HVDL_OP_BROADCAST) {
        int member = 0;
        for (int i = 0; i < g->n; i++) member |= g->ranks[i] == r->meta.root_rank;
        if (!member) return "a broadcast whose root is not in the set";
    }
    if (r->ntensors != 1 && r->meta.op != HVDL_OP_ALLREDUCE)
        return "several tensors fused in an op that is not allreduce";
    for (int i = 0; i < r->ntensors; i++) {
        const meta_t *t = &r->metas[i];
        if (!ops[i]) {
            /* a joined rank contributes zeros of the agreed size */
            if (t->op != HVDL_OP_ALLREDUCE || t->dtype != r->meta.dtype)
                return "a tensor unlike its response";
            continue;
        }
        const char *why = agrees(r, t, ops[i]);
        if (why) return why;
        if (t->op == HVDL_OP_REDUCESCATTER) {      /* executed from the response's shape */
            if (r->meta.ndim != t->ndim ||
                memcmp(r->meta.shape, t->shape, sizeof(int64_t) * (size_t)t->ndim))
                return "a shape unlike its tensor's";
        }
        int64_t row = hvdl_dtype_size(t->dtype);
        for (int d = 1; d < t->ndim; d++) row *= t->shape[d];   /* bounded: whole size checked */
        if (t->op == HVDL_OP_ALLGATHER) {
            const int64_t *dim0 = r->dim0 + (int64_t)i * g->n;
            if (dim0[g->me] != ops[i]->meta.shape[0])
                return "another first dimension for this rank than it has";
            if (rows_bytes(dim0, g->n, 1, row) < 0)
                return "first dimensions that are negative or overflow";
        }
        if (t->op == HVDL_OP_ALLTOALL) {
            for (int j = 0; j < g->n; j++)
                if (r->matrix[g->me * g->n + j] != ops[i]->splits[j])
                    return "other splits for this rank than it has";
            for (int j = 0; j < g->n; j++)   /* what every member sends to j */
                if (rows_bytes(r->matrix + j, g->n, g->n, row) < 0)
                    return "splits that are negative or overflow";
        }
    }
    return NULL;
}
