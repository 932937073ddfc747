/*
 * Hierarchical reducescatter: shared memory inside each node, TCP only between nodes.
 *
 * Rank r = (node k, local index j) wants segment r of the sum. The ranks with local
 * index j on every node (the cross group of allreduce_hier.c) want, between them, the
 * segments (0, j), (1, j), ... (N-1, j). So:
 *  1. Each rank lays its input out by local index: block j = its segments (0, j),
 *     (1, j), ..., (N-1, j), in node order (one copy of the input, with the prescale).
 *  2. shm reducescatter on each node (collectives_shm.c): local rank j gets the node's
 *     sum of block j.
 *  3. Ring reduce-scatter over the cross group: member k ends with the sum over nodes of
 *     segment (k, j), its own result, which it scales (post) into its output.
 *
 * Cost for S bytes, N nodes of L ranks: the network carries (N-1)/N * S/L per rank, so
 * (N-1)/N * S per node, against (NL-1)/(NL) * S per node for a flat ring over all ranks
 * (one stream crosses each node boundary): at N = L = 2, S/2 against 3S/4. The node's
 * work is one copy of S and the shm reducescatter (S/L reduced per rank). Latency:
 * ceil(S / (L C)) shm barriers and N-1 ring steps.
 *
 * Reduction order: each segment is summed over a node in local rank order, then the N
 * node sums around the ring; each segment's result is computed by its owner alone.
 * Needs every node to have the same number of ranks.
 */
#include "context.h"
#include <string.h>

int hvdl__reducescatter_hier(ctx_t *c, const void *in, const int64_t *seg_bytes, void *out,
                             int dtype, int op, double pre, double post) {
    int P = c->size, L = c->shm->nlocal, N = c->cross->n, me = c->shm->me, esz;
    int at[N][L], kof[P], jof[P];   /* the rank at (node k, local j); each rank's k, j */
    int64_t goff[P + 1], block[L], cross[N], total = 0;
    esz = hvdl_dtype_size(dtype);
    goff[0] = 0;
    for (int r = 0; r < P; r++) goff[r + 1] = goff[r] + seg_bytes[r];
    for (int r = 0; r < P; r++) {
        kof[r] = -1;
        for (int k = 0; k < N; k++)
            if (c->node[c->cross->ranks[k]] == c->node[r]) kof[r] = k;
        jof[r] = 0;
        for (int q = 0; q < r; q++) jof[r] += c->node[q] == c->node[r];
        at[kof[r]][jof[r]] = r;
    }
    for (int j = 0; j < L; j++) {
        block[j] = 0;
        for (int k = 0; k < N; k++) block[j] += seg_bytes[at[k][j]];
        total += block[j];
    }
    for (int k = 0; k < N; k++) cross[k] = seg_bytes[at[k][me]];
    /* the laid-out input, then this rank's block of node sums */
    if (HVDL_CTX_INJECT(c, INJ_HIER_ALLOC) || buf_reserve(&c->hier, total + block[me] + 1))
        return hvdl__ctx_oom(c, "hierarchical reducescatter buffer", total + block[me] + 1);
    uint8_t *laid = c->hier.data, *mine = laid + total;
    int64_t pos = 0;
    for (int j = 0; j < L; j++)
        for (int k = 0; k < N; k++) {
            int r = at[k][j];
            if (seg_bytes[r])
                memcpy(laid + pos, (const uint8_t *)in + goff[r], (size_t)seg_bytes[r]);
            pos += seg_bytes[r];
        }
    hvdl__scale(dtype, laid, total / esz, pre);
    if (hvdl__reducescatter_shm(c, laid, block, mine, dtype, op, 1.0)) return -1;
    if (hvdl__reduce_scatter_ring(c, c->cross, mine, cross, dtype, op)) return -1;
    int64_t off = 0;
    for (int k = 0; k < c->cross->me; k++) off += cross[k];
    if (cross[c->cross->me]) memcpy(out, mine + off, (size_t)cross[c->cross->me]);
    hvdl__scale(dtype, out, cross[c->cross->me] / esz, post);
    return 0;
}
