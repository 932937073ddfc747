/*
 * Executing a response: find this rank's ops for the response's tensors, move the data
 * with the right algorithm over the response's process set, and complete the handles.
 *
 * Fusion lives here on the data side: a response naming several allreduce tensors is
 * packed into the persistent fusion buffer (MEMCPY_IN), reduced as one buffer and
 * unpacked (MEMCPY_OUT), trading two local copies for one collective's latency per
 * tensor. A response with one tensor is reduced in the caller's output buffer directly,
 * with no staging copy at all when input and output are the same buffer; so is a response
 * whose tensors are all in place and lie back to back in one buffer (the gradient shards
 * of consecutive buckets of the sharded optimizer), since they already are one.
 *
 * A rank that has called join() executes allreduces it never submitted, with zeros of
 * the agreed size, so the others' sums are unchanged.
 */
#include "fail.h"
#include "wire.h"
#include "net.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One tensor's buffers as the algorithms see them. */
typedef struct slot {
    op_t *op;                /* NULL when this rank joined and contributes zeros */
    const void *in;
    void *out;
    int64_t nbytes;
} slot_t;

/* Average reduces as Sum and folds 1/n into the postscale. */
static void reduce_params(const group_t *g, const meta_t *m, int *op, double *post) {
    *op = m->reduce_op == HVDL_AVERAGE ? HVDL_SUM : m->reduce_op;
    *post = m->postscale * (m->reduce_op == HVDL_AVERAGE ? 1.0 / g->n : 1.0);
}

/* The shm path serves a set made of exactly this node's ranks (the usual single-node
 * job); anything else goes over TCP. */
static int on_shm(engine_t *e, const group_t *g) {
    if (!e->shm || g->n != e->shm->nlocal) return 0;
    for (int i = 0; i < g->n; i++)
        if (strcmp(e->peers[g->ranks[i]].host, e->host)) return 0;
    return 1;
}

/* Which allreduce runs: from the set, the topology and the size, unless
 * HOROVODLIKE_ALLREDUCE_ALGORITHM (or HOROVOD_HIERARCHICAL_ALLREDUCE) says otherwise. */
static int pick_allreduce(engine_t *e, const group_t *g, int64_t bytes) {
    int forced = e->cfg.algorithm;
    int hier_ok = g->id == 0 && e->cross && e->shm;
    if (forced == ALG_HIER && hier_ok) return ALG_HIER;
    hier_ok = hier_ok && !e->cfg.flat_allreduce;
    if (forced == ALG_RING || forced == ALG_RD) return forced;
    if (on_shm(e, g)) return ALG_SHM;
    if (hier_ok) return ALG_HIER;                     /* several nodes of several ranks */
    return bytes <= e->cfg.small_bytes ? ALG_RD : ALG_RING;
}

/* The algorithm of response r, chosen once, before it runs; it is carried in the
 * response (r->alg), run by dispatch and traced under the same name. Every member
 * computes the same answer from the same inputs. */
static int choose_algorithm(engine_t *e, const group_t *g, const response_t *r) {
    int shm = on_shm(e, g);
    switch (r->meta.op) {
    case HVDL_OP_ALLREDUCE: {
        int64_t bytes = 0;
        for (int i = 0; i < r->ntensors; i++) bytes += hvdl__meta_bytes(&r->metas[i]);
        return pick_allreduce(e, g, bytes);
    }
    case HVDL_OP_ALLGATHER:
        if (shm) return ALG_SHM;
        return g->id == 0 && e->cross && e->shm && e->cfg.allgather_algorithm != ALG_RING &&
                       !e->cfg.flat_allgather
                   ? ALG_HIER
                   : ALG_RING;
    case HVDL_OP_BROADCAST: return shm ? ALG_SHM : ALG_CHAIN;
    case HVDL_OP_REDUCESCATTER:
        if (shm && r->meta.prescale == 1.0) return ALG_SHM;
        /* the global set across nodes: hierarchical unless the allreduce knob forces a
         * flat TCP algorithm (a reduce-scatter is half an allreduce) */
        return g->id == 0 && e->cross && e->shm && e->cfg.algorithm != ALG_RING &&
                       e->cfg.algorithm != ALG_RD && !e->cfg.flat_allreduce
                   ? ALG_HIER
                   : ALG_RING;
    case HVDL_OP_ALLTOALL: return shm ? ALG_SHM : ALG_PAIRWISE;
    default: return ALG_NONE;     /* barrier, join: negotiation itself was the work */
    }
}

static const char *const ALG_NAMES[] = {[ALG_AUTO] = "",
                                        [ALG_SHM] = "shm",
                                        [ALG_RING] = "tcp_ring",
                                        [ALG_RD] = "tcp_recursive_doubling",
                                        [ALG_HIER] = "hierarchical",
                                        [ALG_CHAIN] = "tcp_chain",
                                        [ALG_PAIRWISE] = "tcp_pairwise",
                                        [ALG_NONE] = "negotiation"};
_Static_assert(sizeof ALG_NAMES / sizeof ALG_NAMES[0] == ALG_COUNT, "an algorithm without a name");

/* The name an algorithm is traced under (the C tests read it back from the trace). */
const char *hvdl__alg_name(int alg) {
    return alg >= 0 && alg < ALG_COUNT && ALG_NAMES[alg] ? ALG_NAMES[alg] : "?";
}

/* In place, result multiplied by post: inside the algorithm where it can be (each
 * finished segment once), after it for recursive doubling (small buffers). */
static int allreduce_with(engine_t *e, int alg, const group_t *g, void *buf, int64_t count,
                          int dtype, int op, double post) {
    switch (alg) {
    case ALG_SHM: return hvdl__allreduce_shm(&e->ctx, buf, buf, count, dtype, op, post);
    case ALG_HIER: return hvdl__allreduce_hier(&e->ctx, buf, count, dtype, op, post);
    case ALG_RD:
        if (hvdl__allreduce_rd(&e->ctx, g, buf, count, dtype, op)) return -1;
        hvdl__scale(dtype, buf, count, post);
        return 0;
    default: return hvdl__allreduce_ring(&e->ctx, g, buf, count, dtype, op, post);
    }
}

/* Outputs the engine hands to callers are 64-byte aligned: frameworks (TensorFlow's
 * DLPack import above all) can then adopt them without a copy. */
static void *alloc_output(int64_t n) {
    void *p = NULL;
    return posix_memalign(&p, 64, (size_t)(n ? n : 1)) ? NULL : p;
}

/* The start of the one buffer that n in-place tensors fill back to back, in order, or
 * NULL. Empty tensors may lie anywhere: they hold nothing. */
static uint8_t *one_buffer(const slot_t *s, int n) {
    uint8_t *start = NULL, *end = NULL;
    for (int i = 0; i < n; i++) {
        if (!s[i].nbytes) continue;
        if (s[i].in != s[i].out || (end && (uint8_t *)s[i].out != end)) return NULL;
        if (!start) start = s[i].out;
        end = (uint8_t *)s[i].out + s[i].nbytes;
    }
    return start;
}

static int exec_allreduce(engine_t *e, const group_t *g, const meta_t *m, slot_t *s, int n,
                          int alg) {
    int op, esz = hvdl_dtype_size(m->dtype);
    double post;
    reduce_params(g, m, &op, &post);
    if (n == 1) {
        if (m->prescale == 1.0 && alg == ALG_SHM) {
            /* straight from the caller's input into shared memory and back out, scaled
             * on the way (no pass over the output afterwards) */
            return hvdl__allreduce_shm(&e->ctx, s->in, s->out, s->nbytes / esz, m->dtype, op, post);
        }
        if (s->out != s->in && s->nbytes) memcpy(s->out, s->in, (size_t)s->nbytes);
        hvdl__scale(m->dtype, s->out, s->nbytes / esz, m->prescale);
        return allreduce_with(e, alg, g, s->out, s->nbytes / esz, m->dtype, op, post);
    }
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += s[i].nbytes;
    if (m->prescale == 1.0 && alg == ALG_SHM) {
        /* the tensors go straight into shared memory and back: no fusion-buffer copies */
        span_t v[n];
        for (int i = 0; i < n; i++) v[i] = (span_t){s[i].in, s[i].out, s[i].nbytes};
        double t0 = hvdl_now();
        if (hvdl__allreduce_shm_spans(&e->ctx, v, n, m->dtype, op, post)) return -1;
        if (TL_ON(e)) {
            char args[64];
            snprintf(args, sizeof args, "\"bytes\": %lld, \"fused\": %d", (long long)total, n);
            hvdl__tl_span(e, TL_ALGORITHM, "SHM_TWO_SHOT_GATHER_SCATTER", t0, hvdl_now(), args);
        }
        return 0;
    }
    uint8_t *one = one_buffer(s, n);
    if (one) {
        /* already fused where they lie: reduce there, as for one tensor */
        hvdl__scale(m->dtype, one, total / esz, m->prescale);
        return allreduce_with(e, alg, g, one, total / esz, m->dtype, op, post);
    }
    if (HVDL_INJECT(e, INJ_FUSION_ALLOC) || buf_reserve(&e->fusion, total))
        return hvdl__oom(e, "fusion buffer", total);
    uint8_t *f = e->fusion.data;
    double t0 = hvdl_now();
    for (int64_t i = 0, at = 0; i < n; at += s[i].nbytes, i++)
        if (s[i].nbytes) memcpy(f + at, s[i].in, (size_t)s[i].nbytes);
    hvdl__scale(m->dtype, f, total / esz, m->prescale);
    double t1 = hvdl_now();
    if (allreduce_with(e, alg, g, f, total / esz, m->dtype, op, post)) return -1;
    double t2 = hvdl_now();
    for (int64_t i = 0, at = 0; i < n; at += s[i].nbytes, i++)
        if (s[i].nbytes) memcpy(s[i].out, f + at, (size_t)s[i].nbytes);
    if (TL_ON(e)) {
        char args[64];
        snprintf(args, sizeof args, "\"bytes\": %lld, \"fused\": %d", (long long)total, n);
        hvdl__tl_span(e, TL_MEMCPY, "MEMCPY_IN_FUSION_BUFFER", t0, t1, args);
        hvdl__tl_span(e, TL_MEMCPY, "MEMCPY_OUT_FUSION_BUFFER", t2, hvdl_now(), args);
    }
    return 0;
}

static int64_t row_bytes(const meta_t *m) {
    int64_t row = hvdl_dtype_size(m->dtype);
    for (int d = 1; d < m->ndim; d++) row *= m->shape[d];
    return row;
}

static int exec_allgather(engine_t *e, const group_t *g, op_t *o, const int64_t *dim0, int alg) {
    int64_t row = row_bytes(&o->meta), blocks[g->n], total = 0, rows = 0, mine = 0;
    for (int i = 0; i < g->n; i++) {
        blocks[i] = dim0[i] * row;
        if (i < g->me) mine += blocks[i];
        total += blocks[i];
        rows += dim0[i];
    }
    /* A caller's output holds n blocks of its input's size: used when the result fits */
    int own = o->output && total <= o->nbytes * g->n;
    uint8_t *out = own ? o->output : HVDL_INJECT(e, INJ_OUTPUT_ALLOC) ? NULL : alloc_output(total);
    if (!out) return hvdl__oom(e, "allgather result", total);
    if (o->nbytes && out + mine != (const uint8_t *)o->input)
        memmove(out + mine, o->input, (size_t)o->nbytes);
    if (alg == ALG_SHM    ? hvdl__allgather_shm(&e->ctx, out, blocks)
        : alg == ALG_HIER ? hvdl__allgather_hier(&e->ctx, out, blocks)
                          : hvdl__allgather_ring(&e->ctx, g, out, blocks)) {
        if (!own) free(out);
        return -1;
    }
    o->result = (hvdl_result){.data = own ? NULL : out, .nbytes = total, .first_dim = rows};
    return 0;
}

static int exec_broadcast(engine_t *e, const group_t *g, const meta_t *m, op_t *o, int alg) {
    int root = 0;                          /* the root's index in the set */
    while (g->ranks[root] != m->root_rank) root++;
    if (g->me == root && o->output != o->input && o->nbytes)
        memcpy(o->output, o->input, (size_t)o->nbytes);
    return alg == ALG_SHM ? hvdl__broadcast_shm(&e->ctx, o->output, o->nbytes, root)
                          : hvdl__broadcast_chain(&e->ctx, g, o->output, o->nbytes, root);
}

/* Rows of the first dimension for member i: lower members take the remainder. */
static int64_t share(int64_t rows, int n, int i) { return rows / n + (i < rows % n); }

static int exec_reducescatter(engine_t *e, const group_t *g, const meta_t *m, op_t *o, int alg) {
    int op, esz = hvdl_dtype_size(m->dtype);
    double post;
    reduce_params(g, m, &op, &post);
    int64_t row = row_bytes(m), seg[g->n], mine = 0;
    for (int i = 0; i < g->n; i++) {
        seg[i] = share(m->shape[0], g->n, i) * row;
        if (i < g->me) mine += seg[i];
    }
    if (alg == ALG_SHM) {
        /* each rank reduces its own segment straight from every rank's input */
        return hvdl__reducescatter_shm(&e->ctx, o->input, seg, o->output, m->dtype, op, post);
    }
    if (alg == ALG_HIER)
        return hvdl__reducescatter_hier(&e->ctx, o->input, seg, o->output, m->dtype, op,
                                        m->prescale, post);
    /* The ring reduces in place, and the caller's input must stay intact. */
    if (HVDL_INJECT(e, INJ_SCATTER_ALLOC) || buf_reserve(&e->fusion, o->nbytes))
        return hvdl__oom(e, "reducescatter buffer", o->nbytes);
    uint8_t *f = e->fusion.data;
    if (o->nbytes) memcpy(f, o->input, (size_t)o->nbytes);
    hvdl__scale(m->dtype, f, o->nbytes / esz, m->prescale);
    if (hvdl__reduce_scatter_ring(&e->ctx, g, f, seg, m->dtype, op)) return -1;
    if (seg[g->me]) memcpy(o->output, f + mine, (size_t)seg[g->me]);
    hvdl__scale(m->dtype, o->output, seg[g->me] / esz, post);
    return 0;
}

static int exec_alltoall(engine_t *e, const group_t *g, op_t *o, const int64_t *matrix, int alg) {
    int n = g->n, me = g->me;
    int64_t row = row_bytes(&o->meta), send[n], recv[n], total = 0, rows = 0;
    int64_t *splits = malloc(sizeof(int64_t) * (size_t)n);
    if (!splits) return hvdl__oom(e, "alltoall splits", 8 * n);
    for (int j = 0; j < n; j++) {
        send[j] = matrix[me * n + j] * row;
        splits[j] = matrix[j * n + me];
        recv[j] = splits[j] * row;
        total += recv[j];
        rows += splits[j];
    }
    uint8_t *out = HVDL_INJECT(e, INJ_OUTPUT_ALLOC) ? NULL : alloc_output(total);
    if (!out) {
        free(splits);
        return hvdl__oom(e, "alltoall result", total);
    }
    int64_t longest = 0;
    for (int k = 0; k < n * n; k++)
        if (matrix[k] * row > longest) longest = matrix[k] * row;
    if (alg == ALG_SHM ? hvdl__alltoall_shm(&e->ctx, o->input, send, out, recv, longest)
                       : hvdl__alltoall_pairwise(&e->ctx, g, o->input, send, out, recv)) {
        free(out);
        free(splits);
        return -1;
    }
    o->result = (hvdl_result){
        .data = out, .nbytes = total, .first_dim = rows, .recv_splits = splits, .nsplits = n};
    return 0;
}

static int dispatch(engine_t *e, const group_t *g, response_t *r, slot_t *s) {
    const meta_t *m = &r->meta;
    switch (m->op) {
    case HVDL_OP_ALLREDUCE: return exec_allreduce(e, g, m, s, r->ntensors, r->alg);
    case HVDL_OP_ALLGATHER: return exec_allgather(e, g, s->op, r->dim0, r->alg);
    case HVDL_OP_BROADCAST: return exec_broadcast(e, g, m, s->op, r->alg);
    case HVDL_OP_REDUCESCATTER: return exec_reducescatter(e, g, m, s->op, r->alg);
    case HVDL_OP_ALLTOALL: return exec_alltoall(e, g, s->op, r->matrix, r->alg);
    case HVDL_OP_JOIN:
        s->op->result.value = m->root_rank;
        e->joined = 0;
        return 0;
    default: return 0;   /* barrier: negotiation itself was the synchronisation */
    }
}

static void put_tensor_arg(buf_t *a, const char *tensor) {
    a->len = 0;
    buf_put(a, "\"tensor\": ", 10);
    hvdl__json_str(a, tensor);
}

static void put_fmt(buf_t *a, const char *fmt, long long v1, double v2) {
    char tmp[96];
    int n = snprintf(tmp, sizeof tmp, fmt, v1, v2);
    buf_put(a, tmp, n);
}

/* The trace of one response on this rank: per tensor NEGOTIATE (enqueue -> response) and
 * QUEUE (response -> execution), then the collective with every tensor it carried. */
static void trace_response(engine_t *e, const group_t *g, const response_t *r, const slot_t *s,
                           double t_exec, double t_done) {
    char name[64];
    snprintf(name, sizeof name, "NEGOTIATE_%s", hvdl__op_trace_name(r->meta.op));
    buf_t a = {0};
    int64_t total = 0;
    for (int i = 0; i < r->ntensors; i++) {
        total += s[i].nbytes;
        if (!s[i].op) continue;
        put_tensor_arg(&a, r->names[i]);
        put_fmt(&a, ", \"bytes\": %lld", (long long)s[i].nbytes, 0);
        if (r->ready_at) {
            buf_put(&a, ", \"ready_us\": {", 15);
            for (int k = 0, first = 1; k < e->size; k++) {
                double t = r->ready_at[(int64_t)i * e->size + k];
                if (t <= 0) continue;
                put_fmt(&a, first ? "\"%lld\": %.1f" : ", \"%lld\": %.1f", k, (t - e->t0) * 1e6);
                first = 0;
            }
            buf_put(&a, "}", 1);
        }
        hvdl__tl_span(e, TL_NEGOTIATE, name, s[i].op->enqueued_at, r->received_at, buf_cstr(&a));
        put_tensor_arg(&a, r->names[i]);
        hvdl__tl_span(e, TL_QUEUE, "QUEUE", r->received_at, t_exec, buf_cstr(&a));
        if (r->kind != RESP_OK) {
            buf_put(&a, ", \"message\": ", 13);
            hvdl__json_str(&a, r->error ? r->error : "");
            hvdl__tl_instant(e, TL_COLLECTIVE, "ERROR", t_exec, buf_cstr(&a));
        }
    }
    if (r->kind == RESP_OK) {
        a.len = 0;
        buf_put(&a, "\"tensors\": [", 12);
        for (int i = 0; i < r->ntensors; i++) {
            if (i) buf_put(&a, ", ", 2);
            hvdl__json_str(&a, r->names[i]);
        }
        put_fmt(&a, "], \"bytes\": %lld", (long long)total, 0);
        put_fmt(&a, ", \"fused\": %lld", r->ntensors, 0);
        put_fmt(&a, ", \"fusion_threshold\": %lld", (long long)e->cfg.fusion_threshold, 0);
        buf_put(&a, ", \"algorithm\": ", 15);
        hvdl__json_str(&a, hvdl__alg_name(r->alg));
        hvdl__tl_span(e, TL_COLLECTIVE, hvdl__op_trace_name(r->meta.op), t_exec, t_done,
                      buf_cstr(&a));
    }
    buf_free(&a);
}

/* A response that cannot be executed safely: rank 0 sent it (or, on rank 0, a bug made it). */
static int bad_response(engine_t *e, const char *tensor, const char *why) {
    char msg[HVDL_MSG_BYTES];
    snprintf(msg, sizeof msg, "sent a response for '%.200s' with %s", tensor, why);
    if (e->rank != 0) hvdl__peer_lost(e, 0, msg);
    else
        hvdl__fail_job(e, HVDL_ERR_SYSTEM,
                       "internal error: rank 0 planned a response for '%.200s' with %s", tensor,
                       why);
    return -1;
}

int hvdl__execute(engine_t *e, response_t *r) {
    double t_exec = hvdl_now();
    const group_t *g = e->sets[r->meta.process_set];
    slot_t *s = HVDL_INJECT(e, INJ_EXEC_ALLOC) ? NULL : calloc((size_t)r->ntensors + 1, sizeof *s);
    if (!s)
        return hvdl__oom(e, "table of a response's tensors",
                         ((int64_t)r->ntensors + 1) * (int64_t)sizeof *s);
    int rc = 0;
    for (int i = 0; i < r->ntensors && !rc; i++) {
        op_t *o = strmap_del(&e->mine, r->names[i]);
        if (o) {
            s[i] = (slot_t){o, o->input, o->output, o->nbytes};
        } else if (e->joined && r->meta.op == HVDL_OP_ALLREDUCE) {
            int64_t nb = hvdl__meta_bytes(&r->metas[i]);
            void *zeros = calloc(1, (size_t)(nb ? nb : 1));
            if (!zeros) rc = hvdl__oom(e, "zero contribution", nb);
            s[i] = (slot_t){NULL, zeros, zeros, nb};
        } else if (!(e->joined && r->kind == RESP_ERROR) && r->kind != RESP_SHUTDOWN) {
            /* Every member announced every name in a response: a miss is a broken peer.
             * Not so when a member has finished without it (shutdown.c): the op fails on
             * the members that submitted it, and on the others when they do. */
            rc = bad_response(e, r->names[i], "a tensor this rank never submitted");
        }
    }
    if (!rc) {
        op_t *ops[r->ntensors + 1];
        for (int i = 0; i < r->ntensors; i++) ops[i] = s[i].op;
        const char *why = hvdl__response_problem(e, g, r, ops);
        if (why) rc = bad_response(e, r->ntensors ? r->names[0] : "", why);
    }
    if (!rc && r->kind != RESP_OK) {
        if (TL_ON(e)) trace_response(e, g, r, s, t_exec, hvdl_now());
        int status = r->kind == RESP_SHUTDOWN ? HVDL_ERR_SHUT_DOWN : HVDL_ERR_MISMATCH;
        for (int i = 0; i < r->ntensors; i++)
            if (s[i].op) hvdl__complete(e, s[i].op, status, r->error);
    } else if (!rc) {
        r->alg = choose_algorithm(e, g, r);
        rc = dispatch(e, g, r, s);
        if (!rc && TL_ON(e)) trace_response(e, g, r, s, t_exec, hvdl_now());
        /* On failure hvdl__fail has completed every op; touch none of them again. */
        for (int i = 0; !rc && i < r->ntensors; i++) {
            /* A tune op's values become the knobs before the next op is chosen (config.c) */
            if (s[i].op && s[i].op->tunes) hvdl__config_tune(&e->cfg, (const double *)s[i].out);
            if (s[i].op) hvdl__complete(e, s[i].op, HVDL_OK, NULL);
        }
    }
    for (int i = 0; i < r->ntensors; i++)
        if (!s[i].op) free(s[i].out);
    free(s);
    return rc;
}

/* A response agreed in the segment (negotiate_shm.c): cache ids alone, which this rank
 * turns into the response rank 0 would have sent, from its cache. posted_at (rank 0,
 * for the trace): per cache id, when each rank posted it, or NULL. */
int hvdl__execute_cached(engine_t *e, const int32_t *ids, int n, const double *posted_at) {
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= e->ncache)
            return hvdl__fail_job(e, HVDL_ERR_SYSTEM,
                                  "the shared-memory negotiation log names cache id %d, "
                                  "which this rank does not have",
                                  ids[i]);
    response_t r = {0};
    const char *why = NULL;
    int rc = HVDL_INJECT(e, INJ_RESPONSE_ALLOC) ||
                     hvdl__response_alloc(&r, n, e->size, e->cache[ids[0]].meta.op)
                 ? hvdl__oom(e, "response", (int64_t)n * (int64_t)sizeof(meta_t))
                 : 0;
    for (int i = 0; !rc && i < n; i++, r.ntensors++) {
        r.cached[i] = 1;
        r.cache_id[i] = ids[i];
    }
    if (!rc && hvdl__cache_apply(e, &r, &why))
        rc = why ? hvdl__fail_job(e, HVDL_ERR_SYSTEM, "the shared-memory negotiation log holds %s",
                                  why)
                 : -1;
    if (!rc && posted_at && TL_ON(e)) {            /* when each rank posted: the trace */
        if (!(r.ready_at = calloc((size_t)r.ntensors * (size_t)e->size, sizeof(double))))
            rc = hvdl__oom(e, "response trace", 8 * (int64_t)r.ntensors * e->size);
        for (int i = 0; !rc && i < r.ntensors; i++)
            memcpy(r.ready_at + (size_t)i * (size_t)e->size,
                   posted_at + (size_t)ids[i] * (size_t)e->size, sizeof(double) * (size_t)e->size);
    }
    if (!rc) {
        r.kind = RESP_OK;
        r.meta = r.metas[0];
        r.received_at = hvdl_now();
        rc = hvdl__execute(e, &r);
    }
    hvdl__response_free(&r);
    return rc;
}
