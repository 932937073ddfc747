/*
 * The per-op half of the public API: local checks at enqueue, the handle table, and
 * waiting.
 *
 * Handles are generation << 32 | slot, so a stale handle after release is rejected
 * instead of aliasing a newer op. Waiters spin briefly on the op's atomic flag (a
 * small allreduce finishes within microseconds) and then block on a condition variable:
 * with 8 ranks on 2 cores, a waiter that spins steals the core its peers need.
 */
#include "negotiation.h"
#include "loop.h"
#include "p2p.h"
#include "callers.h"
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <errno.h>

/* ---- enqueue ---- */

/* A refusal that names the request as its kind's messages do: "'x': why" for a
 * collective, "send 'x': why" for a point-to-point op. */
static int refuse(const request_rules_t *k, const hvdl_request *q, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int refuse(const request_rules_t *k, const hvdl_request *q, int status, const char *fmt,
                  ...) {
    char why[HVDL_MSG_BYTES];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return k->what ? hvdl__err(status, "%s '%s': %s", k->what, q->name, why)
                   : hvdl__err(status, "'%s': %s", q->name, why);
}

/* The checks every request takes, collective or point-to-point (p2p.c), spelled once:
 * its name, its process set and this rank's place in it, and the data it carries. Called
 * with mu held (it reads the process-set table). */
int hvdl__check_common(engine_t *e, const hvdl_request *q, const request_rules_t *k,
                       int64_t *nbytes) {
    /* until the name is known good, a message names the kind alone ("send: name ...") */
    const char *kind = k->what ? k->what : "", *colon = k->what ? ": " : "";
    if (!q->name || !*q->name)
        return hvdl__err(HVDL_ERR_INVALID, "every %s needs a name", k->what ? k->what : "request");
    if (strlen(q->name) > HVDL_MAX_NAME)
        return hvdl__err(HVDL_ERR_INVALID, "%s%sname longer than %d bytes: '%.64s...'", kind, colon,
                         HVDL_MAX_NAME, q->name);
    if (q->name_len && (int64_t)strlen(q->name) != q->name_len)
        return hvdl__err(HVDL_ERR_INVALID,
                         "%s%sthe name '%s...' contains a NUL byte; names must be text "
                         "without NUL characters",
                         kind, colon, q->name);
    group_t *g = q->process_set >= 0 && q->process_set < HVDL_MAX_SETS ? e->sets[q->process_set]
                                                                       : NULL;
    if (!g || g->removed)
        return refuse(k, q, HVDL_ERR_INVALID,
                      "process set %d does not exist (was it added on every rank, or removed?)",
                      q->process_set);
    if (g->me < 0)
        return refuse(k, q, HVDL_ERR_INVALID, "rank %d is not a member of process set %d", e->rank,
                      q->process_set);
    *nbytes = 0;
    if (!k->shaped) return HVDL_OK;
    if (!hvdl_dtype_size(q->dtype))
        return refuse(k, q, HVDL_ERR_INVALID, "unknown dtype %d", q->dtype);
    if (q->ndim < 0 || q->ndim > HVDL_MAX_DIMS)
        return refuse(k, q, HVDL_ERR_INVALID, "%d dimensions; at most %d are supported", q->ndim,
                      HVDL_MAX_DIMS);
    int64_t n = hvdl_dtype_size(q->dtype);
    for (int d = 0; d < q->ndim; d++) {
        if (q->shape[d] < 0)
            return refuse(k, q, HVDL_ERR_INVALID, "negative dimension %lld",
                          (long long)q->shape[d]);
        if (q->shape[d] && n > k->max_bytes / q->shape[d])
            return k->max_bytes == INT64_MAX
                       ? refuse(k, q, HVDL_ERR_INVALID, "size overflows 64 bits")
                       : refuse(k, q, HVDL_ERR_INVALID, "more than %lld bytes",
                                (long long)k->max_bytes);
        n *= q->shape[d];
    }
    if (n && !k->buf) return refuse(k, q, HVDL_ERR_INVALID, "%s buffer is NULL", k->buf_what);
    *nbytes = n;
    return HVDL_OK;
}

/* Everything that can be checked without the other ranks: hvdl__check_common's checks,
 * then a collective's own. Called with mu held (it reads the process-set table). */
static int check_request(engine_t *e, const hvdl_request *q, int64_t *nbytes) {
    /* barrier and join move no data: their dtype and shape are never looked at */
    request_rules_t k = {NULL, q->op != HVDL_OP_BARRIER && q->op != HVDL_OP_JOIN, INT64_MAX,
                         q->input, "input"};
    int rc = hvdl__check_common(e, q, &k, nbytes);
    if (rc) return rc;
    if (q->op < 0 || q->op > HVDL_OP_JOIN)
        return hvdl__err(HVDL_ERR_INVALID, "'%s': unknown op %d", q->name, q->op);
    if (q->op == HVDL_OP_JOIN && q->process_set != 0)
        return hvdl__err(HVDL_ERR_NOT_IMPLEMENTED,
                         "'%s': join() on a process set other than the "
                         "global one is not implemented",
                         q->name);
    if (!k.shaped) return HVDL_OK;
    const group_t *g = e->sets[q->process_set];
    int64_t n = *nbytes;
    if (q->op == HVDL_OP_ALLREDUCE || q->op == HVDL_OP_REDUCESCATTER) {
        if (q->reduce_op == HVDL_ADASUM)
            return hvdl__err(HVDL_ERR_NOT_IMPLEMENTED,
                             "'%s': Adasum is not implemented in horovodlike yet", q->name);
        if (q->reduce_op < 0 || q->reduce_op > HVDL_PRODUCT)
            return hvdl__err(HVDL_ERR_INVALID, "'%s': unknown reduce op %d", q->name, q->reduce_op);
        if (q->dtype == HVDL_BOOL &&
            (q->reduce_op == HVDL_AVERAGE || q->prescale != 1.0 || q->postscale != 1.0))
            return hvdl__err(
                HVDL_ERR_INVALID,
                "'%s': bool tensors support Sum/Min/Max/Product without scaling, not Average",
                q->name);
    }
    if (q->op == HVDL_OP_REDUCESCATTER && q->reduce_op != HVDL_SUM && q->reduce_op != HVDL_AVERAGE)
        return hvdl__err(HVDL_ERR_INVALID, "'%s': reducescatter supports only Sum and Average",
                         q->name);
    int64_t out_bytes = n;
    if (q->op == HVDL_OP_REDUCESCATTER && q->ndim >= 1 && q->shape[0] > 0) /* this rank's rows */
        out_bytes = n / q->shape[0] * (q->shape[0] / g->n + (g->me < q->shape[0] % g->n));
    if ((q->op == HVDL_OP_ALLREDUCE || q->op == HVDL_OP_BROADCAST ||
         q->op == HVDL_OP_REDUCESCATTER) &&
        out_bytes && !q->output)
        return hvdl__err(HVDL_ERR_INVALID, "'%s': output buffer is NULL", q->name);
    if (q->op == HVDL_OP_BROADCAST) { /* root_rank is a global rank, as in Horovod */
        int member = 0;
        for (int i = 0; i < g->n; i++) member |= g->ranks[i] == q->root_rank;
        if (q->root_rank < 0 || q->root_rank >= e->size)
            return hvdl__err(HVDL_ERR_INVALID, "'%s': root rank %d is not in [0, %d)", q->name,
                             q->root_rank, e->size);
        if (!member)
            return hvdl__err(HVDL_ERR_INVALID,
                             "'%s': root rank %d is not a member of process set %d", q->name,
                             q->root_rank, q->process_set);
    }
    if ((q->op == HVDL_OP_ALLGATHER || q->op == HVDL_OP_ALLTOALL ||
         q->op == HVDL_OP_REDUCESCATTER) &&
        q->ndim < 1)
        return hvdl__err(HVDL_ERR_INVALID, "'%s': %s needs at least one dimension", q->name,
                         hvdl_op_name(q->op));
    if (q->op == HVDL_OP_ALLTOALL) {
        int64_t sum = 0;
        for (int i = 0; q->splits && i < g->n; i++) {
            if (q->splits[i] < 0)
                return hvdl__err(HVDL_ERR_INVALID, "'%s': negative split %lld", q->name,
                                 (long long)q->splits[i]);
            sum += q->splits[i];
        }
        if (q->splits && sum != q->shape[0])
            return hvdl__err(HVDL_ERR_INVALID,
                             "'%s': splits add up to %lld rows but the tensor has %lld", q->name,
                             (long long)sum, (long long)q->shape[0]);
        if (!q->splits && q->shape[0] % g->n)
            return hvdl__err(HVDL_ERR_INVALID,
                             "'%s': %lld rows cannot be split evenly over %d ranks; pass splits",
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
            e->free_next[i] = i + 1 < n ? i + 2 : 0; /* stored +1; 0 ends the list */
        }
        e->free_head = e->nslots + 1;
        e->nslots = n;
    }
    int slot = e->free_head - 1;
    e->free_head = e->free_next[slot];
    return slot;
}

/* With mu held: file o in the handle table. */
int hvdl__handle_new(engine_t *e, op_t *o) {
    int slot = alloc_slot(e);
    if (slot < 0) return hvdl__err(HVDL_ERR_SYSTEM, "out of memory");
    o->handle = (int64_t)e->gens[slot] << 32 | slot;
    e->slots[slot] = o;
    return HVDL_OK;
}

/* HVDL_TUNE: the one op it fits, and at the root, values the knobs can take. */
static int check_tune(const engine_t *e, const hvdl_request *q) {
    if (q->op != HVDL_OP_BROADCAST || q->dtype != HVDL_FLOAT64 || q->ndim != 1 ||
        q->shape[0] < HVDL_TUNE_VALUES || q->process_set != 0 || q->root_rank != 0)
        return hvdl__err(HVDL_ERR_INVALID,
                         "'%s': HVDL_TUNE is a broadcast from rank 0 on the global set of at "
                         "least %d float64",
                         q->name, HVDL_TUNE_VALUES);
    const char *why = e->rank == 0 ? hvdl__tune_problem((const double *)q->input) : NULL;
    return why ? hvdl__err(HVDL_ERR_INVALID, "'%s': HVDL_TUNE: %s", q->name, why) : HVDL_OK;
}

int hvdl__engine_enqueue(engine_t *e, const hvdl_request *q, int64_t *handle) {
    if (!q || !handle) return hvdl__err(HVDL_ERR_INVALID, "NULL request or handle pointer");
    if (e) hvdl__caller_posts(hvdl__caller(e)); /* this thread may submit (deadlock.c) */
    /* Point-to-point ops are agreed by their two ranks alone, on their own thread. */
    if (q->op == HVDL_OP_SEND || q->op == HVDL_OP_RECV) return hvdl__p2p_enqueue(e, q, handle);
    if (!e || !e->thread_started)
        return hvdl__err(HVDL_ERR_NOT_INITIALIZED,
                         "horovodlike has not been initialized; use hvd.init()");
    int64_t nbytes = 0;
    pthread_mutex_lock(&e->mu);
    int rc = check_request(e, q, &nbytes);
    if (!rc && (q->flags & HVDL_TUNE)) rc = check_tune(e, q);
    int set_size = rc ? 0 : e->sets[q->process_set]->n;
    pthread_mutex_unlock(&e->mu);
    if (rc) return rc;
    op_t *o = calloc(1, sizeof *o);
    if (!o || !(o->name = strdup(q->name)) ||
        (q->op == HVDL_OP_ALLTOALL && !(o->splits = copy_splits(q, set_size)))) {
        if (o) {
            free(o->name);
            free(o);
        }
        return hvdl__err(HVDL_ERR_SYSTEM, "out of memory");
    }
    /* Barrier and join move no data: their dtype and shape are never looked at. */
    int shapeless = q->op == HVDL_OP_BARRIER || q->op == HVDL_OP_JOIN;
    o->meta = (meta_t){q->op,
                       shapeless ? 0 : q->dtype,
                       q->reduce_op,
                       q->op == HVDL_OP_BROADCAST ? q->root_rank : 0,
                       q->process_set,
                       shapeless ? 0 : q->ndim,
                       {0},
                       q->prescale,
                       q->postscale};
    /* Fields an op does not use are zeroed so they never cause a false mismatch. */
    int reduces = q->op == HVDL_OP_ALLREDUCE || q->op == HVDL_OP_REDUCESCATTER;
    if (!reduces) o->meta.prescale = o->meta.postscale = 1.0;
    if (!reduces) o->meta.reduce_op = 0;
    memcpy(o->meta.shape, q->shape, sizeof(int64_t) * (size_t)o->meta.ndim);
    o->input = q->input;
    o->output = q->output;
    o->nbytes = nbytes;
    o->enqueued_at = hvdl_now();
    o->caller_waits = e->negotiation->callers_drive && (q->flags & HVDL_CALLER_WAITS);
    o->tunes = (q->flags & HVDL_TUNE) != 0;

    pthread_mutex_lock(&e->mu);
    if (e->failed) rc = hvdl__err(e->fail_status, "%s", e->fail_msg);
    else if (e->shutdown_requested || e->stopped)
        rc = e->bye_why[0] ? hvdl__err(HVDL_ERR_SHUT_DOWN,
                                       "horovodlike has been shut down (%s); '%s' came "
                                       "after that",
                                       e->bye_why, o->name)
                           : hvdl__err(HVDL_ERR_SHUT_DOWN, "horovodlike has been shut down");
    else if (strmap_get(&e->inflight, o->name))
        rc = hvdl__err(HVDL_ERR_DUPLICATE_NAME,
                       "a request named '%s' is already in flight; names must be "
                       "unique until their op completes",
                       o->name);
    int slot = rc ? -1 : alloc_slot(e);
    if (!rc && (slot < 0 || strmap_put(&e->inflight, o->name, o)))
        rc = hvdl__err(HVDL_ERR_SYSTEM, "out of memory");
    if (!rc) {
        e->enqueues++;
        e->last_enqueue_at = o->enqueued_at;
        o->handle = (int64_t)e->gens[slot] << 32 | slot;
        e->slots[slot] = o;
        hvdl__queue_push(&e->incoming, o);
    }
    pthread_mutex_unlock(&e->mu);
    if (rc) {
        free(o->name);
        free(o->splits);
        free(o);
        return rc;
    }
    /* A caller about to wait does the loop's work itself (hvdl__engine_wait): waking the
     * loop thread as well would only have it compete for the core and the work. */
    if (!o->caller_waits) hvdl__wake(e);
    *handle = o->handle;
    return HVDL_OK;
}

/* ---- handles ---- */

static op_t *lookup(engine_t *e, int64_t h) {
    uint32_t slot = (uint32_t)h, gen = (uint32_t)(h >> 32);
    if (!e || h < 0 || slot >= (uint32_t)e->nslots || e->gens[slot] != gen) return NULL;
    return e->slots[slot];
}

int hvdl__engine_poll(engine_t *e, int64_t h) {
    if (!e) return -1;
    hvdl__caller_busy(hvdl__caller(e));
    pthread_mutex_lock(&e->mu);
    op_t *o = lookup(e, h);
    int done = o ? atomic_load(&o->done) : -1;
    pthread_mutex_unlock(&e->mu);
    return done;
}

int hvdl__engine_wait(engine_t *e, int64_t h, double timeout_s) {
    if (!e) return hvdl__err(HVDL_ERR_NOT_INITIALIZED, "horovodlike has not been initialized");
    pthread_mutex_lock(&e->mu);
    op_t *o = lookup(e, h);
    pthread_mutex_unlock(&e->mu);
    caller_t *me = hvdl__caller(e);
    if (!o) {
        hvdl__caller_busy(me);
        return hvdl__err(HVDL_ERR_INVALID, "unknown or released handle %lld", (long long)h);
    }
    /* Look before sleeping, for at most spin_us (api.c: 0 where this node's ranks'
     * callers and engine threads outnumber its cores, as there the spinning caller would
     * hold the core its own engine thread needs to finish the op). Where they do but the
     * ranks alone do not, a small op's caller still looks, yielding its core at every
     * look: its wait is short, so a sleep and wake-up would be much of it, while a large
     * op's engine needs the core for the whole wait (measured: docs/benchmarks.md,
     * "Spinning counts threads; Average folded into the reduction"). */
    int yield = e->spin_us <= 0;
    int look_us = !yield ? e->spin_us : o->nbytes <= e->cfg.small_bytes ? e->shm_spin_us : 0;
    /* In a one-node job each look first does the loop's work, if the loop thread is not
     * doing it (loop.c, hvdl__drive): the op can finish here, with no wake-up at all. So
     * a large op's caller looks too: it executes the op itself when the other ranks
     * arrive, instead of waiting for the engine thread to be woken and then being woken
     * by it (measured: docs/benchmarks.md, "The waiting caller does the engine's work"). */
    if (e->negotiation->callers_drive && yield) look_us = e->shm_spin_us;
    /* A recv from a peer on this node polls the peer's mailbox (p2p.c): the message then
     * needs no engine thread of either rank, so it spins without yielding wherever every
     * local rank has a core, as a shared-memory barrier does. */
    int polls = hvdl__p2p_poll_begin(e, o);
    if (polls && e->shm_spin_us > 0) {
        yield = 0;
        look_us = e->shm_spin_us + hvdl__p2p_look_us(e, o);
    }
    double until = hvdl_now() + look_us * 1e-6;
    int drove = 0; /* a drive took the op from the incoming queue */
    int drives = e->negotiation->callers_drive;
    if (drives) hvdl__drive_enter(e);
    while (!atomic_load(&o->done)) {
        if (drives) drove |= hvdl__drive(e);
        if (polls) hvdl__p2p_poll(e, o);
        if (atomic_load(&o->done) || hvdl_now() >= until) break;
        if (yield) sched_yield();
        else
            for (int k = 0; k < 32; k++) hvdl_pause();
    }
    if (drives) hvdl__drive_leave(e);
    if (polls) hvdl__p2p_poll_end(e, o);
    if (atomic_load(&o->done)) {
        hvdl__caller_busy(me);
        return HVDL_OK;
    }
    /* Not done: the loop thread takes over. It was not woken for a flagged op, and may
     * have gone to sleep without seeing it. */
    if (o->caller_waits && !drove) hvdl__wake(e);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double end = ts.tv_sec + ts.tv_nsec * 1e-9 + (timeout_s < 0 ? 1e9 : timeout_s);
    ts.tv_sec = (time_t)end;
    ts.tv_nsec = (long)((end - (double)ts.tv_sec) * 1e9);
    int rc = 0;
    pthread_mutex_lock(&e->mu);
    /* a caller asleep on its op: what deadlock.c looks for (off the fast path). The loop
     * ticks the deadlock check while callers sleep (hvdl__deadlock_ms); a collective in
     * flight keeps it ticking, a point-to-point op does not, so that op's sleeper wakes
     * it when it is the first: the loop may be asleep without a timeout. */
    hvdl__caller_sleeps(e, me, o, timeout_s, hvdl_now());
    if (!atomic_fetch_add(&e->waiters, 1) && o->meta.op >= HVDL_OP_SEND) hvdl__wake(e);
    while (!atomic_load(&o->done) && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&e->done_cv, &e->mu, &ts);
    atomic_fetch_sub(&e->waiters, 1);
    int done = atomic_load(&o->done);
    hvdl__caller_woke(me, o);
    pthread_mutex_unlock(&e->mu);
    return done ? HVDL_OK
                : hvdl__err(HVDL_ERR_TIMEOUT, "op '%s' not finished after %.1f s", o->name,
                            timeout_s);
}

int hvdl__engine_release(engine_t *e, int64_t h, char *msg, hvdl_result *result) {
    if (!e) return hvdl__err(HVDL_ERR_INVALID, "unknown handle %lld", (long long)h);
    pthread_mutex_lock(&e->mu);
    op_t *o = lookup(e, h);
    if (!o || !atomic_load(&o->done)) {
        pthread_mutex_unlock(&e->mu);
        return hvdl__err(HVDL_ERR_INVALID,
                         o ? "handle %lld is still in flight" : "unknown or released handle %lld",
                         (long long)h);
    }
    uint32_t slot = (uint32_t)h;
    e->slots[slot] = NULL;
    e->gens[slot]++;
    e->free_next[slot] = e->free_head;
    e->free_head = (int)slot + 1;
    pthread_mutex_unlock(&e->mu);
    int status = o->status;
    /* A failed op always says why: its message was copied when it completed, and where
     * that copy found no memory, the engine's cause stands in (or the status's name). */
    if (msg && (o->msg || status == HVDL_OK))
        snprintf(msg, HVDL_MSG_BYTES, "%s", o->msg ? o->msg : "");
    else if (msg)
        snprintf(msg, HVDL_MSG_BYTES, "%s", e->failed ? e->fail_msg : hvdl_status_name(status));
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

/* ---- the three in one call ---- */

/* Enqueue, wait and release, for a caller that blocks on the op at once (hvdl_run).
 * Cost model: the same engine work as the three calls (their handle-table lookups under
 * mu, the wait's spin-then-block), saving the caller two crossings of its language
 * boundary; from Python each crossing costs about as much as the engine's own part of a
 * small p2p message, and a recv's caller reaches its polling wait right after posting
 * (docs/benchmarks.md, "One call a message"). The request is copied (a few hundred
 * bytes on the stack) to set the buffers and HVDL_CALLER_WAITS: the caller's stays
 * untouched, so one filled-in request serves every call. */
int hvdl__engine_run(engine_t *e, const hvdl_request *q, const void *input, void *output,
                     double timeout_s, int64_t *handle, char *msg, hvdl_result *result) {
    if (!q || !handle) return hvdl__err(HVDL_ERR_INVALID, "NULL request or handle pointer");
    *handle = 0;
    hvdl_request r = *q;
    r.input = input;
    r.output = output;
    r.flags |= HVDL_CALLER_WAITS;
    int64_t h = 0;
    int rc = hvdl__engine_enqueue(e, &r, &h);
    if (rc == HVDL_OK) rc = hvdl__engine_wait(e, h, timeout_s);
    else h = 0; /* nothing was queued */
    if (rc == HVDL_OK) return hvdl__engine_release(e, h, msg, result);
    /* Refused, or (HVDL_ERR_TIMEOUT) still in flight: its handle goes back to the caller,
     * who waits for it and releases it as any other. The message is hvdl_last_error()'s. */
    *handle = h;
    if (msg) snprintf(msg, HVDL_MSG_BYTES, "%s", hvdl_last_error());
    if (result) memset(result, 0, sizeof *result);
    return rc;
}
