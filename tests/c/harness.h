/*
 * Several engines as threads in one process, as Gloo's tests run ranks: each rank's
 * engine is prepared, the address blobs are exchanged in memory, and every rank starts,
 * runs the test body and shuts down on its own thread. Engines talk over loopback TCP
 * and, when they share a host name, over their node's shared-memory segment; distinct
 * host names make distinct "nodes" inside the one process.
 */
#ifndef HVDL_TEST_HARNESS_H
#define HVDL_TEST_HARNESS_H
#include "engine.h"

typedef struct world {
    int size;
    engine_t **e;
    const char *label;       /* for failure messages */
    int may_fail;            /* a failure-path test: failures are its subject */
    int started;             /* every rank started */
    char (*start_msg)[HVDL_MSG_BYTES];   /* per rank: why its start failed, or "" */
} world_t;

/* How a world is set up: host of every rank (NULL = all "localhost"), a hook that
 * adjusts each engine's configuration before its blob is written, and for the
 * failure-path tests an injected failure (HOROVODLIKE_TEST_INJECT's site[:rank[:nth]])
 * and may_fail (start-up may fail, and engines may end failed). */
typedef struct world_opts {
    const char *const *hosts;
    void (*tweak)(config_t *cfg);
    const char *label;
    const char *inject;
    int may_fail;
} world_opts_t;

/* Start size engines; exits the process with a message if start-up fails, unless
 * may_fail: then w->started says whether every rank started, w->start_msg why not. */
world_t *world_start(int size, const world_opts_t *o);
/* Run body(world, rank, arg) on one thread per rank and wait for all of them. */
void world_run(world_t *w, void (*body)(world_t *w, int rank, void *arg), void *arg);
/* Shut every engine down (concurrently: shutdown waits for every rank) and free them. */
void world_stop(world_t *w);

/* Checks: a failure prints where and why and counts; the process exits 1 at the end. */
extern atomic_int g_failures;
#define CHECK(cond, ...)                                            \
    do {                                                            \
        if (!(cond)) check_failed(__FILE__, __LINE__, __VA_ARGS__); \
    } while (0)
void check_failed(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A request with the usual defaults (sum, scales 1) and the first two dimensions. */
hvdl_request make_request(int op, int dtype, int set, const char *name, int ndim, int64_t d0,
                          int64_t d1);

/* Settings that keep the tests quick: small shm pieces and TCP staging (so that a few
 * KiB cross several), a short cycle and peer timeout; no_shm also turns the segment off. */
void small_pieces(config_t *c);
void no_shm(config_t *c);

/* Enqueue, then wait (bounded) and release: the op's status; *res filled if given. */
int run_op(engine_t *e, const hvdl_request *q, hvdl_result *res, char *msg);

/* The algorithm an engine traced for a collective (its timeline, as the Python tests
 * read it): into out, "" if the trace has no such collective. Removes the trace file. */
void traced_algorithm(const char *trace, const char *tensor, char *out, size_t cap);

/* test_failures.c: the failure paths, each caused for real */
void run_failure_tests(void);

/* test_frames.c: the small control frames' encoders and decoders (wire.c) */
void test_frames(void);
/* test_p2p_frames.c: the point-to-point frames' checks (p2p_frames.c) */
void test_p2p_frames(void);
#endif
