/*
 * Negotiation behind one interface: how this job's ranks agree on what runs next.
 *
 * Three implementations, chosen once at start-up (hvdl__negotiation_open) by the job's
 * shape and HOROVODLIKE_SHM_NEGOTIATE:
 *
 *   rank-0 frames    every request reaches rank 0 as a frame (or, rank 0's, in memory);
 *                    the coordinator decides alone (negotiate.c: nothing to add)
 *   one node         a job on one node agrees on its cached requests in the segment, and
 *                    every rank executes the segment's log in order (negotiate_shm.c)
 *   several nodes    each node agrees in its segment first, and one frame per node tells
 *                    rank 0 (negotiate_nodes.c)
 *
 * Nobody tests which one runs: the loop, announce, the coordinator and the stall check
 * call the table, and an implementation with nothing to do for an operation says so in
 * its own entry. The segment implementations decide, they never execute nor record:
 *   - a round that rank 0 closes (a request reached it otherwise, a join, a stall)
 *     returns the bits it took out of the words as a took_t; the caller hands them to
 *     the coordinator (hvdl__coordinator_take_bits), which records them as the requests
 *     of their ranks. Nothing here calls into the coordinator.
 *   - the one-node log is executed by exec.c (hvdl__execute, hvdl__execute_cached) as
 *     the log reaches each entry.
 */
#ifndef HVDL_NEGOTIATION_H
#define HVDL_NEGOTIATION_H
#include <stdint.h>
#include "control.h"

/* The arrival words both segment implementations keep, one per cache id below
 * HVDL_NEG_IDS (frames.h): a bit per local rank, the round, and CLOSED. */
#define HVDL_NEG_MAX_RANKS 40                          /* ranks of a node a word holds */
#define HVDL_NEG_MASK ((1ull << HVDL_NEG_MAX_RANKS) - 1)
#define HVDL_NEG_CLOSED (1ull << 63) /* rank 0 has the round: posts go through it */
/* The words' part of a node's segment, and where it is (shm.c lays the segment out). */
size_t hvdl__neg_bytes(int nlocal);

/* Requests that were posted in a segment and that rank 0 took over: it records each as
 * the request of its rank (its cached request), and dates the name's record back to
 * `since` (a stall: when the word was first seen stuck), if earlier. */
typedef struct took_bit {
    int32_t rank; /* -1: no request, only the date */
    int32_t id; /* cache id */
    double since; /* 0: no date */
} took_bit_t;
typedef struct took {
    took_bit_t *v, inline_v[16]; /* a few ranks' bits need no allocation */
    int n, cap;
    int skip_joined; /* a rank that has joined since took its bits back (nodes) */
} took_t;
void hvdl__took_init(took_t *t);
int hvdl__took_add(engine_t *e, took_t *t, int rank, int id,
                   double since); /* 0, or -1 (out of memory) */
void hvdl__took_free(took_t *t);
/* coordinator.c: record what was taken; empties t. 0 or -1 */
int hvdl__coordinator_take_bits(engine_t *e, took_t *t);

typedef struct negotiation {
    const char *name;
    void (*free)(engine_t *e);
    /* the loop thread, as it starts and as it ends (statistics at debug level) */
    void (*thread_start)(engine_t *e);
    void (*thread_end)(engine_t *e);

    /* announce.c: a request equal to cache entry id. post: 0 = it goes through rank 0,
     * 1 = posted, 2 = this rank completed it; the completed ones of one announcement
     * then go to complete (on rank 0, the bits it takes). withdraw: before this rank's
     * join, its posted bits come back as ids in `bits`; returns how many. */
    int (*post)(engine_t *e, int id);
    int (*complete)(engine_t *e, const int *ids, int n, took_t *t);
    int (*withdraw)(engine_t *e, uint64_t *bits);

    /* rank 0, coordinator.c: from's request for p (metadata m) reached rank 0 as a frame
     * or in memory: the round of p's word closes where others may have posted. */
    int (*close)(engine_t *e, int from, pending_t *p, const meta_t *m, took_t *t);
    int (*join)(engine_t *e, took_t *t); /* a join: every word closes */
    /* r was planned (its cache ids assigned); anyone_joined: a join is still under way */
    int (*settle)(engine_t *e, const response_t *r, int anyone_joined, took_t *t);
    /* stall.c, once a check: words stuck partly set; and before naming the ranks
     * missing from p: 1 if their bits are on their way (ask again at the next check) */
    int (*stall_scan)(engine_t *e, double now, took_t *t);
    int (*before_stall)(engine_t *e, pending_t *p, took_t *t);
    /* every leader of a node's words, each loop turn: words stuck partly set */
    int (*scan)(engine_t *e, double now, took_t *t);
    int (*watches)(engine_t *e); /* the loop wakes once a second to scan */

    /* responses: a worker applied r to its cache; then every rank places each response
     * it takes part in (rank 0: every response it planned, mine = it is a member).
     * place: 0 = execute it now, 1 = taken (it runs when the log reaches it), -1 */
    void (*applied)(engine_t *e, const response_t *r);
    int (*place)(engine_t *e, response_t *r, int mine);
    int (*run)(engine_t *e); /* execute the log in order */
    int (*deferred)(engine_t *e); /* a log entry waits for room */
    uint64_t (*position)(engine_t *e); /* log entries this rank executed */
    int (*finish_to)(engine_t *e, uint64_t pos); /* a worker, told to stop at pos */

    /* the nodes' frames (frames.h): to rank 0, bits it records; to a leader, orders */
    int (*frame)(engine_t *e, int from, int type, const uint8_t *p, int64_t n, took_t *t);

    /* sleeping (net.c) and a caller driving the loop's work (loop.c, ops.c) */
    int callers_drive; /* a waiting caller runs the loop's work */
    int (*sleep_begin)(engine_t *e); /* 1: there is work, do not sleep */
    void (*sleep_end)(engine_t *e);
    int (*has_work)(engine_t *e); /* without e->drive */
    void (*watch_begin)(engine_t *e);
    int (*watch_end)(engine_t *e); /* 1: wake the sleeping loop */
} negotiation_t;

/* After hvdl__shm_open: the implementation this job uses, and its state. 0 or -1. */
int hvdl__negotiation_open(engine_t *e);
/* Each implementation's table, and its start-up: NULL-free tables. */
extern const negotiation_t hvdl__negotiate_frames, hvdl__negotiate_shm, hvdl__negotiate_nodes;
int hvdl__negotiate_shm_open(engine_t *e); /* 1: this job negotiates on one node */
int hvdl__negotiate_nodes_open(engine_t *e); /* 1: on several nodes */

/* The entries of an implementation without a log (rank 0's frames, the nodes'): a
 * response runs as it arrives, and no sleeping loop needs ringing. */
#define HVDL_NEG_NO_LOG                                                                           \
    .place = hvdl__neg_place_now, .run = hvdl__neg_nothing, .deferred = hvdl__neg_nothing,        \
    .position = hvdl__neg_position_none, .finish_to = hvdl__neg_finish_none, .callers_drive = 0,  \
    .sleep_begin = hvdl__neg_nothing, .sleep_end = hvdl__neg_none, .has_work = hvdl__neg_nothing, \
    .watch_begin = hvdl__neg_none, .watch_end = hvdl__neg_nothing

/* What the implementations share (negotiate.c). */
int hvdl__neg_nothing(engine_t *e); /* 0 */
void hvdl__neg_none(engine_t *e);
int hvdl__neg_post_none(engine_t *e, int id);
int hvdl__neg_complete_none(engine_t *e, const int *ids, int n, took_t *t);
int hvdl__neg_withdraw_none(engine_t *e, uint64_t *bits);
int hvdl__neg_close_none(engine_t *e, int from, pending_t *p, const meta_t *m, took_t *t);
int hvdl__neg_took_none(engine_t *e, took_t *t);
int hvdl__neg_settle_none(engine_t *e, const response_t *r, int anyone_joined, took_t *t);
int hvdl__neg_scan_none(engine_t *e, double now, took_t *t);
int hvdl__neg_before_stall_none(engine_t *e, pending_t *p, took_t *t);
void hvdl__neg_applied_none(engine_t *e, const response_t *r);
int hvdl__neg_place_now(engine_t *e, response_t *r, int mine); /* 0: execute it now */
uint64_t hvdl__neg_position_none(engine_t *e);
int hvdl__neg_finish_none(engine_t *e, uint64_t pos);
int hvdl__neg_refuse_frame(engine_t *e, int from, int type, const uint8_t *p, int64_t n, took_t *t);
/* The stall scan of a node's words: a word partly set in one round for `after`
 * seconds is handed to stuck(id, word, first seen). seen and seen_at hold each word as
 * first seen, per id. */
typedef struct words_scan {
    uint64_t *seen;
    double *seen_at;
} words_scan_t;
int hvdl__words_scan(
    engine_t *e, words_scan_t *s, _Atomic uint64_t *arrive, double now, double after,
    int (*stuck)(engine_t *e, int id, uint64_t w, double since, double now, took_t *t), took_t *t);
double hvdl__stall_after(const engine_t *e); /* the earlier of the stall warning and shutdown */
#endif
