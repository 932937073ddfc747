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
    atomic_int done;         /* written under engine.mu, read lock-free by spinners */
    int status;
    char *msg;               /* error text, malloc'd, or NULL */
    hvdl_result result;
    struct op *next;         /* link in whichever queue holds it */
} op_t;

typedef struct op_queue { op_t *head, *tail; } op_queue_t;
void hvdl__queue_push(op_queue_t *q, op_t *o);
op_t *hvdl__queue_pop(op_queue_t *q);

/* A fused response: tensors that are moved by one collective call, in order. Built by
 * the coordinator (negotiate.c), sent to every rank, executed by exec.c. */
typedef struct response {
    int kind;                /* RESP_* below */
    meta_t meta;             /* shared op/dtype/reduce/root/scales (shape unused) */
    int ntensors;
    char **names;
    meta_t *metas;           /* per tensor: the agreed request (joined ranks size zeros by it) */
    int64_t *dim0;           /* allgather: ntensors x n first dimensions (n = set size) */
    int64_t *matrix;         /* alltoall: n x n rows, [i * n + j] = rows i sends to j */
    char *error;             /* RESP_ERROR: the message every rank reports */
    double received_at;      /* when this rank got the response (trace: end of NEGOTIATE) */
    double *ready_at;        /* rank 0 only: ntensors x size, when each rank was ready */
} response_t;
enum { RESP_OK = 0, RESP_ERROR = 1, RESP_SHUTDOWN = 2 };
void hvdl__response_free(response_t *r);

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
    int spin_us;             /* look before sleeping (0 when ranks outnumber cores) */
    group_t *cross;          /* ranks with my local index on every node (hierarchical) */
    int nnodes;
    int *node;               /* node index of every rank (ctx.node) */
    ctx_t ctx;               /* what the algorithms see of this engine (context.h) */

    pthread_t thread;
    int thread_started;
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
    int joined;              /* this rank has a join in flight: zeros for others' allreduces */
    double next_tick;        /* when liveness.c next sends heartbeats and checks peers */
    int in_tick;

    /* Tracing (timeline.c). tl_on is the one branch every event site pays. */
    atomic_int tl_on;
    atomic_int tl_mark_cycles;
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

/* loop.c */
void *hvdl__loop(void *arg);
void hvdl__fail(engine_t *e, int status, const char *fmt, ...);
void hvdl__complete(engine_t *e, op_t *o, int status, const char *msg);

/* wire.c: the negotiation messages */
int hvdl__announce(engine_t *e);                    /* tell rank 0 about unsent requests */
int hvdl__parse_requests(engine_t *e, int from, reader_t *r);
int hvdl__write_response(engine_t *e, buf_t *b, const response_t *r);
int hvdl__read_responses(engine_t *e, reader_t *r, response_t **out, int *count);
int hvdl__response_alloc(response_t *r, int ntensors, int n, int op);

/* negotiate.c: rank 0's coordinator and the frame dispatcher */
int hvdl__coord_record(engine_t *e, int from, const char *name, const meta_t *m,
                       const int64_t *splits, int nsplits);
int hvdl__coordinator_new(engine_t *e);
void hvdl__coordinator_free(engine_t *e);
void hvdl__coordinator_rescan(engine_t *e);
int hvdl__coordinator_step(engine_t *e);            /* rank 0: match, plan, broadcast */
int hvdl__handle_frame(engine_t *e, int from, int type, const uint8_t *p, int64_t n);
void hvdl__stall_check(engine_t *e, double now);
int hvdl__say_bye(engine_t *e);                     /* this rank calls shutdown */
int hvdl__coordinator_pending(engine_t *e);

/* wire_check.c: what peers send is checked before it is trusted (NULL = fine, else why) */
const char *hvdl__meta_problem(engine_t *e, const meta_t *m);
const char *hvdl__splits_problem(const meta_t *m, const int64_t *splits, uint32_t n, int nmembers);
const char *hvdl__response_problem(engine_t *e, const group_t *g, const response_t *r, op_t *const *ops);

/* cache.c */
int hvdl__cache_meta_equal(const meta_t *a, const meta_t *b);
int hvdl__cacheable(const meta_t *m);
int hvdl__cache_lookup(engine_t *e, const char *name);
meta_t hvdl__cache_meta_for(engine_t *e, int id, int rank);
int hvdl__cache_store(engine_t *e, int id, const char *name, const meta_t *m, const int64_t *dim0);
void hvdl__cache_free(engine_t *e);

/* exec.c */
int hvdl__execute(engine_t *e, response_t *r);

/* The wire's magic number and version: the blob, the hello and every control frame. */
#define WIRE_MAGIC 0x4876444cu   /* "HvDL" */
#define WIRE_VERSION 2u
#define HVDL_MAX_FRAME (256ll << 20)   /* a longer control frame is malformed */

/* handshake.c: connecting every pair, authenticated by the job key */
int hvdl__connect_all(engine_t *e);

/* net.c: sockets, framing, waiting on control traffic */
int hvdl__listen(engine_t *e);
void hvdl__tune_socket(engine_t *e, int fd);
int hvdl__set_nonblocking(int fd);
int hvdl__io_full(int fd, void *p, size_t n, int writing, double deadline);
int hvdl__ctrl_read(conn_t *c);     /* buffer what arrived; -1 once the peer has closed */
void hvdl__close_all(engine_t *e);
int hvdl__send_frame(engine_t *e, int peer, int type, const void *p, int64_t n);
int hvdl__pump_control(engine_t *e, int timeout_ms, int wake_fd);
int hvdl__control_fds(engine_t *e, int *fds, int *ranks, int cap);
int hvdl__control_readable(engine_t *e, int peer);
int hvdl__watch_control(engine_t *e, int timeout_ms);
transport_t *hvdl__tcp_transport(engine_t *e);
void hvdl__peer_lost(engine_t *e, int peer, const char *why);
void hvdl__blob_write(engine_t *e, int port, const char *ip, char *out);
int hvdl__clock_sync(engine_t *e);
int hvdl__blob_read(const char *in, peer_t *p);

/* Frame types on the control plane. */
enum {
    MSG_REQUESTS = 1,        /* worker -> rank 0: bits of cached requests + full ones */
    MSG_RESPONSES = 2,       /* rank 0 -> workers: the ordered list of responses */
    MSG_BYE = 3,             /* worker -> rank 0: this rank called shutdown */
    MSG_ABORT = 4,           /* any -> any: a rank was lost; payload is the message */
    MSG_PING = 5,            /* start-up clock sync: worker -> rank 0 */
    MSG_PONG = 6,            /* rank 0 -> worker: rank 0's wall clock */
    MSG_HEARTBEAT = 7        /* either way, when nothing else was sent for a while */
};

/* liveness.c: heartbeats on the control star; a silent peer is named and the job ends */
void hvdl__liveness_start(engine_t *e);
int hvdl__liveness_tick(engine_t *e);               /* -1 once the engine has failed */
int hvdl__liveness_ms(const engine_t *e);            /* until the next tick is due */
double hvdl__heartbeat_interval(const engine_t *e);
void hvdl__goodbye(engine_t *e);                    /* the loop's last act after a clean stop */
/* Every wait calls this with the time it has at hand: one comparison when nothing is due. */
static inline int hvdl__liveness_check(engine_t *e, double now) {
    return now >= e->next_tick ? hvdl__liveness_tick(e) : 0;
}

/* context.c: the algorithms' view of this engine, once start-up has connected the peers
 * and opened the segment */
void hvdl__ctx_fill(engine_t *e);

/* shm.c: setting up this node's segment (its waits are in context.h) */
int hvdl__shm_open(engine_t *e);
void hvdl__shm_close(engine_t *e);

#endif
