/*
 * An engine's life (create, prepare, start, shutdown, free), the public API
 * (horovodlike.h) as thin wrappers over the one engine pointer Python uses, and the
 * error funnel every public call reports through (a status code plus a thread-local
 * message). Each hvdl_x is hvdl__engine_x on that pointer; the C tests (tests/c) call
 * the hvdl__engine_x forms on several engines in one process. Per-op calls are in ops.c,
 * process sets in process_sets.c.
 */
#include "fail.h"
#include "loop.h"
#include "liveness.h"
#include "negotiation.h"
#include "net.h"
#include "shm.h"
#include "p2p.h"
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static engine_t *g_engine;     /* the only global: the engine Python talks to */
static pthread_mutex_t g_lifecycle = PTHREAD_MUTEX_INITIALIZER;
static __thread char tls_error[HVDL_MSG_BYTES];

/* Every error has a message: one that would be empty (a site that recorded no cause) is
 * replaced by the status's name, so that nothing surfaces as a bare error type. */
int hvdl__err(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tls_error, sizeof tls_error, fmt, ap);
    va_end(ap);
    if (status != HVDL_OK && !tls_error[0])
        snprintf(tls_error, sizeof tls_error,
                 "%s: the engine recorded no cause (a bug in horovodlike)",
                 hvdl_status_name(status));
    return status;
}

const char *hvdl_last_error(void) { return tls_error; }
void hvdl_free(void *p) { free(p); }

int hvdl_dtype_size(int dtype) {
    static const int SIZES[] = {[HVDL_UINT8] = 1,    [HVDL_INT8] = 1,    [HVDL_INT16] = 2,
                                [HVDL_INT32] = 4,    [HVDL_INT64] = 8,   [HVDL_FLOAT16] = 2,
                                [HVDL_BFLOAT16] = 2, [HVDL_FLOAT32] = 4, [HVDL_FLOAT64] = 8,
                                [HVDL_BOOL] = 1};
    _Static_assert(sizeof SIZES / sizeof SIZES[0] == HVDL_NUM_DTYPES, "a dtype without a size");
    return dtype >= 0 && dtype < HVDL_NUM_DTYPES ? SIZES[dtype] : 0;
}

void hvdl__engine_free(engine_t *e) {
    if (!e) return;
    hvdl__p2p_free(e);
    hvdl__close_all(e);
    e->negotiation->free(e);
    hvdl__shm_close(e);
    if (e->cross) {
        free(e->cross->ranks);
        free(e->cross);
    }
    free(e->node);
    buf_free(&e->ctx.hier);
    buf_free(&e->ctx.scratch);
    if (e->wake_fd >= 0) close(e->wake_fd);
    hvdl__coordinator_free(e);
    hvdl__deadlock_free(e);
    hvdl__cache_free(e);
    for (int i = 0; i < HVDL_MAX_SETS; i++) {
        if (!e->sets[i]) continue;
        free(e->sets[i]->ranks);
        free(e->sets[i]);
    }
    strmap_free(&e->mine);
    strmap_free(&e->inflight);
    buf_free(&e->fusion);
    free(e->tcp);
    free(e->peers);
    free(e->slots);
    free(e->gens);
    free(e->free_next);
    free(e->first_name);
    strmap_free(&e->seen_names);
    pthread_mutex_destroy(&e->mu);
    pthread_mutex_destroy(&e->drive);
    pthread_mutex_destroy(&e->tl_mu);
    pthread_cond_destroy(&e->done_cv);
    free(e);
}

engine_t *hvdl__engine_new(void) {
    engine_t *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->listen_fd = e->wake_fd = -1;
    e->negotiation = &hvdl__negotiate_frames;   /* until start-up chooses (negotiation.h) */
    e->rank = -1;            /* until start: what its log lines say */
    pthread_mutex_init(&e->mu, NULL);
    pthread_mutex_init(&e->drive, NULL);
    pthread_mutex_init(&e->tl_mu, NULL);
    pthread_cond_init(&e->done_cv, NULL);
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    e->t0 = hvdl_now();
    e->t0_epoch_us = (double)wall.tv_sec * 1e6 + wall.tv_nsec / 1e3;
    hvdl__config_read(&e->cfg);
    return e;
}

int hvdl__engine_prepare(engine_t *e, const char *hostname, const char *advertise_addr,
                         const char *bind_addr, const unsigned char *key, int key_len,
                         char *blob_out) {
    if (key_len < 0 || key_len > HVDL_KEY_MAX || (key_len > 0 && !key))
        return hvdl__err(HVDL_ERR_INVALID, "the job key must be 0..%d bytes, not %d", HVDL_KEY_MAX,
                         key_len);
    snprintf(e->host, sizeof e->host, "%s", hostname && *hostname ? hostname : "localhost");
    snprintf(e->bind_addr, sizeof e->bind_addr, "%s", bind_addr ? bind_addr : "");
    if (key_len) memcpy(e->key, key, (size_t)key_len);
    e->key_len = key_len;
    if (hvdl_random_bytes(&e->nonce, sizeof e->nonce))
        e->nonce = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)e;
    int port = hvdl__listen(e);
    if (port < 0)
        return hvdl__err(HVDL_ERR_SYSTEM, "cannot open a listening socket: %s", strerror(errno));
    hvdl__blob_write(e, port, advertise_addr && *advertise_addr ? advertise_addr : "127.0.0.1",
                     blob_out);
    return HVDL_OK;
}

/* A child forked while an engine runs has a copy of its state but not its threads: the
 * engine is the parent's. The child drops its copies of the sockets (closing them there
 * leaves the parent's open) and forgets the engine, so that a new one can be started in
 * the child; the bindings refuse calls until then (basics.py). The rest of the copy is
 * left alone: the child may hold a lock another thread of the parent held at the fork. */
static void forget_engine_in_child(void) {
    if (g_engine) {
        hvdl__close_all(g_engine);
        hvdl__p2p_close_in_child(g_engine);
        if (g_engine->wake_fd >= 0) close(g_engine->wake_fd);
    }
    g_engine = NULL;
    pthread_mutex_init(&g_lifecycle, NULL);
}

static void register_fork_handler(void) { pthread_atfork(NULL, NULL, forget_engine_in_child); }

int hvdl_prepare(const char *hostname, const char *advertise_addr, const char *bind_addr,
                 const unsigned char *key, int key_len, char *blob_out) {
    static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
    pthread_once(&fork_once, register_fork_handler);
    pthread_mutex_lock(&g_lifecycle);
    int rc = HVDL_OK;
    if (g_engine && !g_engine->stopped && g_engine->thread_started && !g_engine->failed) {
        rc = hvdl__err(HVDL_ERR_INVALID, "the engine is already running; call shutdown() first");
        goto out;
    }
    hvdl__engine_free(g_engine);   /* a previous, shut-down engine */
    g_engine = hvdl__engine_new();
    if (!g_engine) {
        rc = hvdl__err(HVDL_ERR_SYSTEM, "out of memory");
        goto out;
    }
    rc = hvdl__engine_prepare(g_engine, hostname, advertise_addr, bind_addr, key, key_len,
                              blob_out);
    if (rc) {
        hvdl__engine_free(g_engine);
        g_engine = NULL;
    }
out:
    pthread_mutex_unlock(&g_lifecycle);
    return rc;
}

/* Which node every rank is on (numbered in order of first appearance), and the ranks
 * with this rank's local index on every node, for the hierarchical algorithms. The
 * cross group is left NULL unless there are several nodes with the same number of ranks
 * each. */
static int build_nodes(engine_t *e) {
    int local[e->size], nodes = 0, per_node = 0;
    if (HVDL_INJECT(e, INJ_START_ALLOC) || !(e->node = malloc(sizeof(int) * (size_t)e->size)))
        return -1;
    for (int r = 0; r < e->size; r++) {
        local[r] = 0;                      /* index among the ranks of r's node */
        e->node[r] = nodes;
        for (int q = 0; q < r; q++)
            if (!strcmp(e->peers[q].host, e->peers[r].host)) {
                if (!local[r]) e->node[r] = e->node[q];
                local[r]++;
            }
        nodes += local[r] == 0;
        per_node += !strcmp(e->peers[r].host, e->peers[0].host);
    }
    e->nnodes = nodes;
    for (int r = 0; r < e->size; r++) {
        int here = 0;
        for (int q = 0; q < e->size; q++) here += !strcmp(e->peers[q].host, e->peers[r].host);
        if (here != per_node) return 0;    /* not homogeneous: no hierarchical path */
    }
    if (nodes < 2 || per_node < 2) return 0;
    group_t *g = calloc(1, sizeof *g);
    if (!g || !(g->ranks = malloc(sizeof(int) * (size_t)nodes))) {
        free(g);
        return -1;
    }
    g->id = -1;
    for (int r = 0; r < e->size; r++) {
        if (local[r] != local[e->rank]) continue;
        if (r == e->rank) g->me = g->n;
        g->ranks[g->n++] = r;
    }
    e->cross = g;
    return 0;
}

/* A start-up step failed: the cause it recorded (fail.c), or, had it recorded none, the
 * step by name, so that start-up never fails with an empty message. */
static int startup_failed(engine_t *e, const char *step) {
    if (!e->fail_msg[0])
        return hvdl__err(HVDL_ERR_SYSTEM,
                         "rank %d: start-up failed while %s, with no cause recorded "
                         "(last system error: %s)",
                         e->rank, step, strerror(errno));
    return hvdl__err(e->fail_status ? e->fail_status : HVDL_ERR_SYSTEM, "%s", e->fail_msg);
}

int hvdl__engine_start(engine_t *e, int rank, int size, const char *all_blobs) {
    if (e->thread_started || e->peers)
        return hvdl__err(HVDL_ERR_INVALID, "hvdl_start without hvdl_prepare");
    if (size < 1 || rank < 0 || rank >= size)
        return hvdl__err(HVDL_ERR_INVALID, "rank %d of size %d", rank, size);
    e->rank = rank;
    e->size = size;
    e->peers = calloc((size_t)size, sizeof *e->peers);
    if (!e->peers) return hvdl__err(HVDL_ERR_SYSTEM, "out of memory");
    for (int i = 0; i < size; i++) {
        e->peers[i].data_fd = e->peers[i].ctrl.fd = e->peers[i].p2p_fd = -1;
        if (hvdl__blob_read(all_blobs + (size_t)i * HVDL_BLOB_BYTES, &e->peers[i]))
            return hvdl__err(HVDL_ERR_INVALID,
                             "the address blob of rank %d is not a horovodlike blob "
                             "(mixed versions, or a bootstrap bug)",
                             i);
    }
    if (e->peers[rank].nonce != e->nonce)
        return hvdl__err(HVDL_ERR_INVALID,
                         "blob %d is not this process's: ranks were exchanged wrongly", rank);
    for (int i = 0; i < size; i++) {
        char what[256];
        if (hvdl__config_disagree(&e->peers[rank].agreed, &e->peers[i].agreed, what, sizeof what))
            return hvdl__err(HVDL_ERR_INVALID,
                             "rank %d and rank %d (host %s) were started with different "
                             "settings: %s. Set it the same way on every rank",
                             rank, i, e->peers[i].host, what);
    }
    int *all = malloc(sizeof(int) * (size_t)size);
    for (int i = 0; all && i < size; i++) all[i] = i;
    int rc = all ? hvdl__engine_set_add(e, 0, all, size) : HVDL_ERR_SYSTEM;
    free(all);
    if (rc) return hvdl__err(HVDL_ERR_SYSTEM, "out of memory");
    e->tcp = hvdl__tcp_transport(e);
    e->wake_fd = hvdl_wakefd_open();
    if (!e->tcp || e->wake_fd < 0 || (rank == 0 && hvdl__coordinator_new(e)))
        return hvdl__err(HVDL_ERR_SYSTEM, "engine set-up failed: %s", strerror(errno));
    if (hvdl__connect_all(e)) return startup_failed(e, "connecting to the other ranks");
    int nlocal = 0;
    for (int i = 0; i < size; i++) nlocal += !strcmp(e->peers[i].host, e->host);
    /* Spinning pays only where the spinning thread does not hold a core that another
     * thread of the op needs. Between ops, a rank's caller and its engine thread both
     * take part (enqueue, negotiation, wake-up), so the loop's wait for control traffic
     * and a caller's wait spin only where every rank's two threads have a core each;
     * inside a shared-memory collective the callers sleep, so its barrier spins while
     * every local rank has a core. */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    e->spin_us = 2 * nlocal > cores ? 0 : e->cfg.spin_us;
    e->shm_spin_us = nlocal > cores ? 0 : e->cfg.spin_us;
    hvdl__log(e, HVDL_LOG_INFO,
              "rank %d waits spin %d us, shm barriers %d us (%d local ranks, %ld cores)", rank,
              e->spin_us, e->shm_spin_us, nlocal, cores);
    /* connected by now: the cause reaches every rank (fail.c), and each fails its start */
    if (build_nodes(e)) {
        hvdl__oom(e, "table of the job's nodes", (int64_t)sizeof(int) * size);
        return startup_failed(e, "mapping the ranks to their nodes");
    }
    if (hvdl__shm_open(e) || hvdl__negotiation_open(e) || hvdl__clock_sync(e))
        return startup_failed(e, "setting up shared memory, negotiation and the clocks");
    hvdl__ctx_fill(e);
    hvdl__liveness_start(e);
    if (e->cfg.timeline[0] && hvdl__timeline_open(e, e->cfg.timeline, e->cfg.timeline_mark_cycles))
        hvdl__log(e, HVDL_LOG_WARNING, "cannot write the timeline next to %s: %s", e->cfg.timeline,
                  strerror(errno));
    hvdl__config_log(e, &e->cfg, rank);
    /* Signals sent to the process (Ctrl-C, kill) must reach a thread that does not block
     * them; if the engine's thread took one, Python's handler would wait for the main
     * thread to wake up by itself (a sleep of a minute: the launcher SIGKILLs first). So
     * the engine's threads (the loop, the point-to-point thread and what they start)
     * block them. */
    sigset_t app_signals, mask;
    sigemptyset(&app_signals);
    sigaddset(&app_signals, SIGINT);
    sigaddset(&app_signals, SIGTERM);
    sigaddset(&app_signals, SIGHUP);
    sigaddset(&app_signals, SIGQUIT);
    pthread_sigmask(SIG_BLOCK, &app_signals, &mask);
    int p2p_failed = hvdl__p2p_start(e);
    int failed = p2p_failed || pthread_create(&e->thread, NULL, hvdl__loop, e);
    pthread_sigmask(SIG_SETMASK, &mask, NULL);
    if (p2p_failed) return startup_failed(e, "starting the point-to-point thread");
    if (failed) return hvdl__err(HVDL_ERR_SYSTEM, "cannot start the background thread");
    e->thread_started = 1;
    return HVDL_OK;
}

int hvdl_start(int rank, int size, const char *all_blobs) {
    pthread_mutex_lock(&g_lifecycle);
    int rc = g_engine ? hvdl__engine_start(g_engine, rank, size, all_blobs)
                      : hvdl__err(HVDL_ERR_INVALID, "hvdl_start without hvdl_prepare");
    if (rc != HVDL_OK && g_engine && !g_engine->thread_started) {
        hvdl__engine_free(g_engine);
        g_engine = NULL;
    }
    pthread_mutex_unlock(&g_lifecycle);
    return rc;
}

void hvdl__wake(engine_t *e) { hvdl_wakefd_signal(e->wake_fd); }

int hvdl__engine_shutdown(engine_t *e) {
    if (!e->thread_started) return HVDL_OK;
    pthread_mutex_lock(&e->mu);
    int first = !e->shutdown_requested;
    e->shutdown_requested = 1;
    pthread_mutex_unlock(&e->mu);
    /* Sends are refused from here on: the peers learn that this rank has finished,
     * behind what it sent. Its engine serves on until every rank has (shutdown.c). */
    if (first && !e->failed) hvdl__p2p_leave(e);
    hvdl__wake(e);
    pthread_join(e->thread, NULL);
    hvdl__p2p_stop(e);
    hvdl__timeline_close(e);
    e->thread_started = 0;
    e->stopped = 1;
    hvdl__close_all(e);
    /* The job failed (not merely shut down): say so, for a launcher that must end it. */
    if (e->failed && (e->fail_status == HVDL_ERR_PEER_LOST || e->fail_status == HVDL_ERR_STALLED))
        return hvdl__err(e->fail_status, "%s", e->fail_msg);
    return HVDL_OK;
}

int hvdl_shutdown(void) {
    pthread_mutex_lock(&g_lifecycle);
    int rc = g_engine ? hvdl__engine_shutdown(g_engine) : HVDL_OK;
    pthread_mutex_unlock(&g_lifecycle);
    return rc;
}

int hvdl__engine_running(engine_t *e) {
    return e && e->thread_started && !e->stopped && !e->failed;
}

int hvdl_is_running(void) { return hvdl__engine_running(g_engine); }

/* ---- per-op calls and process sets (ops.c, process_sets.c) on the one engine ---- */

int hvdl_enqueue(const hvdl_request *q, int64_t *handle) {
    return hvdl__engine_enqueue(g_engine, q, handle);
}
int hvdl_poll(int64_t h) { return hvdl__engine_poll(g_engine, h); }
int hvdl_wait(int64_t h, double timeout_s) { return hvdl__engine_wait(g_engine, h, timeout_s); }
int hvdl_release(int64_t h, char *msg, hvdl_result *result) {
    return hvdl__engine_release(g_engine, h, msg, result);
}
int hvdl_run(const hvdl_request *q, const void *input, void *output, double timeout_s,
             int64_t *handle, char *msg, hvdl_result *result) {
    return hvdl__engine_run(g_engine, q, input, output, timeout_s, handle, msg, result);
}
int hvdl_process_set_add(int id, const int *ranks, int n) {
    return hvdl__engine_set_add(g_engine, id, ranks, n);
}
int hvdl_process_set_remove(int id) { return hvdl__engine_set_remove(g_engine, id); }

/* ---- tracing ---- */

int hvdl__engine_timeline_start(engine_t *e, const char *path, int mark_cycles) {
    if (!e || !e->thread_started)
        return hvdl__err(HVDL_ERR_NOT_INITIALIZED,
                         "horovodlike has not been initialized; use hvd.init()");
    if (!path || !*path) return hvdl__err(HVDL_ERR_INVALID, "start_timeline needs a file path");
    if (hvdl__timeline_open(e, path, mark_cycles))
        return hvdl__err(HVDL_ERR_SYSTEM, "cannot write the timeline next to '%s': %s", path,
                         strerror(errno));
    return HVDL_OK;
}

int hvdl_timeline_start(const char *path, int mark_cycles) {
    return hvdl__engine_timeline_start(g_engine, path, mark_cycles);
}

int hvdl_timeline_stop(void) {
    if (g_engine) hvdl__timeline_close(g_engine);
    return HVDL_OK;
}
