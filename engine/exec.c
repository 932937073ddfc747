/*
 * Executing a response: find this rank's ops for the response's tensors, move the data
 * with the right algorithm, and complete the handles.
 *
 * Fusion lives here on the data side: a response naming several allreduce tensors is
 * packed into the persistent fusion buffer (MEMCPY_IN), reduced as one buffer and
 * unpacked (MEMCPY_OUT), trading two local copies for one collective's latency per
 * tensor. A response with one tensor is reduced in the caller's output buffer directly,
 * with no staging copy at all when input and output are the same buffer.
 */
#include "internal.h"
#include <stdlib.h>
#include <string.h>

static int64_t elems(const op_t *o) {
    int esz = hvdl_dtype_size(o->meta.dtype);
    return o->nbytes / esz;
}

/* Average reduces as Sum and folds 1/size into the postscale. */
static void reduce_params(engine_t *e, const meta_t *m, int *op, double *post) {
    *op = m->reduce_op == HVDL_AVERAGE ? HVDL_SUM : m->reduce_op;
    *post = m->postscale * (m->reduce_op == HVDL_AVERAGE ? 1.0 / e->size : 1.0);
}

static int exec_allreduce(engine_t *e, const meta_t *m, op_t **ops, int n) {
    int op;
    double post;
    reduce_params(e, m, &op, &post);
    if (n == 1) {
        op_t *o = ops[0];
        if (o->output != o->input && o->nbytes) memcpy(o->output, o->input, (size_t)o->nbytes);
        hvdl__scale(m->dtype, o->output, elems(o), m->prescale);
        if (hvdl__allreduce_ring(e, o->output, elems(o), m->dtype, op)) return -1;
        hvdl__scale(m->dtype, o->output, elems(o), post);
        return 0;
    }
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += ops[i]->nbytes;
    if (buf_reserve(&e->fusion, total)) {
        hvdl__fail(e, HVDL_ERR_SYSTEM, "out of memory for a %lld-byte fusion buffer",
                   (long long)total);
        return -1;
    }
    uint8_t *f = e->fusion.data;
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        if (ops[i]->nbytes) memcpy(f + at, ops[i]->input, (size_t)ops[i]->nbytes);
        at += ops[i]->nbytes;
    }
    int esz = hvdl_dtype_size(m->dtype);
    hvdl__scale(m->dtype, f, total / esz, m->prescale);
    if (hvdl__allreduce_ring(e, f, total / esz, m->dtype, op)) return -1;
    hvdl__scale(m->dtype, f, total / esz, post);
    at = 0;
    for (int i = 0; i < n; i++) {
        if (ops[i]->nbytes) memcpy(ops[i]->output, f + at, (size_t)ops[i]->nbytes);
        at += ops[i]->nbytes;
    }
    return 0;
}

static int exec_allgather(engine_t *e, op_t *o, const int64_t *dim0) {
    int64_t row = hvdl_dtype_size(o->meta.dtype);
    for (int d = 1; d < o->meta.ndim; d++) row *= o->meta.shape[d];
    int64_t *blocks = malloc(sizeof(int64_t) * (size_t)e->size);
    if (!blocks) return -1;
    int64_t total = 0, rows = 0;
    for (int i = 0; i < e->size; i++) {
        blocks[i] = dim0[i] * row;
        total += blocks[i];
        rows += dim0[i];
    }
    uint8_t *out = malloc((size_t)(total ? total : 1));
    if (!out) {
        free(blocks);
        hvdl__fail(e, HVDL_ERR_SYSTEM, "out of memory for a %lld-byte allgather result",
                   (long long)total);
        return -1;
    }
    int64_t mine = 0;
    for (int i = 0; i < e->rank; i++) mine += blocks[i];
    if (o->nbytes) memcpy(out + mine, o->input, (size_t)o->nbytes);
    int rc = hvdl__allgather_ring(e, out, blocks);
    free(blocks);
    if (rc) { free(out); return -1; }
    o->result = (hvdl_result){out, total, rows};
    return 0;
}

static int exec_broadcast(engine_t *e, const meta_t *m, op_t *o) {
    if (e->rank == m->root_rank && o->output != o->input && o->nbytes)
        memcpy(o->output, o->input, (size_t)o->nbytes);
    return hvdl__broadcast_chain(e, o->output, o->nbytes, m->root_rank);
}

int hvdl__execute(engine_t *e, response_t *r) {
    op_t *stack[64], **ops = r->ntensors <= 64 ? stack : malloc(sizeof(op_t *) * (size_t)r->ntensors);
    if (!ops) return -1;
    for (int i = 0; i < r->ntensors; i++) {
        ops[i] = strmap_del(&e->mine, r->names[i]);
        if (!ops[i]) {
            /* Every rank announced every name in a response; a miss is an engine bug. */
            hvdl__fail(e, HVDL_ERR_SYSTEM, "internal error: response for '%s', which this "
                       "rank never submitted", r->names[i]);
            if (ops != stack) free(ops);
            return -1;
        }
    }
    int rc = 0;
    if (r->kind == RESP_ERROR) {
        for (int i = 0; i < r->ntensors; i++) hvdl__complete(e, ops[i], HVDL_ERR_MISMATCH, r->error);
    } else {
        switch (r->meta.op) {
        case HVDL_OP_ALLREDUCE: rc = exec_allreduce(e, &r->meta, ops, r->ntensors); break;
        case HVDL_OP_ALLGATHER: rc = exec_allgather(e, ops[0], r->dim0); break;
        case HVDL_OP_BROADCAST: rc = exec_broadcast(e, &r->meta, ops[0]); break;
        default: break;   /* barrier: negotiation itself was the synchronisation */
        }
        /* On failure hvdl__fail has completed every op; touch none of them again. */
        for (int i = 0; !rc && i < r->ntensors; i++) hvdl__complete(e, ops[i], HVDL_OK, NULL);
    }
    if (ops != stack) free(ops);
    return rc;
}
