/*
 * Recursive-doubling allreduce over TCP, for small buffers.
 *
 * With p = the largest power of two <= n members, the n - p "extra" members first hand
 * their buffers to a partner among the first n - p (which reduces them in), then the p
 * members run log2(p) rounds: in round k member i exchanges its whole buffer with member
 * i XOR 2^k and reduces what it receives. Finally the partners send the result back.
 *
 * Cost for S bytes: log2(p) rounds (+2 when n is not a power of two), each moving S in
 * both directions: latency log2(p) * alpha against the ring's 2(n-1) * alpha, bandwidth
 * log2(p) * S against the ring's 2S. The choice below HOROVODLIKE_SMALL_BYTES.
 * Both partners reduce in the same order (lower member's data first) so every member
 * ends with bit-identical results.
 */
#include "context.h"
#include <string.h>

static int exchange(ctx_t *c, int peer, const void *send, void *recv, int64_t bytes) {
    xfer_t x = {peer, send, bytes, peer, recv, bytes, 0, NULL, NULL};
    return c->tcp->exchange(c->tcp, &x);
}

static int one_way(ctx_t *c, int to, int from, void *buf, int64_t bytes) {
    xfer_t x = {to, buf, to >= 0 ? bytes : 0, from, buf, from >= 0 ? bytes : 0, 0, NULL, NULL};
    return c->tcp->exchange(c->tcp, &x);
}

int hvdl__allreduce_rd(ctx_t *c, const group_t *g, void *buf, int64_t count, int dtype, int op) {
    int n = g->n, me = g->me, esz = hvdl_dtype_size(dtype);
    int64_t bytes = count * esz;
    if (n == 1 || count == 0) return 0;
    if (HVDL_CTX_INJECT(c, INJ_RD_ALLOC) || buf_reserve(&c->scratch, 2 * bytes))
        return hvdl__ctx_oom(c, "recursive-doubling scratch buffer", 2 * bytes);
    uint8_t *tmp = c->scratch.data, *mine = tmp + bytes;
    int p = 1;
    while (p * 2 <= n) p *= 2;
    int extra = n - p;
    if (me >= p) {                                   /* fold in, then wait for the result */
        if (one_way(c, g->ranks[me - p], -1, buf, bytes)) return -1;
        return one_way(c, -1, g->ranks[me - p], buf, bytes);
    }
    if (me < extra) {
        if (one_way(c, -1, g->ranks[me + p], tmp, bytes)) return -1;
        hvdl__reduce(dtype, op, buf, tmp, count);
    }
    for (int mask = 1; mask < p; mask <<= 1) {
        int partner = me ^ mask;
        if (exchange(c, g->ranks[partner], buf, tmp, bytes)) return -1;
        /* lower member's data first, so both sides compute the same bits */
        if (partner < me) {
            memcpy(mine, buf, (size_t)bytes);
            memcpy(buf, tmp, (size_t)bytes);
            hvdl__reduce(dtype, op, buf, mine, count);
        } else {
            hvdl__reduce(dtype, op, buf, tmp, count);
        }
    }
    if (me < extra) return one_way(c, g->ranks[me + p], -1, buf, bytes);
    return 0;
}
