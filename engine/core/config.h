/* The engine's knobs. Each environment variable is read in exactly one place
 * (config.c), with Horovod's names and defaults; new knobs use HOROVODLIKE_. */
#ifndef HVDL_CONFIG_H
#define HVDL_CONFIG_H
#include <stddef.h>
#include <stdint.h>

typedef struct config {
    int64_t fusion_threshold;    /* HOROVOD_FUSION_THRESHOLD, bytes; 0 disables fusion */
    double cycle_time;           /* HOROVOD_CYCLE_TIME, ms in the variable, s here */
    int cache_capacity;          /* HOROVOD_CACHE_CAPACITY; 0 disables the cache */
    int stall_check;             /* !HOROVOD_STALL_CHECK_DISABLE */
    double stall_warning;        /* HOROVOD_STALL_CHECK_TIME_SECONDS */
    double stall_shutdown;       /* HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, 0 = never */
    int log_level;               /* HOROVOD_LOG_LEVEL */
    double peer_timeout;         /* HOROVODLIKE_PEER_TIMEOUT_SECONDS: no progress on a
                                    transfer this long means the peer is lost */
    int64_t chunk_bytes;         /* HOROVODLIKE_CHUNK_BYTES: pipelining granularity */
    int64_t socket_buffer;       /* HOROVODLIKE_SOCKET_BUFFER_BYTES */
    int shm;                     /* HOROVODLIKE_SHM: shared memory between local ranks */
    int shm_negotiate;           /* HOROVODLIKE_SHM_NEGOTIATE: a one-node job negotiates
                                    cached requests in the segment (negotiate_shm.c); on
                                    several nodes, each node first (negotiate_nodes.c) */
    int spin_us;                 /* HOROVODLIKE_SPIN_US: poll before sleeping, per wait */
    int algorithm; /* HOROVODLIKE_ALLREDUCE_ALGORITHM (ALG_*); HOROVOD_HIERARCHICAL_ALLREDUCE=1 means hier */
    int flat_allreduce; /* HOROVOD_HIERARCHICAL_ALLREDUCE=0 (said, not left unset) and no
                            HOROVODLIKE_ALLREDUCE_ALGORITHM: never the hierarchical path */
    int flat_allgather; /* the same for HOROVOD_HIERARCHICAL_ALLGATHER */
    int64_t small_bytes; /* HOROVODLIKE_SMALL_BYTES: recursive doubling up to here */
    int allgather_algorithm; /* HOROVODLIKE_ALLGATHER_ALGORITHM: auto, ring or hier;
                                    HOROVOD_HIERARCHICAL_ALLGATHER=1 means hier */
    int64_t shm_chunk_bytes; /* HOROVODLIKE_SHM_CHUNK_BYTES: per-rank piece size */
    int64_t p2p_eager_bytes; /* HOROVODLIKE_P2P_EAGER_BYTES: larger sends wait for the
                                recv (rendezvous, p2p.c) */
    int p2p_mailbox; /* HOROVODLIKE_P2P_MAILBOX: small messages between ranks of
                               one node through a shared-memory mailbox (p2p.c); by
                               default as HOROVODLIKE_SHM */
    int p2p_cma; /* HOROVODLIKE_P2P_CMA: a large message between ranks of one node is
                    read by the receiver straight from the sender's memory
                    (process_vm_readv, p2p.c) when the mailbox is live; 0: the ring */
    int64_t p2p_ring_bytes; /* HOROVODLIKE_P2P_SHM_RING_BYTES: one node's mailbox per pair
                                (p2p_ring.c); 0: loopback TCP */
    int64_t p2p_unexpected_bytes; /* HOROVODLIKE_P2P_UNEXPECTED_BYTES: eager messages a
                                     receiver holds unmatched per sending peer; past it a
                                     send goes rendezvous (p2p_credit.c) */
    int64_t p2p_announced_bytes; /* HOROVODLIKE_P2P_ANNOUNCED_BYTES: announcements a
                                     receiver holds unmatched per sending peer; past it a
                                     send fails (p2p_credit.c) */
    char timeline[4096]; /* HOROVOD_TIMELINE ("" or DYNAMIC: none at start) */
    int timeline_mark_cycles; /* HOROVOD_TIMELINE_MARK_CYCLES */
    int64_t timeline_max_bytes; /* HOROVOD_TIMELINE_MAX_MB, 0 = no cap */
    int64_t timeline_start_step; /* HOROVOD_TIMELINE_START_STEP */
    int64_t timeline_stop_step; /* HOROVOD_TIMELINE_STOP_STEP, -1 = never */
    int elastic; /* HOROVODLIKE_ELASTIC_WORKER is set: a member of an elastic
                                    job, which recovers from a lost rank (fail.c) */
    double start_timeout; /* HOROVODLIKE_START_TIMEOUT: every wait of start-up
                                    (connecting, shared-memory attach, clock sync) */
    int inject_site; /* HOROVODLIKE_TEST_INJECT, for tests only (inject.c): */
    int inject_rank; /*   the site (INJ_*, 0 = none), the rank (-1 = every */
    int inject_nth; /*   rank) and which visit to the site fails (1 = first) */
} config_t;

/* The settings every rank must share (they pick algorithms and memory layouts). They
 * travel in each rank's address blob and are compared at start-up, so a job started
 * with different values on different ranks fails at once, naming the variable. */
typedef struct agreed {
    int32_t shm, algorithm, allgather_algorithm, shm_negotiate;
    int32_t flat_allreduce, flat_allgather;
    int64_t small_bytes, shm_chunk_bytes;
    /* a sender spends the receiver's budget as its own (p2p_credit.c) */
    int64_t p2p_eager_bytes, p2p_unexpected_bytes, p2p_announced_bytes;
} agreed_t;

/* Algorithms: the first five are also the values of the algorithm knobs; the rest are
 * only ever chosen by exec.c (a response carries the one chosen for it). */
enum {
    ALG_AUTO,
    ALG_SHM,
    ALG_RING,
    ALG_RD,
    ALG_HIER,
    ALG_CHAIN,
    ALG_PAIRWISE,
    ALG_NONE,
    ALG_COUNT
};
const char *hvdl__alg_name(int alg); /* exec.c: the name it is traced under */

void hvdl__config_read(config_t *c);
int hvdl__inject_parse(const char *spec, config_t *c); /* inject.c: 0, or -1 if malformed */
struct engine;
/* api.c at start: the settings, in e's log */
void hvdl__config_log(const struct engine *e, const config_t *c, int rank);
void hvdl__config_agreed(const config_t *c, agreed_t *out);
/* 0 if a and b agree; else writes "VARIABLE (x here, y there)" to msg and returns 1. */
/* HVDL_TUNE (horovodlike.h): what is wrong with a tune op's values, or NULL; and the
 * values made this rank's knobs (a negative or unusable value keeps its knob). */
const char *hvdl__tune_problem(const double *v);
void hvdl__config_tune(config_t *c, const double *v);
int hvdl__config_disagree(const agreed_t *a, const agreed_t *b, char *msg, size_t cap);
#endif
