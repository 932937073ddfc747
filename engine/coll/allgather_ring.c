/*
 * Ring allgather with a block per member of any size (a variable first dimension).
 *
 * Member r's own block is already in place in the output. At step s (0..n-2) member r
 * forwards block (r - s) to its right neighbour and receives block (r - s - 1) from its
 * left straight into place, so after n-1 steps every member has every block.
 *
 * Cost for a total of S bytes: n-1 steps; every member sends and receives about
 * (n-1)/n * S bytes; latency (n-1) * alpha. No staging copies.
 */
#include "context.h"

static int mod(int a, int n) { return ((a % n) + n) % n; }

int hvdl__allgather_ring(ctx_t *c, const group_t *g, void *out, const int64_t *block_bytes) {
    int n = g->n, r = g->me;
    if (n == 1) return 0;
    int64_t off[n + 1];
    off[0] = 0;
    for (int i = 0; i < n; i++) off[i + 1] = off[i] + block_bytes[i];
    uint8_t *o = out;
    int left = g->ranks[mod(r - 1, n)], right = g->ranks[mod(r + 1, n)];
    for (int s = 0; s < n - 1; s++) {
        int send = mod(r - s, n), recv = mod(r - s - 1, n);
        xfer_t x = {right, o + off[send], block_bytes[send],
                    left,  o + off[recv], block_bytes[recv],
                    0,     NULL,          NULL};
        if (c->tcp->exchange(c->tcp, &x)) return -1;
    }
    return 0;
}
