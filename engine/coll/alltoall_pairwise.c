/*
 * Alltoall by pairwise exchange: at step s (1..n-1) member r sends its block for member
 * (r + s) and receives the block from member (r - s), each straight between the caller's
 * input and the output. Every pair talks exactly once and no member waits on a third.
 *
 * Cost: n-1 steps of one send and one receive; each member moves the bytes it sends and
 * receives once; latency (n-1) * alpha. Its own block is a local copy.
 */
#include "context.h"
#include <string.h>

int hvdl__alltoall_pairwise(ctx_t *c, const group_t *g, const void *in, const int64_t *send_bytes,
                            void *out, const int64_t *recv_bytes) {
    int n = g->n, r = g->me;
    int64_t soff[n + 1], roff[n + 1];
    soff[0] = roff[0] = 0;
    for (int i = 0; i < n; i++) {
        soff[i + 1] = soff[i] + send_bytes[i];
        roff[i + 1] = roff[i] + recv_bytes[i];
    }
    const uint8_t *src = in;
    uint8_t *dst = out;
    if (send_bytes[r]) memcpy(dst + roff[r], src + soff[r], (size_t)send_bytes[r]);
    for (int s = 1; s < n; s++) {
        int to = (r + s) % n, from = (r - s + n) % n;
        xfer_t x = {g->ranks[to],
                    src + soff[to],
                    send_bytes[to],
                    g->ranks[from],
                    dst + roff[from],
                    recv_bytes[from],
                    0,
                    NULL,
                    NULL};
        if (c->tcp->exchange(c->tcp, &x)) return -1;
    }
    return 0;
}
