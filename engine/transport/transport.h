/*
 * What the algorithms may use of the transport layer: the exchange between two ranks
 * (tcp.c implements it) and this node's shared-memory segment (shm.c). Nothing here
 * knows the engine; coll/ includes this header, and the engine's side of the transport
 * (net.h, shm.h) stays out of the algorithms' reach.
 */
#ifndef HVDL_TRANSPORT_H
#define HVDL_TRANSPORT_H
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* The peer-to-peer transport every algorithm talks to. An algorithm never includes a
 * backend; it calls t->exchange(). */
typedef void (*chunk_fn)(void *ctx, int64_t offset, const void *data, int64_t len);
typedef struct xfer {
    int send_peer;           /* -1: nothing to send */
    const void *sbuf;
    int64_t slen;
    int recv_peer;           /* -1: nothing to receive */
    void *rbuf;              /* destination of rlen bytes, or a staging buffer of chunk
                                bytes when on_chunk is set */
    int64_t rlen;
    int64_t chunk;           /* staging size (a multiple of every dtype size) */
    chunk_fn on_chunk;       /* called as each received chunk completes, in order */
    void *ctx;
} xfer_t;
typedef struct transport {
    const char *name;
    int (*exchange)(struct transport *t, const xfer_t *x);
} transport_t;

/* The transport as a helper thread of a collective may use it while the engine's own
 * thread runs the rest of that collective (allreduce_hier.c's cross-node ring beside the
 * shared-memory steps). The engine's control connections and heartbeats belong to one
 * thread at a time, so a detached exchange watches only its two data sockets: the
 * engine's thread keeps watching control and liveness while it waits for the helper.
 * The helper stops at its next poll (50 ms at most) once `cancel` is set, and leaves the
 * first failure it meets in `peer`/`why`, for the engine's thread to report
 * (hvdl__detached_report): a failure reported from two threads at once would race. */
typedef struct detached {
    transport_t base;        /* what the helper's algorithms call: base.exchange */
    transport_t *of;         /* the engine's transport, whose data sockets it borrows */
    atomic_int cancel;       /* set by the engine's thread: give up at the next poll */
    int failed;              /* written by the helper before it signals its owner */
    int peer;                /* the peer it failed on, or -1 (a failure of its own) */
    char why[160];
} detached_t;

/* tcp.c: a detached view of `tcp` (the engine's TCP transport). */
void hvdl__detached_init(detached_t *d, transport_t *tcp);
/* tcp.c, on the engine's thread once the helper has stopped: reports the helper's failure
 * as the engine's own (the peer named, or the system error) and returns -1; 0 if none. */
int hvdl__detached_report(detached_t *d);

/* This node's shared-memory segment (shm.c). */
typedef struct hvdl_shm {
    uint8_t *base;
    size_t bytes;
    int nlocal;              /* ranks on this node */
    int me;                  /* this rank's index among them */
    int64_t chunk;           /* bytes per rank per piece that broadcast and allgather copy */
    int64_t rchunk;          /* ... that the reductions use, at most chunk (shm.c) */
    int64_t slot_bytes;
    /* The fields above are set when the segment opens; those below belong to the thread
     * that runs the collective (the one holding the engine's drive lock). */
    uint32_t phase;          /* phases posted; identical on every local rank */
    uint32_t epoch;          /* pieces written; picks the slot of the double buffer */
    /* What the barriers cost this rank, logged when the segment closes (debug level):
     * waits, their time in all, the waits that went to sleep, and for those the time
     * from the last arrival's release to this rank running again (the wake-up). And the
     * two-shot's own work: its calls and their time copying in, reducing and copying
     * out, which tells a slow memory path from slow peers. */
    int64_t waits, slept, two_shots;
    double waited_s, wake_s, wake_max_s, copy_in_s, reduce_s, copy_out_s;
} hvdl_shm_t;

/* shm.c: the slot of local rank `local` in buffer `which` of the segment */
uint8_t *hvdl__shm_slot(hvdl_shm_t *s, int local, int which);

#endif
