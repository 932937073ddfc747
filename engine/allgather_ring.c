/*
 * Ring allgather with a block per rank of any size (a variable first dimension).
 *
 * Rank r's own block is already in place in the output. At step s (0..P-2) rank r
 * forwards block (r - s) to its right neighbour and receives block (r - s - 1) from its
 * left straight into place, so after P-1 steps every rank has every block.
 *
 * Cost for a total of S bytes: P-1 steps; every rank sends and receives about
 * (P-1)/P * S bytes; latency (P-1) * alpha. No staging copies.
 */
#include "internal.h"
#include <stdlib.h>

int hvdl__allgather_ring(engine_t *e, void *out, const int64_t *block_bytes) {
    int P = e->size, r = e->rank;
    if (P == 1) return 0;
    int64_t *off = malloc(sizeof(int64_t) * (size_t)(P + 1));
    if (!off) return -1;
    off[0] = 0;
    for (int i = 0; i < P; i++) off[i + 1] = off[i] + block_bytes[i];
    uint8_t *o = out;
    int rc = 0;
    for (int s = 0; s < P - 1 && !rc; s++) {
        int send = ((r - s) % P + P) % P, recv = ((r - s - 1) % P + P) % P;
        xfer_t x = {(r + 1) % P, o + off[send], block_bytes[send],
                    (r - 1 + P) % P, o + off[recv], block_bytes[recv], 0, NULL, NULL};
        rc = e->tcp->exchange(e->tcp, &x);
    }
    free(off);
    return rc;
}
