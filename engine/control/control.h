/*
 * The control plane, top-down: announce -> coordinator -> fusion -> responses -> cache,
 * and the checks around it (stall, deadlock, shutdown). What a response is, what rank 0
 * knows about a name until every rank has submitted it, and the response cache.
 */
#ifndef HVDL_CONTROL_H
#define HVDL_CONTROL_H
#include "engine.h"

/* A fused response: tensors that are moved by one collective call, in order. Planned by
 * the coordinator (coordinator.c), sent to every member by the loop, executed by exec.c. */
typedef struct response {
    int kind;                /* RESP_* below */
    int alg;                 /* ALG_* (config.h): chosen once, by exec.c, before it runs */
    meta_t meta;             /* shared op/dtype/reduce/root/scales (shape unused) */
    int ntensors;
    char **names; /* NULL for a tensor that arrived as a cache id, until cache.c fills it */
    meta_t *metas; /* per tensor: the agreed request (joined ranks size zeros by it) */
    int32_t *cache_id; /* per tensor: its response-cache id, or -1 (cache.c decides) */
    uint8_t *cached; /* per tensor: 1 = it travels as its cache id alone */
    int64_t *dim0; /* allgather: ntensors x n first dimensions (n = set size) */
    int64_t *matrix; /* alltoall: n x n rows, [i * n + j] = rows i sends to j */
    char *error; /* RESP_ERROR: the message every rank reports */
    double received_at; /* when this rank got the response (trace: end of NEGOTIATE) */
    double *ready_at; /* rank 0 only: ntensors x size, when each rank was ready */
} response_t;
/* RESP_ERROR: the ranks disagree (each op fails with HVDL_ERR_MISMATCH); RESP_SHUTDOWN: a
 * member of the set said goodbye without submitting the op, so it can never run (each op
 * fails with HVDL_ERR_SHUT_DOWN). Both carry the message, and move no data. */
enum { RESP_OK = 0, RESP_ERROR = 1, RESP_SHUTDOWN = 2 };
/* The most tensors one response carries (fusion.c stops there; more ready tensors go in
 * the next response of the same frame). It bounds what a worker allocates for one
 * response, whatever rank 0 sends. */
#define HVDL_MAX_FUSED 512

typedef struct cache_entry {
    char *name;
    meta_t meta; /* the agreed request (allgather: dim0 in dim0s instead) */
    int64_t *dim0s; /* allgather: every rank's first dimension, else NULL */
} cache_entry_t;

/* announce.c: this rank's side of negotiation: tell rank 0 about unsent requests */
int hvdl__announce(engine_t *e);

/* shutdown.c: a rank's shutdown is its own; the job ends when every rank's is done */
int hvdl__say_bye(engine_t *e); /* this rank calls shutdown */
int hvdl__shutdown_due(engine_t *e); /* rank 0's loop: 1 if everyone has finished (stop) */
int hvdl__bye_received(engine_t *e, int from, const uint8_t *p, int64_t n);
void hvdl__goodbye(engine_t *e); /* the loop's last act after a clean stop */

/* coordinator.c: rank 0 matches requests and plans responses. What it knows about one
 * name until every member of its set has submitted it: */
typedef struct pending {
    char *name;
    meta_t *metas; /* per global rank */
    int64_t *splits; /* alltoall: size x size rows, [rank * size + j] */
    uint8_t *have; /* per global rank: has submitted */
    double *have_at; /* per global rank: when rank 0 learned it (for the trace) */
    int count;
    int ref; /* the first rank that submitted: its meta is the reference */
    double first_at, warned_at;
    char *error; /* set when ready and the ranks disagree, or a member has finished */
    int error_gone; /* error: a member finished without submitting it (RESP_SHUTDOWN) */
    int64_t error_oom; /* no memory for error's text (its bytes): planning fails */
    uint8_t *closed_nodes; /* per node: rank 0 took this name's word over (negotiate_nodes.c) */
    struct pending *next; /* link in the ready list, then in a fusion group */
} pending_t;
typedef struct coordinator {
    strmap_t pending; /* name -> pending_t*, until every member is ready */
    pending_t *ready_head, *ready_tail;
    uint8_t *joined; /* per rank: called join() and waits for the others */
    int last_joined;
    uint8_t *finished; /* per rank: said goodbye (shutdown.c); it submits nothing more */
    int nfinished; /* ranks that said goodbye; at size, the job ends */
    int last_finished; /* the goodbye that made nfinished size, or -1 */
    int shutdown_from; /* rank whose goodbye ended the job, or -1 */
    double last_stall_check;
} coordinator_t;
/* Requests as they come off the wire (wire.c): cache ids of unchanged requests, then
 * the full ones. */
typedef struct request {
    char *name;
    meta_t meta;
    int64_t *splits; /* alltoall: one per set member, else NULL */
    uint32_t nsplits;
} request_t;
typedef struct request_list {
    uint32_t *hits; /* cache ids */
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
/* rank r said goodbye (shutdown.c): how many ranks have, or -1 */
int hvdl__coordinator_finish(engine_t *e, int r);

/* fusion.c: which ready tensors travel together */
pending_t *hvdl__fusion_take(engine_t *e, int *count); /* a chain through ->next */
int hvdl__fusable(const meta_t *a, const meta_t *b);
int hvdl__fuses(const engine_t *e, const meta_t *first, const meta_t *next, int64_t *bytes);
int64_t hvdl__meta_bytes(const meta_t *m);

/* stall.c: rank 0 names the ranks that did not submit a name others did */
void hvdl__stall_check(engine_t *e, double now);

/* deadlock.c: ranks blocked on ops that no other rank will submit end the job */
int hvdl__deadlock_tick(engine_t *e, double now); /* every rank, from the loop */
int hvdl__deadlock_ms(engine_t *e); /* the loop's longest sleep, or -1 */
int hvdl__deadlock_take(engine_t *e, int from, const uint8_t *p, int64_t n); /* rank 0: MSG_WAITS */
void hvdl__deadlock_free(engine_t *e);
void hvdl__never_submitted(engine_t *e, int peer, char *out, size_t cap); /* rank 0 */
/* "allreduce 'a' in process set 1": a request as its user named it (deadlock.c) */
void hvdl__describe_request(const char *name, int op, int set, char *out, size_t cap);

/* cache.c: the response cache, updated by negotiation in response order on every rank */
int hvdl__cache_meta_equal(const meta_t *a, const meta_t *b);
int hvdl__cacheable(const meta_t *m);
int hvdl__cache_lookup(engine_t *e, const char *name);
meta_t hvdl__cache_meta_for(engine_t *e, int id, int rank);
int hvdl__cache_assign(engine_t *e, response_t *r); /* rank 0: ids for a planned response */
/* a worker: fill what arrived as ids, store new entries; 0, or -1 with *why (rank 0
 * sent nonsense) or without (this rank failed, recorded) */
int hvdl__cache_apply(engine_t *e, response_t *r, const char **why);
void hvdl__cache_free(engine_t *e);

/* clock.c: rank 0's wall clock minus ours, for the timeline */
int hvdl__clock_sync(engine_t *e);

#endif
