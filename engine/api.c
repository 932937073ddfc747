/*
 * The public API (horovodlike.h): the one engine pointer, start-up and shutdown, local
 * checks at enqueue, the handle table, and waiting.
 *
 * Handles are generation << 32 | slot, so a stale handle after release is rejected
 * instead of aliasing a newer op. Waiters spin briefly on the op's atomic flag (a
 * small allreduce finishes within microseconds) and then block on a condition variable:
 * with 8 ranks on 2 cores, a waiter that spins steals the core its peers need.
 */
#include "internal.h"
#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

static engine_t *g_engine;
static pthread_mutex_t g_lifecycle = PTHREAD_MUTEX_INITIALIZER;
static __thread char tls_error[HVDL_MSG_BYTES];

static const char *STATUS_NAMES[] = {
    "OK", "INVALID_ARGUMENT", "DUPLICATE_NAME", "MISMATCH", "PEER_LOST", "NOT_INITIALIZED",
    "SHUT_DOWN", "SYSTEM_ERROR", "TIMEOUT", "NOT_IMPLEMENTED", "STALLED"};

static int err(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tls_error, sizeof tls_error, fmt, ap);
    va_end(ap);
    return status;
}

const char *hvdl_last_error(void) { return tls_error; }
const char *hvdl_status_name(int s) { return s >= 0 && s <= HVDL_ERR_STALLED ? STATUS_NAMES[s] : "UNKNOWN"; }
void hvdl_free(void *p) { free(p); }

int hvdl_dtype_size(int dtype) {
    static const int SIZES[HVDL_NUM_DTYPES] = {1, 1, 2, 4, 8, 2, 2, 4, 8, 1};
    return dtype >= 0 && dtype < HVDL_NUM_DTYPES ? SIZES[dtype] : 0;
}

static void engine_free(engine_t *e) {
    if (!e) return;
    hvdl__close_all(e);
    hvdl__shm_close(e);
    if (e->cross) { free(e->cross->ranks); free(e->cross); }
    buf_free(&e->hier);
    if (e->wake_fd >= 0) close(e->wake_fd);
    hvdl__coordinator_free(e);
    hvdl__cache_free(e);
    for (int i = 0; i < HVDL_MAX_SETS; i++) {
        if (!e->sets[i]) continue;
        free(e->sets[i]->ranks);
        free(e->sets[i]);
    }
    strmap_free(&e->mine);
    strmap_free(&e->inflight);
    buf_free(&e->fusion);
    buf_free(&e->scratch);
    free(e->tcp);
    free(e->peers);
    free(e->slots);
    free(e->gens);
    free(e->free_next);
    free(e->first_name);
    strmap_free(&e->seen_names);
    pthread_mutex_destroy(&e->mu);
    pthread_mutex_destroy(&e->tl_mu);
    pthread_cond_destroy(&e->done_cv);
    free(e);
}

int hvdl_prepare(const char *hostname, const char *advertise_addr, char *blob_out) {
    pthread_mutex_lock(&g_lifecycle);
    int rc = HVDL_OK;
    if (g_engine && !g_engine->stopped && g_engine->thread_started && !g_engine->failed) {
        rc = err(HVDL_ERR_INVALID, "the engine is already running; call shutdown() first");
        goto out;
    }
    engine_free(g_engine);   /* a previous, shut-down engine */
    g_engine = NULL;
    engine_t *e = calloc(1, sizeof *e);
    if (!e) { rc = err(HVDL_ERR_SYSTEM, "out of memory"); goto out; }
    e->listen_fd = e->wake_fd = -1;
    pthread_mutex_init(&e->mu, NULL);
    pthread_mutex_init(&e->tl_mu, NULL);
    pthread_cond_init(&e->done_cv, NULL);
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    e->t0 = hvdl_now();
    e->t0_epoch_us = (double)wall.tv_sec * 1e6 + wall.tv_nsec / 1e3;
    hvdl__config_read(&e->cfg);
    snprintf(e->host, sizeof e->host, "%s", hostname && *hostname ? hostname : "localhost");
    if (getrandom(&e->nonce, sizeof e->nonce, 0) != sizeof e->nonce)
        e->nonce = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    int port = hvdl__listen(e);
    if (port < 0) {
        rc = err(HVDL_ERR_SYSTEM, "cannot open a listening socket: %s", strerror(errno));
        engine_free(e);
        goto out;
    }
    hvdl__blob_write(e, port, advertise_addr && *advertise_addr ? advertise_addr : "127.0.0.1", blob_out);
    g_engine = e;
out:
    pthread_mutex_unlock(&g_lifecycle);
    return rc;
}

/* The ranks with this rank's local index on every node, for hierarchical allreduce.
 * Left NULL unless there are several nodes with the same number of ranks each. */
static int build_cross_group(engine_t *e) {
    int local[e->size], nodes = 0, per_node = 0;
    for (int r = 0; r < e->size; r++) {
        local[r] = 0;                      /* index among the ranks of r's node */
        for (int q = 0; q < r; q++) local[r] += !strcmp(e->peers[q].host, e->peers[r].host);
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
    if (!g || !(g->ranks = malloc(sizeof(int) * (size_t)nodes))) { free(g); return -1; }
    g->id = -1;
    for (int r = 0; r < e->size; r++) {
        if (local[r] != local[e->rank]) continue;
        if (r == e->rank) g->me = g->n;
        g->ranks[g->n++] = r;
    }
    e->cross = g;
    return 0;
}

int hvdl_start(int rank, int size, const char *all_blobs) {
    pthread_mutex_lock(&g_lifecycle);
    engine_t *e = g_engine;
    int rc = HVDL_OK;
    if (!e || e->thread_started) { rc = err(HVDL_ERR_INVALID, "hvdl_start without hvdl_prepare"); goto out; }
    if (size < 1 || rank < 0 || rank >= size) { rc = err(HVDL_ERR_INVALID, "rank %d of size %d", rank, size); goto out; }
    e->rank = rank;
    e->size = size;
    hvdl__log_set_rank(rank);
    e->peers = calloc((size_t)size, sizeof *e->peers);
    if (!e->peers) { rc = err(HVDL_ERR_SYSTEM, "out of memory"); goto out; }
    for (int i = 0; i < size; i++) {
        e->peers[i].data_fd = e->peers[i].ctrl.fd = -1;
        if (hvdl__blob_read(all_blobs + (size_t)i * HVDL_BLOB_BYTES, &e->peers[i])) {
            rc = err(HVDL_ERR_INVALID, "the address blob of rank %d is not a horovodlike blob "
                     "(mixed versions, or a bootstrap bug)", i);
            goto out;
        }
    }
    if (e->peers[rank].nonce != e->nonce) {
        rc = err(HVDL_ERR_INVALID, "blob %d is not this process's: ranks were exchanged wrongly", rank);
        goto out;
    }
    int *all = malloc(sizeof(int) * (size_t)size);
    for (int i = 0; all && i < size; i++) all[i] = i;
    if (!all || hvdl_process_set_add(0, all, size)) {
        free(all);
        rc = err(HVDL_ERR_SYSTEM, "out of memory");
        goto out;
    }
    free(all);
    e->tcp = hvdl__tcp_transport(e);
    e->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!e->tcp || e->wake_fd < 0 || (rank == 0 && hvdl__coordinator_new(e))) {
        rc = err(HVDL_ERR_SYSTEM, "engine set-up failed: %s", strerror(errno));
        goto out;
    }
    if (hvdl__connect_all(e)) {
        rc = err(e->fail_status ? e->fail_status : HVDL_ERR_SYSTEM, "%s", e->fail_msg);
        goto out;
    }
    int nlocal = 0;
    for (int i = 0; i < size; i++) nlocal += !strcmp(e->peers[i].host, e->host);
    e->spin_us = nlocal > sysconf(_SC_NPROCESSORS_ONLN) ? 0 : e->cfg.spin_us;
    if (build_cross_group(e)) {
        rc = err(HVDL_ERR_SYSTEM, "out of memory");
        goto out;
    }
    if (hvdl__shm_open(e)) {
        rc = err(e->fail_status ? e->fail_status : HVDL_ERR_SYSTEM, "%s", e->fail_msg);
        goto out;
    }
    if (hvdl__clock_sync(e)) {
        rc = err(e->fail_status ? e->fail_status : HVDL_ERR_SYSTEM, "%s", e->fail_msg);
        goto out;
    }
    if (e->cfg.timeline[0] && hvdl__timeline_open(e, e->cfg.timeline, e->cfg.timeline_mark_cycles))
        hvdl__log(HVDL_LOG_WARNING, "cannot write the timeline next to %s: %s", e->cfg.timeline, strerror(errno));
    hvdl__config_log(&e->cfg, rank);
    if (pthread_create(&e->thread, NULL, hvdl__loop, e)) {
        rc = err(HVDL_ERR_SYSTEM, "cannot start the background thread");
        goto out;
    }
    e->thread_started = 1;
out:
    if (rc != HVDL_OK && e) {
        engine_free(e);
        g_engine = NULL;
    }
    pthread_mutex_unlock(&g_lifecycle);
    return rc;
}

static void wake(engine_t *e) {
    uint64_t one = 1;
    if (write(e->wake_fd, &one, sizeof one) < 0) { /* counter saturated: already awake */ }
}

int hvdl_shutdown(void) {
    pthread_mutex_lock(&g_lifecycle);
    engine_t *e = g_engine;
    if (e && e->thread_started) {
        pthread_mutex_lock(&e->mu);
        e->shutdown_requested = 1;
        pthread_mutex_unlock(&e->mu);
        wake(e);
        pthread_join(e->thread, NULL);
        hvdl__timeline_close(e);
        e->thread_started = 0;
        e->stopped = 1;
        hvdl__close_all(e);
    }
    pthread_mutex_unlock(&g_lifecycle);
    return HVDL_OK;
}

int hvdl_is_running(void) {
    engine_t *e = g_engine;
    return e && e->thread_started && !e->stopped && !e->failed;
}

/* ---- enqueue ---- */

/* Everything that can be checked without the other ranks. Called with mu held (it reads
 * the process-set table). */
static int check_request(engine_t *e, const hvdl_request *q, int64_t *nbytes) {
    if (!q->name || !*q->name) return err(HVDL_ERR_INVALID, "every request needs a name");
    if (strlen(q->name) > 4096) return err(HVDL_ERR_INVALID, "name longer than 4096 bytes: '%.64s...'", q->name);
    if (q->op < 0 || q->op > HVDL_OP_JOIN) return err(HVDL_ERR_INVALID, "'%s': unknown op %d", q->name, q->op);
    group_t *g = q->process_set >= 0 && q->process_set < HVDL_MAX_SETS ? e->sets[q->process_set] : NULL;
    if (!g || g->removed)
        return err(HVDL_ERR_INVALID, "'%s': process set %d does not exist (was it added on every "
                   "rank, or removed?)", q->name, q->process_set);
    if (g->me < 0)
        return err(HVDL_ERR_INVALID, "'%s': rank %d is not a member of process set %d",
                   q->name, e->rank, q->process_set);
    if (q->op == HVDL_OP_JOIN && q->process_set != 0)
        return err(HVDL_ERR_NOT_IMPLEMENTED, "'%s': join() on a process set other than the "
                   "global one is not implemented", q->name);
    if (q->op == HVDL_OP_BARRIER || q->op == HVDL_OP_JOIN) { *nbytes = 0; return HVDL_OK; }
    if (!hvdl_dtype_size(q->dtype)) return err(HVDL_ERR_INVALID, "'%s': unknown dtype %d", q->name, q->dtype);
    if (q->ndim < 0 || q->ndim > HVDL_MAX_DIMS)
        return err(HVDL_ERR_INVALID, "'%s': %d dimensions; at most %d are supported", q->name, q->ndim, HVDL_MAX_DIMS);
    int64_t n = hvdl_dtype_size(q->dtype);
    for (int d = 0; d < q->ndim; d++) {
        if (q->shape[d] < 0) return err(HVDL_ERR_INVALID, "'%s': negative dimension %lld", q->name, (long long)q->shape[d]);
        if (q->shape[d] && n > INT64_MAX / q->shape[d]) return err(HVDL_ERR_INVALID, "'%s': size overflows 64 bits", q->name);
        n *= q->shape[d];
    }
    *nbytes = n;
    if (n && !q->input) return err(HVDL_ERR_INVALID, "'%s': input buffer is NULL", q->name);
    if (q->op == HVDL_OP_ALLREDUCE || q->op == HVDL_OP_REDUCESCATTER) {
        if (q->reduce_op == HVDL_ADASUM)
            return err(HVDL_ERR_NOT_IMPLEMENTED, "'%s': Adasum is not implemented in horovodlike yet", q->name);
        if (q->reduce_op < 0 || q->reduce_op > HVDL_PRODUCT) return err(HVDL_ERR_INVALID, "'%s': unknown reduce op %d", q->name, q->reduce_op);
        if (q->dtype == HVDL_BOOL && (q->reduce_op == HVDL_AVERAGE || q->prescale != 1.0 || q->postscale != 1.0))
            return err(HVDL_ERR_INVALID, "'%s': bool tensors support Sum/Min/Max/Product without scaling, not Average", q->name);
    }
    if (q->op == HVDL_OP_REDUCESCATTER && q->reduce_op != HVDL_SUM && q->reduce_op != HVDL_AVERAGE)
        return err(HVDL_ERR_INVALID, "'%s': reducescatter supports only Sum and Average", q->name);
    if ((q->op == HVDL_OP_ALLREDUCE || q->op == HVDL_OP_BROADCAST || q->op == HVDL_OP_REDUCESCATTER) &&
        n && !q->output)
        return err(HVDL_ERR_INVALID, "'%s': output buffer is NULL", q->name);
    if (q->op == HVDL_OP_BROADCAST && (q->root_rank < 0 || q->root_rank >= g->n))
        return err(HVDL_ERR_INVALID, "'%s': root rank %d is not in [0, %d)", q->name, q->root_rank, g->n);
    if ((q->op == HVDL_OP_ALLGATHER || q->op == HVDL_OP_ALLTOALL || q->op == HVDL_OP_REDUCESCATTER) && q->ndim < 1)
        return err(HVDL_ERR_INVALID, "'%s': %s needs at least one dimension", q->name,
                   q->op == HVDL_OP_ALLGATHER ? "allgather" : q->op == HVDL_OP_ALLTOALL ? "alltoall" : "reducescatter");
    if (q->op == HVDL_OP_ALLTOALL) {
        int64_t sum = 0;
        for (int i = 0; q->splits && i < g->n; i++) {
            if (q->splits[i] < 0) return err(HVDL_ERR_INVALID, "'%s': negative split %lld", q->name, (long long)q->splits[i]);
            sum += q->splits[i];
        }
        if (q->splits && sum != q->shape[0])
            return err(HVDL_ERR_INVALID, "'%s': splits add up to %lld rows but the tensor has %lld",
                       q->name, (long long)sum, (long long)q->shape[0]);
        if (!q->splits && q->shape[0] % g->n)
            return err(HVDL_ERR_INVALID, "'%s': %lld rows cannot be split evenly over %d ranks; pass splits",
                       q->name, (long long)q->shape[0], g->n);
    }
    return HVDL_OK;
}

/* The alltoall splits this request sends, one per member (even when not given). */
static int64_t *copy_splits(const hvdl_request *q, int n) {
    int64_t *s = malloc(sizeof(int64_t) * (size_t)n);
    for (int i = 0; s && i < n; i++) s[i] = q->splits ? q->splits[i] : q->shape[0] / n;
    return s;
}

static int alloc_slot(engine_t *e) {
    if (e->free_head <= 0) {
        int n = e->nslots ? e->nslots * 2 : 256;
        op_t **s = realloc(e->slots, sizeof *s * (size_t)n);
        if (s) e->slots = s;
        uint32_t *g = realloc(e->gens, sizeof *g * (size_t)n);
        if (g) e->gens = g;
        int *f = realloc(e->free_next, sizeof *f * (size_t)n);
        if (f) e->free_next = f;
        if (!s || !g || !f) return -1;
        for (int i = e->nslots; i < n; i++) {
            e->slots[i] = NULL;
            e->gens[i] = 1;
            e->free_next[i] = i + 1 < n ? i + 2 : 0;   /* stored +1; 0 ends the list */
        }
        e->free_head = e->nslots + 1;
        e->nslots = n;
    }
    int slot = e->free_head - 1;
    e->free_head = e->free_next[slot];
    return slot;
}

int hvdl_enqueue(const hvdl_request *q, int64_t *handle) {
    engine_t *e = g_engine;
    if (!q || !handle) return err(HVDL_ERR_INVALID, "NULL request or handle pointer");
    if (!e || !e->thread_started) return err(HVDL_ERR_NOT_INITIALIZED, "horovodlike has not been initialized; use hvd.init()");
    int64_t nbytes = 0;
    pthread_mutex_lock(&e->mu);
    int rc = check_request(e, q, &nbytes);
    int set_size = rc ? 0 : e->sets[q->process_set]->n;
    pthread_mutex_unlock(&e->mu);
    if (rc) return rc;
    op_t *o = calloc(1, sizeof *o);
    if (!o || !(o->name = strdup(q->name)) ||
        (q->op == HVDL_OP_ALLTOALL && !(o->splits = copy_splits(q, set_size)))) {
        if (o) { free(o->name); free(o); }
        return err(HVDL_ERR_SYSTEM, "out of memory");
    }
    o->meta = (meta_t){q->op, q->dtype, q->reduce_op, q->op == HVDL_OP_BROADCAST ? q->root_rank : 0,
                       q->process_set, q->ndim, {0}, q->prescale, q->postscale};
    /* Fields an op does not use are zeroed so they never cause a false mismatch. */
    int reduces = q->op == HVDL_OP_ALLREDUCE || q->op == HVDL_OP_REDUCESCATTER;
    if (!reduces) o->meta.prescale = o->meta.postscale = 1.0;
    if (!reduces) o->meta.reduce_op = 0;
    memcpy(o->meta.shape, q->shape, sizeof(int64_t) * (size_t)q->ndim);
    o->input = q->input;
    o->output = q->output;
    o->nbytes = nbytes;
    o->enqueued_at = hvdl_now();

    pthread_mutex_lock(&e->mu);
    if (e->failed) rc = err(e->fail_status, "%s", e->fail_msg);
    else if (e->shutdown_requested || e->stopped) rc = err(HVDL_ERR_SHUT_DOWN, "horovodlike has been shut down");
    else if (strmap_get(&e->inflight, o->name))
        rc = err(HVDL_ERR_DUPLICATE_NAME, "a request named '%s' is already in flight; names must be "
                 "unique until their op completes", o->name);
    int slot = rc ? -1 : alloc_slot(e);
    if (!rc && (slot < 0 || strmap_put(&e->inflight, o->name, o))) rc = err(HVDL_ERR_SYSTEM, "out of memory");
    if (!rc) {
        o->handle = (int64_t)e->gens[slot] << 32 | slot;
        e->slots[slot] = o;
        hvdl__queue_push(&e->incoming, o);
    }
    pthread_mutex_unlock(&e->mu);
    if (rc) { free(o->name); free(o->splits); free(o); return rc; }
    wake(e);
    *handle = o->handle;
    return HVDL_OK;
}

/* ---- tracing ---- */

int hvdl_timeline_start(const char *path, int mark_cycles) {
    engine_t *e = g_engine;
    if (!e || !e->thread_started) return err(HVDL_ERR_NOT_INITIALIZED, "horovodlike has not been initialized; use hvd.init()");
    if (!path || !*path) return err(HVDL_ERR_INVALID, "start_timeline needs a file path");
    if (hvdl__timeline_open(e, path, mark_cycles))
        return err(HVDL_ERR_SYSTEM, "cannot write the timeline next to '%s': %s", path, strerror(errno));
    return HVDL_OK;
}

int hvdl_timeline_stop(void) {
    engine_t *e = g_engine;
    if (e) hvdl__timeline_close(e);
    return HVDL_OK;
}

/* ---- process sets ---- */

static engine_t *set_engine(void) {
    engine_t *e = g_engine;
    return e && e->peers ? e : NULL;
}

int hvdl_process_set_add(int id, const int *ranks, int n) {
    engine_t *e = set_engine();
    if (!e) return err(HVDL_ERR_NOT_INITIALIZED, "horovodlike has not been initialized; use hvd.init()");
    if (id < 0 || id >= HVDL_MAX_SETS)
        return err(HVDL_ERR_INVALID, "process set id %d: at most %d process sets per job", id, HVDL_MAX_SETS);
    if (n < 1 || n > e->size) return err(HVDL_ERR_INVALID, "a process set needs 1 to %d ranks, not %d", e->size, n);
    for (int i = 0; i < n; i++)
        if (ranks[i] < 0 || ranks[i] >= e->size || (i && ranks[i] <= ranks[i - 1]))
            return err(HVDL_ERR_INVALID, "process set ranks must be sorted, unique and in [0, %d)", e->size);
    group_t *g = calloc(1, sizeof *g);
    if (!g || !(g->ranks = malloc(sizeof(int) * (size_t)n))) { free(g); return err(HVDL_ERR_SYSTEM, "out of memory"); }
    memcpy(g->ranks, ranks, sizeof(int) * (size_t)n);
    g->id = id;
    g->n = n;
    g->me = -1;
    for (int i = 0; i < n; i++)
        if (ranks[i] == e->rank) g->me = i;
    pthread_mutex_lock(&e->mu);
    int taken = e->sets[id] != NULL;
    if (!taken) e->sets[id] = g;
    pthread_mutex_unlock(&e->mu);
    if (taken) {
        free(g->ranks);
        free(g);
        return err(HVDL_ERR_INVALID, "process set id %d is already in use", id);
    }
    /* Rank 0 may already hold requests for this set, waiting for it to be known. */
    atomic_store(&e->sets_changed, 1);
    if (e->wake_fd >= 0) wake(e);
    return HVDL_OK;
}

int hvdl_process_set_remove(int id) {
    engine_t *e = set_engine();
    if (!e) return err(HVDL_ERR_NOT_INITIALIZED, "horovodlike has not been initialized; use hvd.init()");
    if (id == 0) return err(HVDL_ERR_INVALID, "the global process set cannot be removed");
    pthread_mutex_lock(&e->mu);
    group_t *g = id > 0 && id < HVDL_MAX_SETS ? e->sets[id] : NULL;
    int ok = g && !g->removed;
    if (ok) g->removed = 1;     /* kept allocated: the loop may still read it */
    pthread_mutex_unlock(&e->mu);
    return ok ? HVDL_OK : err(HVDL_ERR_INVALID, "process set %d does not exist", id);
}

/* ---- handles ---- */

static op_t *lookup(engine_t *e, int64_t h) {
    uint32_t slot = (uint32_t)h, gen = (uint32_t)(h >> 32);
    if (!e || h < 0 || slot >= (uint32_t)e->nslots || e->gens[slot] != gen) return NULL;
    return e->slots[slot];
}

int hvdl_poll(int64_t h) {
    engine_t *e = g_engine;
    if (!e) return -1;
    pthread_mutex_lock(&e->mu);
    op_t *o = lookup(e, h);
    int done = o ? atomic_load(&o->done) : -1;
    pthread_mutex_unlock(&e->mu);
    return done;
}

int hvdl_wait(int64_t h, double timeout_s) {
    engine_t *e = g_engine;
    if (!e) return err(HVDL_ERR_NOT_INITIALIZED, "horovodlike has not been initialized");
    pthread_mutex_lock(&e->mu);
    op_t *o = lookup(e, h);
    pthread_mutex_unlock(&e->mu);
    if (!o) return err(HVDL_ERR_INVALID, "unknown or released handle %lld", (long long)h);
    for (int i = 0; i < 2000 && !atomic_load(&o->done); i++) {
        if (i & 63) __builtin_ia32_pause();
        else sched_yield();
    }
    if (atomic_load(&o->done)) return HVDL_OK;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double end = ts.tv_sec + ts.tv_nsec * 1e-9 + (timeout_s < 0 ? 1e9 : timeout_s);
    ts.tv_sec = (time_t)end;
    ts.tv_nsec = (long)((end - (double)ts.tv_sec) * 1e9);
    int rc = 0;
    pthread_mutex_lock(&e->mu);
    while (!atomic_load(&o->done) && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&e->done_cv, &e->mu, &ts);
    int done = atomic_load(&o->done);
    pthread_mutex_unlock(&e->mu);
    return done ? HVDL_OK : err(HVDL_ERR_TIMEOUT, "op '%s' not finished after %.1f s", o->name, timeout_s);
}

int hvdl_release(int64_t h, char *msg, hvdl_result *result) {
    engine_t *e = g_engine;
    if (!e) return err(HVDL_ERR_INVALID, "unknown handle %lld", (long long)h);
    pthread_mutex_lock(&e->mu);
    op_t *o = lookup(e, h);
    if (!o || !atomic_load(&o->done)) {
        pthread_mutex_unlock(&e->mu);
        return err(HVDL_ERR_INVALID, o ? "handle %lld is still in flight" : "unknown or released handle %lld", (long long)h);
    }
    uint32_t slot = (uint32_t)h;
    e->slots[slot] = NULL;
    e->gens[slot]++;
    e->free_next[slot] = e->free_head;
    e->free_head = (int)slot + 1;
    pthread_mutex_unlock(&e->mu);
    int status = o->status;
    if (msg) snprintf(msg, HVDL_MSG_BYTES, "%s", o->msg ? o->msg : "");
    if (result) {
        *result = o->result;
    } else {
        free(o->result.data);
        free(o->result.recv_splits);
    }
    free(o->splits);
    free(o->msg);
    free(o->name);
    free(o);
    return status;
}
