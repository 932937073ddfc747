/*
 * Ring reduce-scatter and ring allreduce, pipelined (Patarasuk & Yuan's
 * bandwidth-optimal ring), over any process set.
 *
 * The ring algorithm works as follows. The buffer is cut into n segments, one per member.
 *  1. Reduce-scatter, n-1 steps: at step s member r sends segment (r - s - 1) to its right
 *     neighbour and receives segment (r - s - 2) from its left, reducing it into its own
 *     copy. After the last step member r holds the full reduction of segment r.
 *  2. All-gather (allgather_ring.c), n-1 steps: every member forwards the final segments
 *     around the ring, straight into place.
 * Each receive in step 1 is reduced chunk by chunk as it lands (see tcp.c), so
 * the arithmetic overlaps the transfer and only one chunk of staging is needed.
 *
 * Cost for S bytes: 2(n-1) steps; every member sends and receives 2(n-1)/n * S bytes and
 * reduces (n-1)/n * S bytes; latency 2(n-1) * alpha. Bandwidth-optimal, so it is the
 * choice for large buffers; small ones pay the 2(n-1) latency terms. A postscale
 * (Average's 1/n) costs S/n multiplies per member: each scales its own segment between
 * the two phases.
 * reducescatter is step 1 alone, with segments of the caller's row split.
 */
#include "context.h"
#include <stdlib.h>

typedef struct reduce_ctx {
    uint8_t *dst;            /* start of the segment being reduced into */
    int dtype, op, esz;
} reduce_ctx_t;

static void reduce_chunk(void *ctx, int64_t offset, const void *data, int64_t len) {
    reduce_ctx_t *c = ctx;
    hvdl__reduce(c->dtype, c->op, c->dst + offset, data, len / c->esz);
}

static int mod(int a, int n) { return ((a % n) + n) % n; }

int hvdl__reduce_scatter_ring(ctx_t *c, const group_t *g, void *buf, const int64_t *seg_bytes,
                              int dtype, int op) {
    int n = g->n, r = g->me;
    if (n == 1) return 0;
    int64_t off[n + 1];
    off[0] = 0;
    for (int i = 0; i < n; i++) off[i + 1] = off[i] + seg_bytes[i];
    if (HVDL_CTX_INJECT(c, INJ_RING_ALLOC) || buf_reserve(&c->scratch, c->chunk_bytes))
        return hvdl__ctx_oom(c, "ring staging buffer", c->chunk_bytes);
    reduce_ctx_t rc = {NULL, dtype, op, hvdl_dtype_size(dtype)};
    uint8_t *b = buf;
    int left = g->ranks[mod(r - 1, n)], right = g->ranks[mod(r + 1, n)];
    for (int s = 0; s < n - 1; s++) {
        int send = mod(r - s - 1, n), recv = mod(r - s - 2, n);
        rc.dst = b + off[recv];
        xfer_t x = {right,           b + off[send],  seg_bytes[send], left, c->scratch.data,
                    seg_bytes[recv], c->chunk_bytes, reduce_chunk,    &rc};
        if (c->tcp->exchange(c->tcp, &x)) return -1;
    }
    return 0;
}

int hvdl__allreduce_ring(ctx_t *c, const group_t *g, void *buf, int64_t count, int dtype, int op,
                         double post) {
    int n = g->n;
    if (count == 0) return 0;
    if (n == 1) {
        hvdl__scale(dtype, buf, count, post);
        return 0;
    }
    int esz = hvdl_dtype_size(dtype);
    int64_t seg[n];
    for (int i = 0; i < n; i++) seg[i] = (count / n + (i < count % n)) * esz;   /* balanced */
    double t0 = hvdl_now();
    if (hvdl__reduce_scatter_ring(c, g, buf, seg, dtype, op)) return -1;
    /* This member's segment is final: scale it once here (Average's 1/n) and the
     * all-gather hands every member scaled data, with no pass over the whole buffer. */
    int64_t mine = 0;
    for (int i = 0; i < g->me; i++) mine += seg[i];
    hvdl__scale(dtype, (uint8_t *)buf + mine, seg[g->me] / esz, post);
    double t1 = hvdl_now();
    if (hvdl__allgather_ring(c, g, buf, seg)) return -1;
    if (hvdl__ctx_tracing(c)) {
        hvdl__ctx_span(c, "TCP_RING_REDUCE_SCATTER", t0, t1, count * esz);
        hvdl__ctx_span(c, "TCP_RING_ALLGATHER", t1, hvdl_now(), count * esz);
    }
    return 0;
}
