/*
 * The layout of one node's negotiation in its segment (negotiate_shm.c), shared by that
 * file and the log's (negotiate_shm_log.c): the rank lines, the arrival words, the
 * response log's entries, and each rank's private state.
 */
#ifndef HVDL_NEGOTIATE_SHM_H
#define HVDL_NEGOTIATE_SHM_H
#include "engine.h"
#include "negotiation.h"
#include <signal.h>

#define LINE 64
#define NEG_IDS HVDL_NEG_IDS   /* cache ids negotiated here; higher ones go through rank 0 */
#define NEG_LOG 4096           /* entries in the response log */
#define NEG_MAX_IDS 28         /* tensors one entry fuses (an entry is two cache lines) */
/* An arrival word (negotiation.h): the posted ranks' bits, the round (how many times the
 * id completed here, so that a stall scan can tell a stuck round from a new one) and
 * CLOSED (rank 0 has the id: posts go through it). */
#define MASK HVDL_NEG_MASK
#define ROUND_ONE (1ull << HVDL_NEG_MAX_RANKS)
#define ROUND (((1ull << 63) - 1) & ~MASK)
#define CLOSED HVDL_NEG_CLOSED
enum { NEG_CACHED = 1, NEG_COORD = 2 };

typedef struct neg_rank {      /* one cache line per local rank */
    _Atomic uint64_t consumed; /* log entries this rank has executed */
    _Atomic int32_t sleeping;  /* its loop sleeps: ring its doorbell */
    _Atomic int32_t pid, tid;  /* where the doorbell rings (0: no loop running) */
    char pad[LINE - 20];
} neg_rank_t;

typedef struct neg_entry {
    _Atomic uint64_t stamp;    /* sequence number + 1, once published */
    int32_t kind;              /* NEG_CACHED: n cache ids; NEG_COORD: a planned response */
    int32_t n;                 /* NEG_CACHED: how many ids; NEG_COORD: its process set */
    union {
        int32_t ids[NEG_MAX_IDS];
        uint64_t members;      /* NEG_COORD: the ranks rank 0 sent the response to */
    } u;
} neg_entry_t;

typedef struct deferred {
    uint64_t seq;
    neg_entry_t ent;
} deferred_t;

struct neg {
    neg_rank_t *ranks;
    _Atomic uint64_t *tail;    /* entries claimed */
    _Atomic uint64_t *arrive;  /* per cache id: posted ranks' bits | CLOSED */
    neg_entry_t *log;
    double *posted_at;         /* per cache id and rank: when it last posted (the trace) */
    int nlocal, me;
    uint64_t next;             /* the next entry this rank executes */
    response_t *q;             /* responses from rank 0 awaiting their place in the log */
    int qhead, qlen, qcap;
    deferred_t *defer;         /* claimed entries waiting for room */
    int ndefer, capdefer;
    words_scan_t scan;         /* rank 0: each word as the stall scan first saw it, and when */
    int join_closed;           /* rank 0: a join closed every word */
    sigset_t sleep_mask;
    int loop_asleep;           /* the loop thread waits (and has let go of e->drive) */
    int64_t fast, planned;     /* tensors agreed here; responses planned by rank 0 */
    int64_t by_callers;        /* entries executed by a waiting caller (loop.c, hvdl__drive) */
};

/* negotiate_shm_log.c */
/* Claim the log's next entry and write ent there, or keep it (deferred) until there is
 * room; 0, or -1 once memory ran out (the engine has failed). */
int hvdl__neg_shm_append(engine_t *e, const neg_entry_t *ent);
/* Write the deferred entries that have room now, in order. */
void hvdl__neg_shm_publish(struct neg *n);
/* Room for one more element in a doubling array *p of *cap elements holding n. */
int hvdl__neg_shm_grow(engine_t *e, void **p, int *cap, int n, size_t elem, const char *what);
#endif
