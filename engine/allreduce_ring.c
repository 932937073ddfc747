/*
 * Ring allreduce, pipelined (Patarasuk & Yuan's bandwidth-optimal ring).
 *
 * The ring algorithm works as follows. The buffer is cut into P segments, one per rank.
 *  1. Reduce-scatter, P-1 steps: at step s rank r sends segment (r - s) to its right
 *     neighbour and receives segment (r - s - 1) from its left, reducing it into its own
 *     copy. After the last step rank r holds the full reduction of segment (r + 1).
 *  2. All-gather, P-1 steps: at step s rank r sends segment (r + 1 - s), which is final,
 *     and receives segment (r - s) straight into place.
 * Each receive in step 1 is reduced chunk by chunk as it lands (see transport_tcp.c),
 * so the arithmetic overlaps the transfer and only one chunk of staging is needed.
 *
 * Cost for S bytes: 2(P-1) steps; every rank sends and receives 2(P-1)/P * S bytes and
 * reduces (P-1)/P * S bytes; latency 2(P-1) * alpha. Bandwidth-optimal, so it is the
 * choice for large buffers; small ones pay the 2(P-1) latency terms.
 */
#include "internal.h"

typedef struct reduce_ctx {
    uint8_t *dst;            /* start of the segment being reduced into */
    int dtype, op, esz;
} reduce_ctx_t;

static void reduce_chunk(void *ctx, int64_t offset, const void *data, int64_t len) {
    reduce_ctx_t *c = ctx;
    hvdl__reduce(c->dtype, c->op, c->dst + offset, data, len / c->esz);
}

/* Segment i covers elements [seg_start(i), seg_start(i + 1)); sizes differ by at most 1. */
static int64_t seg_start(int64_t count, int P, int i) {
    int64_t base = count / P, rem = count % P;
    return base * i + (i < rem ? i : rem);
}

int hvdl__allreduce_ring(engine_t *e, void *buf, int64_t count, int dtype, int op) {
    int P = e->size, r = e->rank;
    if (P == 1 || count == 0) return 0;
    int esz = hvdl_dtype_size(dtype);
    int left = (r - 1 + P) % P, right = (r + 1) % P;
    uint8_t *b = buf;
    if (buf_reserve(&e->scratch, e->cfg.chunk_bytes)) return -1;
    reduce_ctx_t rc = {NULL, dtype, op, esz};

#define SEG_PTR(i) (b + seg_start(count, P, (i)) * esz)
#define SEG_LEN(i) ((seg_start(count, P, (i) + 1) - seg_start(count, P, (i))) * esz)
    for (int s = 0; s < P - 1; s++) {              /* reduce-scatter */
        int send = ((r - s) % P + P) % P, recv = ((r - s - 1) % P + P) % P;
        rc.dst = SEG_PTR(recv);
        xfer_t x = {right, SEG_PTR(send), SEG_LEN(send), left, e->scratch.data, SEG_LEN(recv),
                    e->cfg.chunk_bytes, reduce_chunk, &rc};
        if (e->tcp->exchange(e->tcp, &x)) return -1;
    }
    for (int s = 0; s < P - 1; s++) {              /* all-gather */
        int send = ((r + 1 - s) % P + P) % P, recv = ((r - s) % P + P) % P;
        xfer_t x = {right, SEG_PTR(send), SEG_LEN(send), left, SEG_PTR(recv), SEG_LEN(recv),
                    0, NULL, NULL};
        if (e->tcp->exchange(e->tcp, &x)) return -1;
    }
#undef SEG_PTR
#undef SEG_LEN
    return 0;
}
