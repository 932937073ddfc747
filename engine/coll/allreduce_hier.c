/*
 * Hierarchical allreduce: shared memory inside each node, TCP only between nodes.
 *
 *  1. shm reduce-scatter on each node: local rank j ends up with the node's sum of its
 *     share of every piece (see collectives_shm.c), gathered into one contiguous buffer.
 *  2. One cross-node ring per local rank: the ranks with the same local index on every
 *     node allreduce those shares over TCP, so each ring carries 1/L of the buffer.
 *  3. shm all-gather on each node: every local rank copies every share back into place.
 *
 * Cost for S bytes, N nodes of L ranks: the network carries 2(N-1)/N * S/L per rank
 * (2(N-1)/N * S per node, against 2(NL-1)/(NL) * S per rank, i.e. about L times more per
 * node, for a flat ring over all ranks); the node-local steps cost what the shm
 * two-shot costs. It needs every node to have the same number of ranks.
 */
#include "context.h"

int hvdl__allreduce_hier(ctx_t *c, void *buf, int64_t count, int dtype, int op, double post) {
    int64_t bytes = count * hvdl_dtype_size(dtype);
    if (!bytes) return 0;
    double t0 = hvdl_now();
    int64_t share;
    if (hvdl__shm_reduce_scatter(c, buf, bytes, dtype, op, &c->hier, &share)) return -1;
    double t1 = hvdl_now();
    /* the cross ring scales what it finishes (post), so step 3 copies scaled shares */
    if (hvdl__allreduce_ring(c, c->cross, c->hier.data, share / hvdl_dtype_size(dtype), dtype, op,
                             post))
        return -1;
    double t2 = hvdl_now();
    if (hvdl__shm_allgather_shares(c, buf, bytes, dtype, c->hier.data)) return -1;
    if (hvdl__ctx_tracing(c)) {
        hvdl__ctx_span(c, "SHM_REDUCE_SCATTER", t0, t1, bytes);
        hvdl__ctx_span(c, "TCP_CROSS_RING", t1, t2, bytes);
        hvdl__ctx_span(c, "SHM_ALLGATHER", t2, hvdl_now(), bytes);
    }
    return 0;
}
