/*
 * Negotiation through the segment: a job whose ranks are all on one node agrees on its
 * cached requests in shared memory, without a round trip through rank 0.
 *
 * Through rank 0 (coordinator.c) a repeated request costs a worker's frame to rank 0,
 * rank 0's wake-up and plan, and a response frame back to every worker, whose engine
 * thread must wake again before the data moves. Here:
 *
 *   arrival   each cache id has an arrival word: one bit per local rank, a round count
 *             and CLOSED. A rank announcing a request equal to its cache entry sets its
 *             bit with one compare-and-swap; the rank whose swap completes the mask
 *             clears it and counts the round in the same swap, so exactly one rank sees
 *             the request complete.
 *   order     that rank appends the id (fused with the others it completed in the same
 *             announcement, by fusion.c's rule) to the response log, a ring of entries
 *             that every local rank executes in order. Rank 0's planned responses take
 *             entries of the same log (their content still travels as frames: an entry
 *             only marks where each falls), so both paths share one order, the one
 *             thing every rank must agree on.
 *   wake-up   a rank whose loop sleeps is woken by its doorbell (platform.h), rung only
 *             when its flag says it sleeps (a Dekker pair with the log's stamps).
 *
 * Everything rank 0 checks still holds, because rank 0 takes over an id whenever it is
 * involved: when a request for a cached name reaches the coordinator (a full request,
 * whose metadata changed; a bit sent because the word was closed), the word closes and
 * the bits already posted come back to the coordinator, which records them as requests
 * of their ranks (close_id; took_t, negotiation.h). A mismatch is then reported naming
 * the ranks, as before. Rank 0's stall check takes over a word that stays partly set in
 * one round for the stall warning time (dating the stall from when it first saw it), so
 * the stall inspector warns, names the missing ranks and shuts down as before. A join closes every word
 * until the join ends (the joined rank never posts, and only rank 0 knows to contribute
 * its zeros). A word reopens when its response is planned. A rank's view of a name's cache entry is always
 * current when it posts (an entry changes only through a response for that name, which
 * the rank executed before it could submit the name again), so a bit means the same to
 * every rank and to rank 0.
 *
 * Cost of a repeated small op, L local ranks: one CAS per rank on the id's word, one
 * fetch-add on the log's tail and an entry write by the last rank, and at most one
 * doorbell (a tgkill, a few microseconds) per sleeping rank per entry; no system call
 * at all when every rank's loop, or a caller waiting for its op (loop.c, hvdl__drive),
 * is looking. Rank 0's stall scan reads min(cache size, 4096) words once a second.
 *
 * Negotiation decides, execution executes: the log says what runs next, and exec.c runs
 * it (hvdl__execute for rank 0's responses, hvdl__execute_cached for ids agreed here).
 * The log itself, its ring and the entries waiting for room, is negotiate_shm_log.c's.
 */
#include "loop.h"
#include "fail.h"
#include "wire.h"
#include "shm.h"
#include "negotiation.h"
#include "negotiate_shm.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t hvdl__neg_bytes(int nlocal) {
    return (size_t)LINE * (size_t)(nlocal + 1) + 8 * (size_t)NEG_IDS +
           sizeof(neg_entry_t) * NEG_LOG + sizeof(double) * NEG_IDS * (size_t)nlocal;
}

extern const negotiation_t hvdl__negotiate_shm;

int hvdl__negotiate_shm_open(engine_t *e) {
    hvdl_shm_t *s = e->shm;
    if (!s || !e->cfg.shm_negotiate || s->nlocal != e->size || e->size > HVDL_NEG_MAX_RANKS)
        return 0;
    if (hvdl_doorbell_install())
        return hvdl__fail_job(
            e, HVDL_ERR_SYSTEM,
            "cannot negotiate in shared memory: signal SIGRTMIN+7 "
            "already has a handler in this process; set HOROVODLIKE_SHM_NEGOTIATE=0 on every rank");
    struct neg *n = calloc(1, sizeof *n);
    if (!n || (e->rank == 0 &&
               (!(n->scan.seen = calloc(NEG_IDS, 8)) || !(n->scan.seen_at = calloc(NEG_IDS, 8))))) {
        if (n) free(n->scan.seen);
        free(n);
        return hvdl__oom(e, "shared-memory negotiation", (int64_t)sizeof *n + 8 * NEG_IDS);
    }
    uint8_t *a = hvdl__shm_neg_area(s);
    n->ranks = (neg_rank_t *)a;
    n->tail = (_Atomic uint64_t *)(a + (size_t)LINE * (size_t)s->nlocal);
    n->arrive = (_Atomic uint64_t *)(a + (size_t)LINE * (size_t)(s->nlocal + 1));
    n->log = (neg_entry_t *)(a + (size_t)LINE * (size_t)(s->nlocal + 1) + 8 * (size_t)NEG_IDS);
    n->posted_at = (double *)(n->log + NEG_LOG);
    n->nlocal = s->nlocal;
    n->me = s->me;
    e->neg = n;
    e->negotiation = &hvdl__negotiate_shm;
    return 1;
}

static void neg_free(engine_t *e) {
    struct neg *n = e->neg;
    for (int i = n->qhead; i < n->qlen; i++) hvdl__response_free(&n->q[i]);
    free(n->q);
    free(n->defer);
    free(n->scan.seen);
    free(n->scan.seen_at);
    free(n);
    e->neg = NULL;
}

/* The loop thread, as it starts: its doorbell, and ppoll's mask (net.c). */
static void thread_start(engine_t *e) {
    struct neg *n = e->neg;
    hvdl_doorbell_block(&n->sleep_mask);
    e->poll_mask = &n->sleep_mask;
    atomic_store(&n->ranks[n->me].pid, (int32_t)getpid());
    atomic_store(&n->ranks[n->me].tid, (int32_t)hvdl_gettid());
}

/* The loop thread, as it ends. */
static void thread_end(engine_t *e) {
    struct neg *n = e->neg;
    atomic_store(&n->ranks[n->me].tid, 0);
    hvdl__log(e, HVDL_LOG_DEBUG,
              "rank %d agreed on %lld tensors in shared memory and executed %lld "
              "responses planned by rank 0; waiting callers executed %lld log entries",
              e->rank, (long long)n->fast, (long long)n->planned, (long long)n->by_callers);
}

/* ---- announcing ---- */

static int post(engine_t *e, int id) {
    struct neg *n = e->neg;
    if (id < 0 || id >= NEG_IDS) return 0;
    uint64_t bit = 1ull << n->me, full = (1ull << n->nlocal) - 1;
    _Atomic uint64_t *w = &n->arrive[id];
    /* For rank 0's trace (ready_us). Published by the CAS below; read by rank 0 before
     * it executes the entry, which this rank cannot finish, and so cannot post the next
     * round, before rank 0 starts it (a data-less barrier's time may be a round late). */
    n->posted_at[(size_t)id * (size_t)n->nlocal + (size_t)n->me] = hvdl_now();
    uint64_t old = atomic_load(w);
    for (;;) {
        if (old & CLOSED) return 0;
        int last = ((old & MASK) | bit) == full;
        uint64_t now = last ? ((old & ROUND) + ROUND_ONE) & ROUND : old | bit;
        if (atomic_compare_exchange_weak(w, &old, now)) return last ? 2 : 1;
    }
}

/* The ids this rank completed, fused by fusion.c's rule into log entries. */
static int complete(engine_t *e, const int *ids, int k, took_t *t) {
    neg_entry_t ent;
    for (int i = 0; i < k;) {
        memset(&ent, 0, sizeof ent);
        ent.kind = NEG_CACHED;
        const meta_t *first = &e->cache[ids[i]].meta;
        int64_t bytes = hvdl__meta_bytes(first);
        ent.u.ids[ent.n++] = ids[i++];
        while (i < k && ent.n < NEG_MAX_IDS &&
               hvdl__fuses(e, first, &e->cache[ids[i]].meta, &bytes))
            ent.u.ids[ent.n++] = ids[i++];
        if (hvdl__neg_shm_append(e, &ent)) return -1;
    }
    return 0;
}

/* ---- rank 0's side ---- */

/* Rank 0 takes the id over: its posted bits come back in t, dated `since` (0: not). */
static int close_id(engine_t *e, int id, double since, took_t *t) {
    struct neg *n = e->neg;
    if (id < 0 || id >= NEG_IDS || id >= e->ncache) return 0;
    /* A post's CAS either came first (its bit is in old, or it completed the word, and
     * then old has no bits and its entry is in the log) or fails and finds CLOSED. */
    uint64_t old = atomic_fetch_or(&n->arrive[id], CLOSED) & MASK;
    atomic_fetch_and(&n->arrive[id], ~MASK);     /* only rank 0 changes a closed word */
    for (int q = 0; q < n->nlocal; q++)          /* one node: local index = rank */
        if ((old >> q & 1) && hvdl__took_add(e, t, q, id, since)) return -1;
    return since > 0 && !old ? hvdl__took_add(e, t, -1, id, since) : 0;
}

/* A request for p's name reached the coordinator: the first one takes the word over. */
static int close_request(engine_t *e, int from, pending_t *p, const meta_t *m, took_t *t) {
    return p->count ? 0 : close_id(e, hvdl__cache_lookup(e, p->name), 0, t);
}

static int close_all(engine_t *e, took_t *t) {
    struct neg *n = e->neg;
    n->join_closed = 1;
    for (int id = 0; id < e->ncache && id < NEG_IDS; id++)
        if (close_id(e, id, 0, t)) return -1;
    return 0;
}

static void reopen(struct neg *n, int id) { atomic_fetch_and(&n->arrive[id], ~CLOSED); }

static int settle(engine_t *e, const response_t *r, int joined, took_t *t) {
    struct neg *n = e->neg;
    for (int i = 0; i < r->ntensors; i++) {
        int id = hvdl__cache_lookup(e, r->names[i]);
        if (id < 0 || id >= NEG_IDS) continue;
        if (joined) {                 /* a new id, or a word some rank has just posted to */
            if (close_id(e, id, 0, t)) return -1;
        } else {
            reopen(n, id);
        }
    }
    if (!joined && n->join_closed) {  /* the join has ended: every word not in use reopens */
        n->join_closed = 0;
        for (int id = 0; id < e->ncache && id < NEG_IDS; id++)
            if (!strmap_get(&e->coord->pending, e->cache[id].name)) reopen(n, id);
    }
    return 0;
}

/* Rank 0: r's place in the log. */
static int order(engine_t *e, const response_t *r) {
    const group_t *g = e->sets[r->meta.process_set];
    neg_entry_t ent = {.kind = NEG_COORD, .n = r->meta.process_set};
    for (int i = 0; g && i < g->n; i++) ent.u.members |= 1ull << g->ranks[i];
    return hvdl__neg_shm_append(e, &ent);
}

/* A word stuck partly set: rank 0 takes it over, dated from when it first saw it. */
static int stuck(engine_t *e, int id, uint64_t w, double since, double now, took_t *t) {
    return close_id(e, id, since, t);
}

static int stall_scan(engine_t *e, double now, took_t *t) {
    struct neg *n = e->neg;
    return hvdl__words_scan(e, &n->scan, n->arrive, now, hvdl__stall_after(e), stuck, t);
}

static int watches(engine_t *e) { return e->rank == 0; }

/* ---- executing the log ---- */

/* Responses from rank 0 wait for their place in the log. */
static int queue(engine_t *e, response_t *r) {
    struct neg *n = e->neg;
    if (n->qhead == n->qlen) n->qhead = n->qlen = 0;
    if (hvdl__neg_shm_grow(e, (void **)&n->q, &n->qcap, n->qlen, sizeof *n->q, "response queue"))
        return -1;
    n->q[n->qlen++] = *r;
    memset(r, 0, sizeof *r);             /* the queue owns it now */
    return 0;
}

/* Rank 0 orders each response it planned in the log (mine: it runs it too); a worker's
 * waits there for its place. */
static int place(engine_t *e, response_t *r, int mine) {
    if (e->rank == 0 && order(e, r)) return -1;
    return mine && queue(e, r) ? -1 : 1;
}

/* The entry at n->next if this rank can execute it now, else NULL. */
static const neg_entry_t *next_entry(engine_t *e) {
    struct neg *n = e->neg;
    const neg_entry_t *s = &n->log[n->next % NEG_LOG];
    if (atomic_load_explicit(&s->stamp, memory_order_acquire) != n->next + 1) return NULL;
    if (s->kind == NEG_COORD && (s->u.members >> e->rank & 1) && n->qhead == n->qlen)
        return NULL;                     /* its response frame has not arrived yet */
    return s;
}

/* Execute entries in order while there are any this rank can execute, up to entry
 * `until` (excluded). */
static int run_until(engine_t *e, uint64_t until) {
    struct neg *n = e->neg;
    const neg_entry_t *s;
    if (n->ndefer) hvdl__neg_shm_publish(n);
    while (n->next < until && (s = next_entry(e))) {
        neg_entry_t ent = {.kind = s->kind, .n = s->n, .u = s->u};
        int rc = 0;
        if (ent.kind == NEG_COORD && (ent.u.members >> e->rank & 1)) {
            response_t r = n->q[n->qhead++];
            n->planned++;
            rc = hvdl__execute(e, &r);
            hvdl__response_free(&r);
        } else if (ent.kind == NEG_CACHED && ent.n >= 1 && ent.n <= NEG_MAX_IDS) {
            n->fast += ent.n;
            rc = hvdl__execute_cached(e, ent.u.ids, ent.n, e->rank == 0 ? n->posted_at : NULL);
        } else if (ent.kind != NEG_COORD) {
            rc = hvdl__fail_job(e, HVDL_ERR_SYSTEM,
                                "the shared-memory negotiation log holds a malformed "
                                "entry (kind %d, %d tensors)",
                                ent.kind, ent.n);
        }
        if (!pthread_equal(pthread_self(), e->thread)) n->by_callers++;
        n->next++;
        atomic_store_explicit(&n->ranks[n->me].consumed, n->next, memory_order_release);
        if (rc) return -1;
        if (n->ndefer) hvdl__neg_shm_publish(n);
    }
    return 0;
}

static int run(engine_t *e) { return run_until(e, UINT64_MAX); }

static uint64_t position(engine_t *e) {
    struct neg *n = e->neg;
    return n->next;
}

/* A worker stopped by rank 0, which had executed the log up to `pos`: what rank 0 has
 * executed, this rank has too, except what needs no peer (a barrier's entry) or does
 * not involve rank 0 (a set without it, whose members all come here). Those run now,
 * so that an op finished on rank 0 before the shutdown is finished everywhere. */
static int finish_to(engine_t *e, uint64_t pos) { return run_until(e, pos); }

/* ---- sleeping, and a caller watching instead ----
 *
 * The segment's flag `sleeping` means: nobody on this rank watches the log, ring the
 * doorbell. The loop raises it as it goes to sleep; a caller that drives the loop's work
 * (hvdl__drive, loop.c) lowers it while it watches, and on leaving raises it again if
 * the loop still sleeps, waking the loop itself if work came meanwhile. All of these run
 * with e->drive held; only the doorbell's ring reads the flag from outside. */

static int sleep_begin(engine_t *e) {
    struct neg *n = e->neg;
    n->loop_asleep = 1;
    if (atomic_load(&e->watchers)) return 0;        /* a caller watches the log (loop.c) */
    atomic_store(&n->ranks[n->me].sleeping, 1);     /* seq_cst: before reading the log */
    if (!next_entry(e)) return 0;
    atomic_store(&n->ranks[n->me].sleeping, 0);
    n->loop_asleep = 0;
    return 1;
}

static void sleep_end(engine_t *e) {
    struct neg *n = e->neg;
    n->loop_asleep = 0;
    atomic_store(&n->ranks[n->me].sleeping, 0);
}

static void watch_begin(engine_t *e) {
    struct neg *n = e->neg;
    atomic_store(&n->ranks[n->me].sleeping, 0);
}

/* 1 if the loop sleeps and has work it does not know of: the caller wakes it. */
static int watch_end(engine_t *e) {
    struct neg *n = e->neg;
    if (!n->loop_asleep) return 0;
    atomic_store(&n->ranks[n->me].sleeping, 1);     /* seq_cst: before reading the log */
    return next_entry(e) || n->ndefer;
}

/* Without e->drive (the loop's look before sleeping, net.c): an entry is published past
 * what this rank has executed. It may be one that waits for its response frame, so it
 * only ends the look, never the sleep that reads the frame. */
static int has_work(engine_t *e) {
    struct neg *n = e->neg;
    uint64_t next = atomic_load_explicit(&n->ranks[n->me].consumed, memory_order_acquire);
    return atomic_load_explicit(&n->log[next % NEG_LOG].stamp, memory_order_acquire) == next + 1;
}

static int deferred(engine_t *e) {
    struct neg *n = e->neg;
    return n->ndefer;
}

const negotiation_t hvdl__negotiate_shm = {
    .name = "one node's segment",
    .free = neg_free,
    .thread_start = thread_start,
    .thread_end = thread_end,
    .post = post,
    .complete = complete,
    .withdraw = hvdl__neg_withdraw_none,      /* a joined rank's bits are taken at its join */
    .close = close_request,
    .join = close_all,
    .settle = settle,
    .stall_scan = stall_scan,
    .before_stall = hvdl__neg_before_stall_none,
    .scan = hvdl__neg_scan_none,
    .watches = watches,
    .applied = hvdl__neg_applied_none,
    .place = place,
    .run = run,
    .deferred = deferred,
    .position = position,
    .finish_to = finish_to,
    .frame = hvdl__neg_refuse_frame,
    .callers_drive = 1,
    .sleep_begin = sleep_begin,
    .sleep_end = sleep_end,
    .has_work = has_work,
    .watch_begin = watch_begin,
    .watch_end = watch_end,
};
