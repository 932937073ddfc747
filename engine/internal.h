/*
 * Internal declarations shared by the engine's files. Public names are hvdl_x, internal
 * ones hvdl__x. Nothing here is global: all state hangs off one struct engine, so the C
 * tests (tests/c) run several engines as threads in one process; api.c holds the one
 * pointer Python uses. The algorithms see a narrow view of it (context.h).
 */
#ifndef HVDL_INTERNAL_H
#define HVDL_INTERNAL_H
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
    double wait_since;       /* under mu: when a caller first slept waiting on it (deadlock.c) */
    atomic_int done;         /* written under engine.mu, read lock-free by spinners */
    int status;
    char *msg;               /* error text, malloc'd, or NULL */
    hvdl_result result;
    struct op *next;         /* link in whichever queue holds it */
} op_t;

typedef struct op_queue { op_t *head, *tail; } op_queue_t;
/* loop.c */
void hvdl__queue_push(op_queue_t *q, op_t *o);
op_t *hvdl__queue_pop(op_queue_t *q);

/* A fused response: tensors that are moved by one collective call, in order. Planned by
 * the coordinator (coordinator.c), sent to every member by the loop, executed by exec.c. */
typedef struct response {
    int kind;                /* RESP_* below */
    int alg;                 /* ALG_* (config.h): chosen once, by exec.c, before it runs */
    meta_t meta;             /* shared op/dtype/reduce/root/scales (shape unused) */
    int ntensors;
    char **names;            /* NULL for a tensor that arrived as a cache id, until cache.c fills it */
    meta_t *metas;           /* per tensor: the agreed request (joined ranks size zeros by it) */
    int32_t *cache_id;       /* per tensor: its response-cache id, or -1 (cache.c decides) */
    uint8_t *cached;         /* per tensor: 1 = it travels as its cache id alone */
    int64_t *dim0;           /* allgather: ntensors x n first dimensions (n = set size) */
    int64_t *matrix;         /* alltoall: n x n rows, [i * n + j] = rows i sends to j */
    char *error;             /* RESP_ERROR: the message every rank reports */
    double received_at;      /* when this rank got the response (trace: end of NEGOTIATE) */
    double *ready_at;        /* rank 0 only: ntensors x size, when each rank was ready */
} response_t;
enum { RESP_OK = 0, RESP_ERROR = 1, RESP_SHUTDOWN = 2 };
/* The most tensors one response carries (fusion.c stops there; more ready tensors go in
 * the next response of the same frame). It bounds what a worker allocates for one
 * response, whatever rank 0 sends. */
#define HVDL_MAX_FUSED 512

/* Per-peer connection state (net.c). Control frames arrive on ctrl; data on data. */
typedef struct conn {
    int fd;
    buf_t rx;                /* bytes read but not yet parsed into frames */
    int eof;                 /* closed after a goodbye: frames in rx still count */
    double last_rx, last_tx; /* when bytes last arrived / a frame was last sent (liveness) */
} conn_t;

typedef struct peer {
    char host[128];
    char ip[64];
    int port;
    uint64_t nonce;          /* proves a connection was meant for this job and rank */
    agreed_t agreed;         /* its settings that must equal everyone's (config.h) */
    int data_fd;             /* full mesh, -1 for self */
    conn_t ctrl;             /* control plane is a star: workers <-> rank 0 */
    int p2p_fd;              /* full mesh for point-to-point messages (p2p.c owns it) */
} peer_t;

typedef struct cache_entry {
    char *name;
    meta_t meta;             /* the agreed request (allgather: dim0 in dim0s instead) */
    int64_t *dim0s;          /* allgather: every rank's first dimension, else NULL */
} cache_entry_t;

typedef struct engine {
    config_t cfg;
    int rank, size;
    char host[128];
    uint64_t nonce;
    unsigned char key[HVDL_KEY_MAX];   /* the job's secret (hvdl_prepare) */
    int key_len;
    char bind_addr[64];      /* listen here; "" = every interface */
    int listen_fd;
    peer_t *peers;
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

    pthread_t thread;
    int thread_started;
    /* Held by whoever runs the loop's work: the loop thread, except while it waits, or
     * a caller waiting for its op (hvdl__drive). Lock order: drive, then mu. */
    pthread_mutex_t drive;
    atomic_int watchers;     /* callers between hvdl__drive_enter and _leave */
    int wake_fd;             /* eventfd: an enqueue or shutdown wakes the loop */

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
    int failed;              /* sticky: a lost peer or a stall shutdown */
    int fail_status;
    char fail_msg[HVDL_MSG_BYTES];
    int shutdown_requested;
    uint64_t enqueues;       /* ops enqueued so far, and when the last was (deadlock.c) */
    double last_enqueue_at;
    atomic_int waiters;      /* callers asleep in hvdl_wait */
    struct deadlock *dl;     /* loop-owned (deadlock.c) */
    char bye_why[HVDL_MSG_BYTES];   /* who shut down, without submitting what (shutdown.c) */

    /* Owned by the background thread alone. */
    op_queue_t unsent;       /* picked up, not yet told to the coordinator */
    double first_unsent_at;
    int bye_sent;
    int stopped;             /* a shutdown was sent (rank 0) or received (workers) */
    strmap_t mine;           /* name -> op_t*, ops this rank has announced */
    cache_entry_t *cache;    /* id -> entry; identical on every rank */
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

    /* Tracing (timeline.c). tl_on is the one branch every event site pays. */
    atomic_int tl_on;
    atomic_int tl_mark_cycles;   /* HOROVOD_TIMELINE_MARK_CYCLES: CYCLE_START instants */
    pthread_mutex_t tl_mu;
    struct timeline *tl;
    double t0;               /* hvdl_now() at start: trace ts are relative to it */
    double t0_epoch_us;      /* the same moment on the wall clock */
    double clock_offset_us;  /* rank 0's wall clock minus ours, measured at start */
    int64_t step;            /* training steps seen (loop-owned) */
    char *first_name;        /* the first name submitted twice: marks steps */
    strmap_t seen_names;     /* names seen before first_name was found */

    /* Process sets: registered under mu by the API, read by the loop. Entries are never
     * freed or moved while the engine lives, so the loop may read them without mu. */
    group_t *sets[HVDL_MAX_SETS];
    atomic_int sets_changed;
    struct p2p *p2p;         /* point-to-point messages: their own thread (p2p.c) */
} engine_t;

/* api.c: one engine's life, and the error funnel of every public call. The public API
 * (horovodlike.h) is these on the one engine Python uses; a C test runs several. */
engine_t *hvdl__engine_new(void);    /* configuration from the environment; NULL: no memory */
int hvdl__engine_prepare(engine_t *e, const char *hostname, const char *advertise_addr,
                         const char *bind_addr, const unsigned char *key, int key_len, char *blob_out);
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
/* process_sets.c */
int hvdl__engine_set_add(engine_t *e, int id, const int *ranks, int n);
int hvdl__engine_set_remove(engine_t *e, int id);
int hvdl__err(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void hvdl__wake(engine_t *e);

/* ==== The control plane, top-down: loop -> negotiation -> wire -> frames -> sockets ==== */

/* loop.c: the background thread; owns what is done with each frame */
void *hvdl__loop(void *arg);
/* a waiting caller does the loop's work that needs no waiting, if the loop is not:
 * enter, drive as often as it looks, leave */
void hvdl__drive_enter(engine_t *e);
int hvdl__drive(engine_t *e);                 /* 1: it ran (took the new ops) */
void hvdl__drive_leave(engine_t *e);

/* fail.c: failure is sticky and names its cause. hvdl__fail records a cause on this
 * rank; hvdl__fail_job also tells every other rank (through rank 0), so that the whole
 * job reports the one true cause. Both return -1, so a failing site can return them. */
int hvdl__fail(engine_t *e, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int hvdl__fail_job(engine_t *e, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int hvdl__oom(engine_t *e, const char *what, int64_t bytes);   /* fail_job: out of memory for what */
void hvdl__peer_lost(engine_t *e, int peer, const char *why);
int hvdl__abort_received(engine_t *e, int from, const void *msg, int64_t n);   /* -1 */
/* Only records the cause (1 if it is the first): for a loss found once nothing is left
 * to complete or tell, as when a worker never finishes shutting down. */
int hvdl__record_failure(engine_t *e, int status, const char *msg);
int hvdl__malformed(engine_t *e, int from, const char *what, const char *why); /* -1 */
void hvdl__complete(engine_t *e, op_t *o, int status, const char *msg);
void hvdl__complete_all_locked(engine_t *e, int status, const char *msg);

/* inject.c: failure injection for tests (HOROVODLIKE_TEST_INJECT=site[:rank[:nth]]).
 * A site asks HVDL_INJECT(e, INJ_X) and, when it is true, fails as its real cause would. */
/* The sites (INJ_*) are in context.h: the algorithms have sites too. */
int hvdl__inject_fire(engine_t *e);
const char *hvdl__inject_site_name(int site);
#define HVDL_INJECT(e, site) \
    (__builtin_expect((e)->cfg.inject_site == (site), 0) && hvdl__inject_fire(e))

/* announce.c: this rank's side of negotiation: tell rank 0 about unsent requests */
int hvdl__announce(engine_t *e);

/* shutdown.c: any rank's shutdown is every rank's */
int hvdl__say_bye(engine_t *e);                     /* this rank calls shutdown */
int hvdl__bye_received(engine_t *e, int from, const uint8_t *p, int64_t n);
void hvdl__goodbye(engine_t *e);                    /* the loop's last act after a clean stop */

/* coordinator.c: rank 0 matches requests and plans responses. What it knows about one
 * name until every member of its set has submitted it: */
typedef struct pending {
    char *name;
    meta_t *metas;           /* per global rank */
    int64_t *splits;         /* alltoall: size x size rows, [rank * size + j] */
    uint8_t *have;           /* per global rank: has submitted */
    double *have_at;         /* per global rank: when rank 0 learned it (for the trace) */
    int count;
    int ref;                 /* the first rank that submitted: its meta is the reference */
    double first_at, warned_at;
    char *error;             /* set when ready and the ranks disagree */
    uint8_t *closed_nodes;   /* per node: rank 0 took this name's word over (negotiate_nodes.c) */
    struct pending *next;    /* link in the ready list, then in a fusion group */
} pending_t;
typedef struct coordinator {
    strmap_t pending;        /* name -> pending_t*, until every member is ready */
    pending_t *ready_head, *ready_tail;
    uint8_t *joined;         /* per rank: called join() and waits for the others */
    int last_joined;
    int shutdown_from;       /* rank that asked to shut down, or -1 */
    double last_stall_check;
} coordinator_t;
/* Requests as they come off the wire (wire.c): cache ids of unchanged requests, then
 * the full ones. */
typedef struct request {
    char *name;
    meta_t meta;
    int64_t *splits;         /* alltoall: one per set member, else NULL */
    uint32_t nsplits;
} request_t;
typedef struct request_list {
    uint32_t *hits;          /* cache ids */
    int nhits;
    request_t *full;
    int nfull;
} request_list_t;
int hvdl__coordinator_new(engine_t *e);
void hvdl__coordinator_free(engine_t *e);
int hvdl__coord_record(engine_t *e, int from, const char *name, const meta_t *m,
                       const int64_t *splits, int nsplits);
/* A worker's request list: 0; -1 with *why = the worker sent nonsense; -1 without = failed */
int hvdl__coordinator_take(engine_t *e, int from, const request_list_t *l, const char **why);
/* Everything ready, as responses in execution order (rank 0's cache updated): 0 or -1 */
int hvdl__coordinator_plan(engine_t *e, response_t **out, int *count);
int hvdl__coordinator_pending(engine_t *e);

/* fusion.c: which ready tensors travel together */
pending_t *hvdl__fusion_take(engine_t *e, int *count);   /* a chain through ->next */
int hvdl__fusable(const meta_t *a, const meta_t *b);
int hvdl__fuses(const engine_t *e, const meta_t *first, const meta_t *next, int64_t *bytes);
int64_t hvdl__meta_bytes(const meta_t *m);

/* stall.c: rank 0 names the ranks that did not submit a name others did */
void hvdl__stall_check(engine_t *e, double now);

/* deadlock.c: ranks blocked on ops that no other rank will submit end the job */
int hvdl__deadlock_tick(engine_t *e, double now);     /* every rank, from the loop */
int hvdl__deadlock_ms(engine_t *e);                   /* the loop's longest sleep, or -1 */
int hvdl__deadlock_take(engine_t *e, int from, const uint8_t *p, int64_t n);   /* rank 0: MSG_WAITS */
void hvdl__deadlock_free(engine_t *e);
void hvdl__never_submitted(engine_t *e, int peer, char *out, size_t cap);   /* rank 0 */

/* negotiation: rank 0's frames, one node's segment or the nodes' hierarchy, behind one
 * table chosen at start-up */
#include "negotiation.h"

/* wire.c: pure encode/decode of the negotiation messages (no engine state is changed) */
int hvdl__put_request(buf_t *full, const char *name, const meta_t *m, const int64_t *splits, int n);
int hvdl__write_requests(buf_t *msg, const uint64_t *bits, int nwords, int nfull, const buf_t *full);
int hvdl__read_requests(engine_t *e, reader_t *r, request_list_t *out);
void hvdl__request_list_free(request_list_t *l);
int hvdl__write_response(engine_t *e, buf_t *b, const response_t *r);
int hvdl__read_responses(engine_t *e, reader_t *r, response_t **out, int *count);
int hvdl__response_alloc(response_t *r, int ntensors, int n, int op);
void hvdl__response_free(response_t *r);
#include "frames.h"          /* and the small frames: goodbye, clock sync, the nodes' */

/* wire_check.c: what peers send is checked before it is trusted (NULL = fine, else why) */
const char *hvdl__meta_problem(engine_t *e, const meta_t *m);
const char *hvdl__splits_problem(const meta_t *m, const int64_t *splits, uint32_t n, int nmembers);
const char *hvdl__response_problem(engine_t *e, const group_t *g, const response_t *r, op_t *const *ops);

/* cache.c: the response cache, updated by negotiation in response order on every rank */
int hvdl__cache_meta_equal(const meta_t *a, const meta_t *b);
int hvdl__cacheable(const meta_t *m);
int hvdl__cache_lookup(engine_t *e, const char *name);
meta_t hvdl__cache_meta_for(engine_t *e, int id, int rank);
int hvdl__cache_assign(engine_t *e, response_t *r);  /* rank 0: ids for a planned response */
/* a worker: fill what arrived as ids, store new entries; 0, or -1 with *why (rank 0
 * sent nonsense) or without (this rank failed, recorded) */
int hvdl__cache_apply(engine_t *e, response_t *r, const char **why);
void hvdl__cache_free(engine_t *e);

/* p2p.c: point-to-point messages on their own connections and thread */
int hvdl__p2p_start(engine_t *e);                   /* after the connections, before the loop */
void hvdl__p2p_stop(engine_t *e);                   /* after the loop thread has ended */
void hvdl__p2p_free(engine_t *e);
int hvdl__p2p_enqueue(engine_t *e, const hvdl_request *q, int64_t *handle);
int hvdl__p2p_tend(engine_t *e);                    /* the loop: a peer p2p found broken; -1 failed */
void hvdl__p2p_close_in_child(engine_t *e);        /* a forked child's copies of the fds */
/* ops.c: a handle for o (mu held): 0, or an error status */
int hvdl__handle_new(engine_t *e, op_t *o);

/* exec.c: choose the algorithm, move the data, complete the handles */
int hvdl__execute(engine_t *e, response_t *r);
int hvdl__execute_cached(engine_t *e, const int32_t *ids, int n, const double *posted_at);

/* The wire's magic number and version: the blob, the hello and every control frame. */
#define WIRE_MAGIC 0x4876444cu   /* "HvDL" */
#define WIRE_VERSION 3u
#define HVDL_MAX_FRAME (256ll << 20)   /* a longer control frame is malformed */
typedef struct frame_hdr {
    uint32_t magic, type;
    int64_t len;
} frame_hdr_t;

/* Frame types on the control plane. */
enum {
    MSG_REQUESTS = 1,        /* worker -> rank 0: bits of cached requests + full ones */
    MSG_RESPONSES = 2,       /* rank 0 -> workers: the ordered list of responses */
    MSG_BYE = 3,             /* worker -> rank 0: this rank called shutdown */
    MSG_ABORT = 4,           /* any -> any: the job failed; payload is the message */
    MSG_PING = 5,            /* start-up clock sync: worker -> rank 0 */
    MSG_PONG = 6,            /* rank 0 -> worker: rank 0's wall clock */
    MSG_HEARTBEAT = 7,       /* either way, when nothing else was sent for a while */
    MSG_NODE_DONE = 8,       /* worker -> rank 0: its node's ranks all posted these cache ids */
    MSG_NODE_POSTED = 9,     /* node leader -> rank 0: the bits it took out of a word */
    MSG_NODE_CLOSE = 10,     /* rank 0 -> node leader: take a word over for a round */
    MSG_NODE_REOPEN = 11,    /* rank 0 -> node leader: a join ended; each word's round */
    MSG_WAITS = 12           /* worker -> rank 0: it is blocked, on these ops (deadlock.c) */
};

/* net.c: control frames over the control star, and waiting on control traffic */
int hvdl__ctrl_read(engine_t *e, int peer);   /* buffer what arrived; -1 once the peer has closed */
int hvdl__send_frame(engine_t *e, int peer, int type, const void *p, int64_t n);
/* The next complete frame buffered from peer: 1 (payload malloc'd), 0 (none), -1 (failed) */
int hvdl__frame_take(engine_t *e, int peer, int *type, uint8_t **payload, int64_t *len);
/* The loop's one blocking point; returns a peer whose connection closed, or -1 */
int hvdl__wait_control(engine_t *e, int timeout_ms, int wake_fd);
int hvdl__control_fds(engine_t *e, int *fds, int *ranks, int cap);
int hvdl__control_readable(engine_t *e, int peer);
int hvdl__watch_control(engine_t *e, int timeout_ms);
int hvdl__startup_abort(engine_t *e, int timeout_ms);   /* -1: an ABORT arrived, now failed */

/* sockets.c: listening, socket options, blocking I/O with a deadline, closing */
int hvdl__listen(engine_t *e);
void hvdl__tune_socket(engine_t *e, int fd);
int hvdl__set_nonblocking(int fd);
int hvdl__io_full(int fd, void *p, size_t n, int writing, double deadline);
void hvdl__close_all(engine_t *e);

/* handshake.c: connecting every pair, authenticated by the job key */
int hvdl__connect_all(engine_t *e);

/* blob.c: the address blob every rank publishes */
void hvdl__blob_write(engine_t *e, int port, const char *ip, char *out);
int hvdl__blob_read(const char *in, peer_t *p);

/* clock.c: rank 0's wall clock minus ours, for the timeline */
int hvdl__clock_sync(engine_t *e);

transport_t *hvdl__tcp_transport(engine_t *e);

/* liveness.c: heartbeats on the control star; a silent peer is named and the job ends */
void hvdl__liveness_start(engine_t *e);
int hvdl__liveness_tick(engine_t *e);               /* -1 once the engine has failed */
int hvdl__liveness_ms(const engine_t *e);            /* until the next tick is due */
double hvdl__heartbeat_interval(const engine_t *e);
/* Every wait calls this with the time it has at hand: one comparison when nothing is due. */
static inline int hvdl__liveness_check(engine_t *e, double now) {
    return now >= e->next_tick ? hvdl__liveness_tick(e) : 0;
}

/* context.c: the algorithms' view of this engine, once start-up has connected the peers
 * and opened the segment */
void hvdl__ctx_fill(engine_t *e);

/* shm.c: setting up this node's segment (its waits are in context.h) */
int hvdl__shm_open(engine_t *e);
uint8_t *hvdl__shm_neg_area(hvdl_shm_t *s);         /* negotiate_shm.c's part */
void hvdl__shm_report(engine_t *e);                 /* the barriers' counters, at debug level */
void hvdl__shm_close(engine_t *e);

#endif
