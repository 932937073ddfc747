/*
 * The engine: one struct engine that every part of the engine hangs its state off, the
 * request (op_t) it carries from enqueue to release, and the engine's life (api.c, ops.c,
 * process_sets.c). Public names are hvdl_x, internal ones hvdl__x. Nothing here is
 * global: all state hangs off one struct engine, so the C tests (tests/c) run several
 * engines as threads in one process; api.c holds the one pointer Python uses. The
 * algorithms see a narrow view of it (context.h) and never include this header.
 *
 * Threads and who owns what. Four kinds of thread touch an engine: the callers (the
 * framework's threads: enqueue, wait, release, process sets), the background loop
 * (loop.c), the point-to-point thread (p2p.c), and the thread that starts and shuts it
 * down. Each group of fields below says which lock or thread owns it:
 *   - set up before the loop starts, read-only while it runs: read by any thread;
 *   - mu: the queues and tables callers and the loop share, and the failure record;
 *   - drive: the loop's work (negotiation, planning, execution, control frames). Its
 *     holder is the loop thread, except while that waits (net.c lets go around its
 *     poll), or a caller waiting for its op, which runs the work that needs no waiting
 *     itself (hvdl__drive, loop.c). So the loop's state, and the reduction in a
 *     shared-memory collective, may run on a training thread. The trade: on one node a
 *     small op then needs no thread hand-off at all; a stream of blocking 4 KiB
 *     allreduces took 31-32 us an op against 67-77 us with the loop thread doing the work
 *     (docs/benchmarks.md, "The waiting caller does the engine's work"). The cost is a
 *     caller's core spent on reduction it would otherwise have waited out;
 *   - atomics: flags read across threads without a lock. Plain `e->failed`-style reads
 *     and writes of an atomic are seq_cst; where an access is weaker, it says why.
 * Lock order: drive, then mu (timeline.c orders its own). The tests/c run under TSan checks
 * these rules (tests/test_c_engine.py).
 */
#ifndef HVDL_ENGINE_H
#define HVDL_ENGINE_H
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stddef.h>
#include "horovodlike.h"
#include "util.h"
#include "platform.h"
#include "config.h"
#include "log.h"
#include "timeline.h"
#include "context.h"

/* What every rank must agree on for one named request. Also the unit the response
 * cache compresses: a request equal to its cached meta travels as one bit. */
typedef struct meta {
    int32_t op, dtype, reduce_op, root_rank, process_set, ndim;
    int64_t shape[HVDL_MAX_DIMS];
    double prescale, postscale;
} meta_t;

#define HVDL_MAX_SETS 256

/* One enqueued request, from hvdl_enqueue until hvdl_release. */
typedef struct op {
    int64_t handle;
    char *name;
    meta_t meta;
    int64_t *splits;         /* alltoall: rows to each set member (copied), else NULL */
    const void *input;
    void *output;
    int64_t nbytes;          /* input bytes */
    int cache_id;            /* this rank's cache entry for the name, or -1 */
    double enqueued_at;
    int caller_waits;        /* HVDL_CALLER_WAITS on one node: enqueue did not wake the loop */
    int tunes;               /* HVDL_TUNE: its values become the knobs once it has run */
    atomic_int done;         /* written under engine.mu, read lock-free by spinners */
    int status;
    char *msg;               /* error text, malloc'd, or NULL */
    hvdl_result result;
    struct op *next;         /* link in whichever queue holds it */
} op_t;

typedef struct op_queue { op_t *head, *tail; } op_queue_t;

/* Defined by the parts that own them; the engine holds pointers. */
struct peer;          /* transport/net.h */
struct cache_entry;   /* control/control.h */

typedef struct engine {
    /* Set up by prepare and start before the loop thread starts (the caller's thread that
     * starts it), read-only afterwards: any thread reads them without a lock. What hangs
     * off the pointers has owners of its own: the peers' control buffers, the
     * segment's negotiation state and ctx's scratch buffers are drive's, a peer's
     * p2p_fd the p2p thread's. */
    config_t cfg;            /* but for the knobs a tune op changes (fusion_threshold,
                                cycle_time, algorithm, allgather_algorithm, flat_*):
                                drive's, read and written only under it (config.c) */
    int rank, size;
    char host[128];
    uint64_t nonce;
    unsigned char key[HVDL_KEY_MAX];   /* the job's secret (hvdl_prepare) */
    int key_len;
    char bind_addr[64];      /* listen here; "" = every interface */
    int listen_fd;
    struct peer *peers;       /* per rank (transport/net.h) */
    transport_t *tcp;
    hvdl_shm_t *shm;         /* NULL when this rank is alone on its node */
    const struct negotiation *negotiation;   /* chosen once at start-up (negotiation.h) */
    void *neg;               /* its state, or NULL */
    const sigset_t *poll_mask;   /* the loop's sleep unblocks its doorbell (or NULL) */
    int spin_us;             /* the loop's and a caller's waits look before sleeping (api.c) */
    int shm_spin_us;         /* a shm barrier looks before sleeping (ctx.spin_us) */
    group_t *cross;          /* ranks with my local index on every node (hierarchical) */
    int nnodes;
    int *node;               /* node index of every rank (ctx.node) */
    ctx_t ctx;               /* what the algorithms see of this engine (context.h) */

    /* The thread that starts and shuts the engine down (api.c; Python's under its
     * lifecycle lock). */
    pthread_t thread;
    atomic_int thread_started;   /* read as a flag by callers' enqueues (seq_cst) */
    /* Held by whoever runs the loop's work: the loop thread, except while it waits, or
     * a caller waiting for its op (hvdl__drive). Lock order: drive, then mu. */
    pthread_mutex_t drive;
    atomic_int watchers;     /* callers between hvdl__drive_enter and _leave */
    int wake_fd;             /* eventfd (set at start): an enqueue or shutdown wakes the loop */

    /* Guarded by mu. Lock rule: the loop never holds mu while doing I/O. */
    pthread_mutex_t mu;
    pthread_cond_t done_cv;
    op_queue_t incoming;     /* enqueued, not yet picked up by the loop */
    strmap_t inflight;       /* name -> op_t*, from enqueue until done */
    op_t **slots;            /* handle table: handle = generation << 32 | slot */
    uint32_t *gens;
    int nslots;
    int free_head;
    int *free_next;
    atomic_int failed;       /* sticky: a lost peer or a stall shutdown. Written under mu
                              * with fail_status and fail_msg (read those under mu); read
                              * as a flag anywhere (seq_cst: set once, and a load costs a
                              * plain load on x86-64) */
    int fail_status;
    char fail_msg[HVDL_MSG_BYTES];
    int shutdown_requested;
    uint64_t enqueues;       /* ops enqueued so far, and when the last was (deadlock.c) */
    double last_enqueue_at;
    atomic_int waiters;      /* callers asleep in hvdl_wait (atomic: read without mu) */
    struct callers *callers; /* the threads that use the engine (callers.c) */
    atomic_ullong caller_serial; /* this engine's number among the process's (callers.c) */
    char bye_why[HVDL_MSG_BYTES];   /* who shut down, without submitting what (shutdown.c) */

    /* Owned by whoever holds drive: the loop thread, or a caller running the loop's work
     * (hvdl__drive). Never by two threads at once, never without drive once the loop
     * runs. The parts a caller never runs (waiting for frames, the stall check,
     * heartbeats, deadlock detection) are still under drive, held then by the loop. */
    struct deadlock *dl;     /* deadlock.c */
    op_queue_t unsent;       /* picked up, not yet told to the coordinator */
    double first_unsent_at;
    int bye_sent;
    atomic_int stopped;      /* a shutdown was sent (rank 0) or received (workers); written
                              * under drive (or by shutdown once the loop has ended), read
                              * as a flag by any thread (seq_cst, as failed) */
    strmap_t mine;           /* name -> op_t*, ops this rank has announced */
    struct cache_entry *cache;   /* id -> entry; identical on every rank */
    int ncache;
    strmap_t cache_by_name;  /* name -> id+1 */
    buf_t fusion;            /* persistent fusion buffer */
    struct coordinator *coord;   /* rank 0 only */
    int inject_seen;         /* times this rank reached the injection site (inject.c) */
    int injected;            /* the injected failure has fired: messages say so */
    int awaiting_verdict;    /* fail.c is reading rank 0's verdict (no recursion) */
    int joined;              /* this rank has a join in flight: zeros for others' allreduces */
    double next_tick;        /* when liveness.c next sends heartbeats and checks peers */
    int in_tick;
    double stood_still;      /* the last tick's gap, if this rank did not run (liveness.c) */

    /* Tracing (timeline.c). tl_on is the one branch every event site pays; tl_mu guards
     * the writer (tl), which any thread may append to. */
    atomic_int tl_on;
    atomic_int tl_mark_cycles;   /* HOROVOD_TIMELINE_MARK_CYCLES: CYCLE_START instants */
    pthread_mutex_t tl_mu;
    struct timeline *tl;
    double t0;               /* hvdl_now() at start: trace ts are relative to it */
    double t0_epoch_us;      /* the same moment on the wall clock */
    double clock_offset_us;  /* rank 0's wall clock minus ours, measured at start */
    int64_t step;            /* training steps seen (under drive: announce counts them) */
    char *first_name;        /* the first name submitted twice: marks steps (drive) */
    strmap_t seen_names;     /* names seen before first_name was found (drive) */

    /* Process sets: registered under mu by the API, read by the loop and callers without
     * it. Entries are never freed or moved while the engine lives; each slot is an
     * atomic pointer stored with release once its entry is filled in (process_sets.c),
     * so a reader that sees the pointer sees the entry. */
    group_t *_Atomic sets[HVDL_MAX_SETS];
    atomic_int sets_changed;
    struct p2p *p2p;         /* point-to-point messages: their own thread (p2p.c), set at start */
} engine_t;

/* api.c: one engine's life, and the error funnel of every public call. The public API
 * (horovodlike.h) is these on the one engine Python uses; a C test runs several. */
engine_t *hvdl__engine_new(void);    /* configuration from the environment; NULL: no memory */
int hvdl__engine_prepare(engine_t *e, const char *hostname, const char *advertise_addr,
                         const char *bind_addr, const unsigned char *key, int key_len,
                         char *blob_out);
int hvdl__engine_start(engine_t *e, int rank, int size, const char *all_blobs);
int hvdl__engine_running(engine_t *e);
int hvdl__engine_shutdown(engine_t *e);
void hvdl__engine_free(engine_t *e); /* after shutdown, or instead of start */
int hvdl__engine_timeline_start(engine_t *e, const char *path, int mark_cycles);
/* ops.c */
int hvdl__engine_enqueue(engine_t *e, const hvdl_request *q, int64_t *handle);
int hvdl__engine_poll(engine_t *e, int64_t handle);
int hvdl__engine_wait(engine_t *e, int64_t handle, double timeout_s);
int hvdl__engine_release(engine_t *e, int64_t handle, char *msg, hvdl_result *result);
int hvdl__engine_run(engine_t *e, const hvdl_request *q, const void *input, void *output,
                     double timeout_s, int64_t *handle, char *msg, hvdl_result *result);
/* What hvdl__check_common (ops.c) checks of a request, and how its messages name it. */
typedef struct request_rules {
    const char *what; /* NULL: a collective ("'x': ..."); "send", "recv": "send 'x': ..." */
    int shaped; /* it carries data: its dtype, shape and buffer are checked */
    int64_t max_bytes; /* the most data it may carry */
    const void *buf; /* the buffer that holds the data (or takes it) */
    const char *buf_what; /* that buffer in a message: "input", "output" */
} request_rules_t;
/* The checks every request takes, collective or point-to-point: a name (present, at most
 * HVDL_MAX_NAME bytes, no NUL inside), a process set that exists and has this rank, and,
 * when shaped, a dtype, at most HVDL_MAX_DIMS dimensions, none negative, at most
 * max_bytes in all, and a buffer for them. Sets *nbytes (0 when not shaped). With mu held. */
int hvdl__check_common(engine_t *e, const hvdl_request *q, const request_rules_t *k,
                       int64_t *nbytes);
/* process_sets.c */
int hvdl__engine_set_add(engine_t *e, int id, const int *ranks, int n);
int hvdl__engine_set_remove(engine_t *e, int id);
int hvdl__err(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* names.c: an op's name in the timeline ("ALLREDUCE"), from hvdl_op_name's table */
const char *hvdl__op_trace_name(int op);
void hvdl__wake(engine_t *e);

/* inject.c: failure injection for tests (HOROVODLIKE_TEST_INJECT=site[:rank[:nth]]).
 * A site asks HVDL_INJECT(e, INJ_X) and, when it is true, fails as its real cause would. */
/* The sites (INJ_*) are in context.h: the algorithms have sites too. */
int hvdl__inject_fire(engine_t *e);
const char *hvdl__inject_site_name(int site);
#define HVDL_INJECT(e, site) \
    (__builtin_expect((e)->cfg.inject_site == (site), 0) && hvdl__inject_fire(e))

/* ops.c: a handle for o (mu held): 0, or an error status */
int hvdl__handle_new(engine_t *e, op_t *o);

#endif
