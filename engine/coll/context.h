/*
 * What a collective algorithm sees of the engine: a narrow context (this rank's place in
 * the job, the transport, the node's shared-memory segment, scratch space, and where to
 * report a failure), as Gloo's algorithms see a Context rather than a whole library.
 *
 * The algorithm files (allreduce_*.c, allgather_*.c, reducescatter_hier.c,
 * broadcast_chain.c, alltoall_pairwise.c, collectives_shm.c, reduce.c) include this
 * header and not engine.h, so the compiler keeps them off engine_t: an algorithm cannot
 * read the queues, the negotiation state or the configuration, only what is here. The
 * engine fills one context at start-up (context.c) and hands &e->ctx to every call
 * (exec.c).
 * The transport and the shm waits are the engine's side of this boundary: they reach
 * the peers' sockets and the liveness checks through the context's engine.
 */
#ifndef HVDL_CONTEXT_H
#define HVDL_CONTEXT_H
#include <stdatomic.h>
#include <stdint.h>
#include <stddef.h>
#include "horovodlike.h"
#include "util.h"
#include "platform.h"
#include "transport.h"

/* A process set as the algorithms see it: members' global ranks, sorted, and this
 * rank's index among them (-1 if not a member). Immutable once registered, but for
 * removed: set under the engine's mu by hvdl_remove_process_set, read by enqueue
 * checks on any thread (atomic, seq_cst: set once, and a load costs a plain load). */
typedef struct group {
    int id;
    int n;
    int me;
    int *ranks;
    atomic_int removed;
} group_t;

struct engine;

/* Failure injection sites, for tests (inject.c). An algorithm asks HVDL_CTX_INJECT(c, INJ_X),
 * the engine's own files HVDL_INJECT(e, INJ_X); one comparison when injection is off. */
enum {
    INJ_NONE,
    INJ_RING_ALLOC,
    INJ_RD_ALLOC,
    INJ_SHM_ATTACH,
    INJ_TCP_SEND,
    INJ_CTRL_SEND,
    INJ_FUSION_ALLOC,
    INJ_OUTPUT_ALLOC,
    INJ_PLAN_ALLOC,
    INJ_SCATTER_ALLOC,
    INJ_DECODE_ALLOC,
    INJ_FRAME_ALLOC,
    INJ_EXEC_ALLOC,
    INJ_CACHE_ALLOC,
    INJ_ANNOUNCE_ALLOC,
    INJ_RECORD_ALLOC,
    INJ_RESPONSE_ALLOC,
    INJ_PLAN_FRAME_ALLOC,
    INJ_TOOK_ALLOC,
    INJ_LOG_ALLOC,
    INJ_NODES_ALLOC,
    INJ_DEADLOCK_ALLOC,
    INJ_HIER_ALLOC,
    INJ_START_ALLOC,
    INJ_WAIT_ALLOC,
    INJ_NSITES
};

/* The context. Everything in it is set at start-up and read-only afterwards, except the
 * scratch buffers, which the algorithms grow, and the segment's phase counters. */
typedef struct ctx {
    int rank, size;          /* this rank; ranks in the job (global numbering) */
    const int *node;         /* node index of every global rank (0 = rank 0's node) */
    int nnodes;
    transport_t *tcp;        /* exchanges between any two ranks */
    int64_t chunk_bytes;     /* staging size of receive-and-reduce (HOROVODLIKE_CHUNK_BYTES) */
    hvdl_shm_t *shm;         /* this node's segment, NULL when alone or disabled */
    int spin_us;             /* look before sleeping in a shm wait (0: ranks outnumber cores) */
    const group_t *cross;    /* ranks with my local index on every node (hierarchical), or NULL */
    buf_t scratch;           /* staging for receive-and-reduce and recursive doubling */
    buf_t hier;              /* hierarchical allreduce: this rank's shares */
    atomic_int *tl_on;       /* tracing switch (timeline.c) */
    int inject_site;         /* HOROVODLIKE_TEST_INJECT's site, INJ_NONE when off */
    struct engine *engine;   /* opaque: only for the calls below and hvdl__tl_span */
} ctx_t;

/* Failure reporting: the one way an algorithm fails with a cause of its own (out of
 * memory); the cause is the job's, so every rank reports it (hvdl__oom, fail.c).
 * Failures inside the transport or a shm wait are reported where they happen; the
 * algorithm just returns -1. */
int hvdl__ctx_oom(ctx_t *c, const char *what, int64_t bytes);   /* reports it; returns -1 */
static inline int hvdl__ctx_tracing(const ctx_t *c) {
    return atomic_load_explicit(c->tl_on, memory_order_relaxed);
}
int hvdl__ctx_inject_fire(ctx_t *c);
#define HVDL_CTX_INJECT(c, site) \
    (__builtin_expect((c)->inject_site == (site), 0) && hvdl__ctx_inject_fire(c))
void hvdl__ctx_span(ctx_t *c, const char *name, double t0, double t1, int64_t bytes);
/* What an algorithm's own wait (one on a helper thread of its own) must do in its place
 * every few tens of milliseconds: read the control connections and keep the heartbeats,
 * as the transport's and the segment's waits do. -1 once the engine has failed. */
int hvdl__ctx_watch(ctx_t *c);

/* reduce.c */
void hvdl__reduce(int dtype, int op, void *dst, const void *src, int64_t count);
void hvdl__reduce_to(int dtype, int op, void *dst, const void *a, const void *b, int64_t count);
void hvdl__scale(int dtype, void *buf, int64_t count, double factor);

/* shm.c: the segment's one synchronisation primitive */
/* shm.c: the segment's one synchronisation primitive (hvdl__shm_slot: transport.h) */
void hvdl__shm_post(ctx_t *c);
int hvdl__shm_wait_all(ctx_t *c);

/* The collectives, one file each. Every member of the group calls with the same sizes. */
int hvdl__reduce_scatter_ring(ctx_t *c, const group_t *g, void *buf, const int64_t *seg_bytes,
                              int dtype, int op);
/* post multiplies the result (1.0: none); the ring and hierarchical algorithms apply it
 * to each segment once, where it is finished, not to the whole buffer afterwards. */
int hvdl__allreduce_ring(ctx_t *c, const group_t *g, void *buf, int64_t count, int dtype, int op,
                         double post);
int hvdl__allgather_ring(ctx_t *c, const group_t *g, void *out, const int64_t *block_bytes);
int hvdl__broadcast_chain(ctx_t *c, const group_t *g, void *buf, int64_t nbytes, int root);
int hvdl__allreduce_rd(ctx_t *c, const group_t *g, void *buf, int64_t count, int dtype, int op);
int hvdl__allreduce_hier(ctx_t *c, void *buf, int64_t count, int dtype, int op, double post);
int hvdl__allgather_hier(ctx_t *c, void *out, const int64_t *block_bytes);
/* Segment seg_bytes[r] of the sum to global rank r (pre multiplies the input, post the
 * result): shm on each node, then a ring reduce-scatter across nodes. */
int hvdl__reducescatter_hier(ctx_t *c, const void *in, const int64_t *seg_bytes, void *out,
                             int dtype, int op, double pre, double post);
int hvdl__alltoall_pairwise(ctx_t *c, const group_t *g, const void *in, const int64_t *send_bytes,
                            void *out, const int64_t *recv_bytes);
/* collectives_shm.c: the group is every rank of this node */
/* post multiplies the result (Average's 1/n, a postscale) inside the algorithm, where the
 * data is in cache: 1.0 for none. */
int hvdl__allreduce_shm(ctx_t *c, const void *in, void *out, int64_t count, int dtype, int op,
                        double post);
typedef struct span {
    const void *in;
    void *out;
    int64_t nbytes;
} span_t;
int hvdl__allreduce_shm_spans(ctx_t *c, const span_t *v, int nspans, int dtype, int op,
                              double post);
/* The hierarchical allreduce's shm halves, over bytes [lo, hi) of the buffer, lo a
 * multiple of hvdl__shm_piece_bytes: this rank's shares of the range reduced over the
 * node, contiguous in `shares` (hvdl__shm_share_bytes of them), and back. */
int64_t hvdl__shm_piece_bytes(const ctx_t *c);
int64_t hvdl__shm_share_bytes(const ctx_t *c, int64_t lo, int64_t hi, int dtype);
int hvdl__shm_reduce_scatter(ctx_t *c, const void *buf, int64_t lo, int64_t hi, int dtype, int op,
                             uint8_t *shares);
int hvdl__shm_allgather_shares(ctx_t *c, void *buf, int64_t lo, int64_t hi, int dtype,
                               const uint8_t *shares);
int hvdl__broadcast_shm(ctx_t *c, void *buf, int64_t bytes, int root);
int hvdl__reducescatter_shm(ctx_t *c, const void *in, const int64_t *seg_bytes, void *out,
                            int dtype, int op, double post);
int hvdl__alltoall_shm(ctx_t *c, const void *in, const int64_t *send_bytes, void *out,
                       const int64_t *recv_bytes, int64_t longest);
int hvdl__allgather_shm(ctx_t *c, void *out, const int64_t *block_bytes);

#endif
