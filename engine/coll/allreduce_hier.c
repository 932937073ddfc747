/*
 * Hierarchical allreduce: shared memory inside each node, TCP only between nodes,
 * pipelined piece by piece.
 *
 * Three steps carry every piece of the buffer:
 *  1. shm reduce-scatter on each node: local rank j ends up with the node's sum of its
 *     share of the piece (see collectives_shm.c), appended to one contiguous buffer.
 *  2. One cross-node ring per local rank: the ranks with the same local index on every
 *     node allreduce those shares over TCP, so each ring carries 1/L of the piece.
 *  3. shm all-gather on each node: every local rank copies every share back into place.
 * The rings run on a helper thread, back to back in piece order, while this (the
 * engine's) thread does the node's work around them:
 *     round k = 0..Q:  reduce-scatter piece k and hand it to the helper (k < Q);
 *                      wait for piece k-1's ring, all-gather piece k-1 (k >= 1)
 * so piece k's ring runs while piece k+1 is reduce-scattered and piece k-1 all-gathered,
 * and the helper finds piece k+1 ready when it finishes piece k. The sequence of shm
 * barriers is the same on every local rank whatever the network does (a fixed
 * schedule, never "whichever is ready"), as the segment's barriers need. A piece is
 * PIECE_SHM_PIECES of the two-shot's pieces, so all nodes cut alike (the shm piece
 * depends only on L and the agreed HOROVODLIKE_SHM_CHUNK_BYTES).
 *
 * Cost for S bytes, N nodes of L ranks, a link of B bytes/s each way per node (the L
 * rings of a node share it), and the node's reduce-scatter and all-gather taking
 * S/R_rs and S/R_ag. The network carries 2(N-1)/N * S per node (2(N-1)/N * S/L per
 * rank), against 2(NL-1)/(NL) * S per node for a flat ring over all ranks, whose every
 * node boundary one stream crosses: at N = L = 2 hier/flat >= (1/2)/(3/4) = 0.67.
 *   one after another:  T = S/R_rs + 2(N-1)/N * S/B + S/R_ag
 *   Q pieces:           T = max(2(N-1)/N * S/B, S/R_rs + S/R_ag)
 *                           + (S/R_rs + S/R_ag)/Q + Q * t_piece
 * where the first term is the busier of the link and the node's memory work, the second
 * the first piece's reduce-scatter and the last piece's all-gather that nothing hides,
 * and t_piece a piece's fixed cost (the ring's 2(N-1) steps of latency and two thread
 * hand-offs, tens of microseconds). With 1 MiB pieces (L = 2) 64 MiB is 64 pieces.
 * A buffer of one piece runs the three steps in turn on this thread, as does every
 * piece if the helper cannot be started (the barrier sequence is the same either way).
 *
 * Reduction order. Inside a node nothing changed: each shm piece's shares are reduced
 * in local rank order. Across nodes the ring now reduces each piece's shares rather
 * than the whole share buffer at once, so which member of the ring starts an element's
 * sum depends on its place in its piece. With two nodes that changes nothing (a op b ==
 * b op a bitwise for +, *, min and max; only NaN payloads could differ); with three or
 * more the association of the node sums may differ from the unpipelined order. Either
 * way every rank receives the one value that the element's ring owner computed, so all
 * ranks agree bitwise, and every run of the same job computes the same.
 *
 * It needs every node to have the same number of ranks.
 */
#include "context.h"
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#define PIECE_SHM_PIECES 2

static atomic_int untraced;   /* the helper's tracing switch: always off */

/* The helper's side: its own copy of the context (the detached transport, no tracing,
 * no injection, the engine's ring staging buffer, which this thread does not touch
 * meanwhile) and the hand-off, under mu: `ready` pieces handed over, `done` rings
 * finished. */
typedef struct cross {
    ctx_t c;
    detached_t d;
    uint8_t *shares;
    int64_t full, last;       /* this rank's share bytes of a whole piece, of the last */
    int q, dtype, op;
    double post;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int ready, done, stop, failed;
    double ring_t0, ring_t1;  /* for the trace: the first ring's start, the last's end */
} cross_t;

static int ring(cross_t *x, ctx_t *c, int k) {
    int64_t n = k + 1 < x->q ? x->full : x->last;
    if (k == 0) x->ring_t0 = hvdl_now();
    /* the ring scales what it finishes (post), so step 3 copies scaled shares */
    int rc = hvdl__allreduce_ring(c, c->cross, x->shares + k * x->full,
                                  n / hvdl_dtype_size(x->dtype), x->dtype, x->op, x->post);
    x->ring_t1 = hvdl_now();
    return rc;
}

static void *cross_main(void *arg) {
    cross_t *x = arg;
    for (int k = 0; k < x->q; k++) {
        pthread_mutex_lock(&x->mu);
        while (x->ready <= k && !x->stop) pthread_cond_wait(&x->cv, &x->mu);
        int go = !x->stop;
        pthread_mutex_unlock(&x->mu);
        if (!go) break;
        int rc = ring(x, &x->c, k);
        pthread_mutex_lock(&x->mu);
        if (rc) x->failed = 1;
        else x->done = k + 1;
        pthread_cond_broadcast(&x->cv);
        pthread_mutex_unlock(&x->mu);
        if (rc) break;
    }
    return NULL;
}

/* Piece k's shares are ready: to the helper, or (none) its ring now, here. */
static int hand_over(cross_t *x, ctx_t *c, int threaded, int k) {
    if (!threaded) {
        if (ring(x, c, k)) return -1;
        x->done = k + 1;
        return 0;
    }
    pthread_mutex_lock(&x->mu);
    x->ready = k + 1;
    pthread_cond_signal(&x->cv);
    pthread_mutex_unlock(&x->mu);
    return 0;
}

/* Until piece k's ring is done. Meanwhile this thread keeps the engine's watch (control
 * frames, heartbeats) that the helper's detached transport leaves to it. */
static int wait_ring(cross_t *x, ctx_t *c, int k) {
    pthread_mutex_lock(&x->mu);
    while (x->done <= k && !x->failed) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&x->cv, &x->mu, &ts);
        if (x->done > k || x->failed) break;
        pthread_mutex_unlock(&x->mu);
        int bad = hvdl__ctx_watch(c);
        pthread_mutex_lock(&x->mu);
        if (bad) break;
    }
    int ok = x->done > k;
    pthread_mutex_unlock(&x->mu);
    return ok ? 0 : -1;
}

int hvdl__allreduce_hier(ctx_t *c, void *buf, int64_t count, int dtype, int op, double post) {
    int64_t bytes = count * hvdl_dtype_size(dtype);
    if (!bytes) return 0;
    int64_t piece = hvdl__shm_piece_bytes(c) * PIECE_SHM_PIECES;
    int q = (int)((bytes + piece - 1) / piece);
    /* Every piece but the last is whole, and whole pieces have equal shares: piece k's
     * shares start at k * full. */
    int64_t full = hvdl__shm_share_bytes(c, 0, piece, dtype);
    int64_t last = hvdl__shm_share_bytes(c, (int64_t)(q - 1) * piece, bytes, dtype);
    int64_t total = (int64_t)(q - 1) * full + last;
    /* All of it before the helper starts: its buffers never move while it runs. */
    if (HVDL_CTX_INJECT(c, INJ_HIER_ALLOC) || buf_reserve(&c->hier, total + 1))
        return hvdl__ctx_oom(c, "hierarchical share buffer", total + 1);
    if (HVDL_CTX_INJECT(c, INJ_RING_ALLOC) || buf_reserve(&c->scratch, c->chunk_bytes))
        return hvdl__ctx_oom(c, "ring staging buffer", c->chunk_bytes);

    cross_t x = {.shares = c->hier.data,
                 .full = full,
                 .last = last,
                 .q = q,
                 .dtype = dtype,
                 .op = op,
                 .post = post};
    x.c = *c;
    hvdl__detached_init(&x.d, c->tcp);
    x.c.tcp = &x.d.base;
    x.c.tl_on = &untraced;
    x.c.inject_site = INJ_NONE;
    pthread_t helper;
    int threaded = 0;
    if (q > 1 && !pthread_mutex_init(&x.mu, NULL)) {
        if (!pthread_cond_init(&x.cv, NULL)) {
            threaded = !pthread_create(&helper, NULL, cross_main, &x);
            if (!threaded) pthread_cond_destroy(&x.cv);
        }
        if (!threaded) pthread_mutex_destroy(&x.mu);
    }

    int rc = 0;
    double t_rs0 = hvdl_now(), t_rs1 = t_rs0, t_ag0 = 0;
    for (int k = 0; k <= q && !rc; k++) {
        if (k < q) {
            int64_t lo = k * piece, hi = k + 1 < q ? lo + piece : bytes;
            rc = hvdl__shm_reduce_scatter(c, buf, lo, hi, dtype, op, x.shares + k * full) ||
                 hand_over(&x, c, threaded, k);
            t_rs1 = hvdl_now();
        }
        if (k >= 1 && !rc) {
            int64_t lo = (k - 1) * piece, hi = k < q ? lo + piece : bytes;
            rc = (threaded && wait_ring(&x, c, k - 1));
            if (k == 1) t_ag0 = hvdl_now();
            rc = rc || hvdl__shm_allgather_shares(c, buf, lo, hi, dtype, x.shares + (k - 1) * full);
        }
    }
    if (threaded) {
        pthread_mutex_lock(&x.mu);
        x.stop = 1;
        atomic_store(&x.d.cancel, 1);
        pthread_cond_broadcast(&x.cv);
        pthread_mutex_unlock(&x.mu);
        pthread_join(helper, NULL);
        pthread_cond_destroy(&x.cv);
        pthread_mutex_destroy(&x.mu);
        /* the helper's failure, reported now that one thread is left */
        if (hvdl__detached_report(&x.d)) rc = -1;
    }
    if (rc) return -1;
    if (hvdl__ctx_tracing(c)) {   /* the three steps overlap: each from its first to last piece */
        hvdl__ctx_span(c, "SHM_REDUCE_SCATTER", t_rs0, t_rs1, bytes);
        hvdl__ctx_span(c, "TCP_CROSS_RING", x.ring_t0, x.ring_t1, bytes);
        hvdl__ctx_span(c, "SHM_ALLGATHER", t_ag0, hvdl_now(), bytes);
    }
    return 0;
}
