/*
 * Broadcast as a pipelined chain through the set: root -> root+1 -> ... -> root+n-1.
 *
 * The buffer travels in chunks; a member in the middle of the chain forwards chunk k-1 to
 * its right while it receives chunk k from its left, so every link is busy at once.
 * The root and the last member each do one plain send or receive of the whole buffer.
 *
 * Cost for S bytes in chunks of C: S/B + (n-2) * C/B + (n-1) * alpha, i.e. close to one
 * transfer of S for large buffers, against (n-1) * S/B for a root that sends to all.
 * `root` is the root's index in the set.
 */
#include "context.h"

int hvdl__broadcast_chain(ctx_t *c, const group_t *g, void *buf, int64_t nbytes, int root) {
    int n = g->n;
    if (n == 1 || nbytes == 0) return 0;
    int v = (g->me - root + n) % n;        /* position in the chain */
    int left = g->ranks[(g->me - 1 + n) % n], right = g->ranks[(g->me + 1) % n];
    uint8_t *b = buf;
    if (v == 0 || v == n - 1) {
        xfer_t x = {v == 0 ? right : -1,
                    b,
                    v == 0 ? nbytes : 0,
                    v == 0 ? -1 : left,
                    b,
                    v == 0 ? 0 : nbytes,
                    0,
                    NULL,
                    NULL};
        return c->tcp->exchange(c->tcp, &x);
    }
    /* Chunks larger than the reduce staging: there is no arithmetic to keep in cache. */
    int64_t chunk = c->chunk_bytes * 4;
    int64_t nchunks = (nbytes + chunk - 1) / chunk;
    for (int64_t k = 0; k <= nchunks; k++) {
        int64_t s_off = (k - 1) * chunk, r_off = k * chunk;
        int64_t slen = k > 0 ? (nbytes - s_off < chunk ? nbytes - s_off : chunk) : 0;
        int64_t rlen = k < nchunks ? (nbytes - r_off < chunk ? nbytes - r_off : chunk) : 0;
        xfer_t x = {slen ? right : -1,
                    b + (slen ? s_off : 0),
                    slen,
                    rlen ? left : -1,
                    b + (rlen ? r_off : 0),
                    rlen,
                    0,
                    NULL,
                    NULL};
        if (c->tcp->exchange(c->tcp, &x)) return -1;
    }
    return 0;
}
