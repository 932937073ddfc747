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
#include "internal.h"
#include <stdio.h>

int hvdl__allreduce_hier(engine_t *e, void *buf, int64_t count, int dtype, int op) {
    int64_t bytes = count * hvdl_dtype_size(dtype);
    if (!bytes) return 0;
    double t0 = hvdl_now();
    int64_t share;
    if (hvdl__shm_reduce_scatter(e, buf, bytes, dtype, op, &e->hier, &share)) return -1;
    double t1 = hvdl_now();
    if (hvdl__allreduce_ring(e, e->cross, e->hier.data, share / hvdl_dtype_size(dtype), dtype, op))
        return -1;
    double t2 = hvdl_now();
    if (hvdl__shm_allgather_shares(e, buf, bytes, dtype, e->hier.data)) return -1;
    if (TL_ON(e)) {
        char args[64];
        snprintf(args, sizeof args, "\"bytes\": %lld", (long long)bytes);
        hvdl__tl_span(e, TL_ALGORITHM, "SHM_REDUCE_SCATTER", t0, t1, args);
        hvdl__tl_span(e, TL_ALGORITHM, "TCP_CROSS_RING", t1, t2, args);
        hvdl__tl_span(e, TL_ALGORITHM, "SHM_ALLGATHER", t2, hvdl_now(), args);
    }
    return 0;
}
