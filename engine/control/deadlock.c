/*
 * Deadlock detection: ops that can never match end the job within seconds, with both
 * halves of the mismatch in one message ("rank 0 waits in allreduce 'a' while rank 1
 * waits in allreduce 'b'"), instead of a per-op stall warning a minute later.
 *
 * A rank is *blocked* when a caller has waited on one of its ops (hvdl_wait past its
 * spin, ops.c) for at least BLOCKED_S and the rank has enqueued nothing since. A blocked
 * rank will submit nothing more until one of the ops it waits on finishes. An op can
 * finish only when every member of its process set has submitted it (a rank that has
 * joined counts as present for allreduce). So, with D the blocked ranks:
 *   repeat: drop from D every rank that waits on an op which no member of D lacks
 *   (the members outside D may still submit it, or all have and it will run);
 * what is left of D can never go on: that is a deadlock, and the job fails with a
 * message naming what each of those ranks waits in, and same-named ops that differ in
 * kind across them ("'k' is an allreduce on rank 0 and an allgather on rank 1"). A rank
 * that is busy elsewhere (computing, sleeping) is not blocked, so a stall it causes is
 * left to stall.c (HOROVOD_STALL_CHECK_TIME_SECONDS, HOROVOD_STALL_SHUTDOWN_TIME_SECONDS).
 * The verdict is the whole job's only if the same D, with the same enqueue counts, holds
 * for STABLE_S: a report that a rank has just been unblocked may be on its way.
 *
 * Where the facts come from: each rank's own view of its ops (the in-flight table, under
 * mu), not rank 0's negotiation state, so ops agreed in a segment (negotiate_shm.c,
 * negotiate_nodes.c) count exactly as those agreed by the coordinator.
 *
 * Cost model: on the hot path, one counter and one timestamp stored under the lock that
 * enqueue already holds, and in a wait that outlasts its spin one store before sleeping.
 * Every TICK_S, while this rank has ops in flight, the loop reads one atomic (callers
 * waiting); only when a caller has been blocked for BLOCKED_S does it snapshot its ops
 * and send rank 0 one MSG_WAITS frame (again only when that snapshot changes, and once
 * more when it is unblocked). Rank 0's analysis is O(ranks^2 x ops), run only while some
 * rank reports itself blocked.
 */
#include "fail.h"
#include "control.h"
#include "net.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TICK_S 0.5          /* how often a rank looks at its callers */
/* A rank whose other thread computes for longer than BLOCKED_S + STABLE_S before it
 * submits what another rank waits for, while its own caller waits on something else,
 * looks blocked: these are sized well above a step's gap between ops, and the verdict
 * still comes within seconds. */
#define BLOCKED_S 2.0       /* a caller waiting this long, with nothing enqueued since */
#define STABLE_S 1.5        /* the same deadlock seen this long is the verdict */
#define MAX_ENTRIES 4096    /* ops one report carries (more: partial, proves nothing) */
#define MAX_NAME 4096       /* longest name a report carries */

typedef struct wait_entry {
    char *name;
    int32_t op, set;
    uint8_t waited;
} wait_entry_t;

/* One rank's view of its unfinished ops, as of a moment. */
typedef struct wait_report {
    int have;                /* a report has arrived (rank 0) */
    int partial;             /* too many ops to list: this rank never counts as blocked */
    uint64_t enqueues;
    double blocked_for;      /* < 0: not blocked */
    int n;
    wait_entry_t *ops;
} wait_report_t;

struct deadlock {
    double next_tick;
    int reported;            /* this rank told rank 0 it is blocked */
    uint64_t sent_enqueues;  /* what that report said, to resend only on change */
    int sent_waited;
    wait_report_t *reports;  /* rank 0: per rank */
    uint8_t *cycle;          /* rank 0: the deadlocked ranks last seen */
    uint64_t *cycle_enqueues;
    double cycle_since;
};

static void report_clear(wait_report_t *w) {
    for (int i = 0; i < w->n; i++) free(w->ops[i].name);
    free(w->ops);
    memset(w, 0, sizeof *w);
}

void hvdl__deadlock_free(engine_t *e) {
    struct deadlock *d = e->dl;
    if (!d) return;
    for (int r = 0; d->reports && r < e->size; r++) report_clear(&d->reports[r]);
    free(d->reports);
    free(d->cycle);
    free(d->cycle_enqueues);
    free(d);
    e->dl = NULL;
}

static struct deadlock *state(engine_t *e) {
    if (e->dl) return e->dl;
    struct deadlock *d = HVDL_INJECT(e, INJ_DEADLOCK_ALLOC) ? NULL : calloc(1, sizeof *d);
    if (!d) return NULL;
    e->dl = d;
    if (e->rank == 0 && (!(d->reports = calloc((size_t)e->size, sizeof *d->reports)) ||
                         !(d->cycle = calloc((size_t)e->size, 1)) ||
                         !(d->cycle_enqueues = calloc((size_t)e->size, 8)))) {
        hvdl__deadlock_free(e);
        return NULL;
    }
    return d;
}

/* This rank's unfinished ops (under mu). Returns the number of waited-on ones. */
static int snapshot(engine_t *e, double now, wait_report_t *w) {
    memset(w, 0, sizeof *w);
    w->blocked_for = -1;
    int waited = 0;
    pthread_mutex_lock(&e->mu);
    w->enqueues = e->enqueues;
    double since = 0;
    int cap = e->inflight.count < MAX_ENTRIES ? e->inflight.count : MAX_ENTRIES;
    w->ops = cap ? calloc((size_t)cap, sizeof *w->ops) : NULL;
    for (int i = 0; w->ops && i < e->inflight.cap; i++) {
        op_t *o = e->inflight.vals ? e->inflight.vals[i] : NULL;
        if (!o || atomic_load(&o->done)) continue;
        if (w->n == cap || strlen(o->name) > MAX_NAME) {
            w->partial = 1;
            break;
        }
        wait_entry_t *x = &w->ops[w->n];
        if (!(x->name = strdup(o->name))) {
            w->partial = 1;
            break;
        }
        x->op = o->meta.op;
        x->set = o->meta.process_set;
        x->waited = o->wait_since > 0;
        w->n++;
        if (x->waited && (!waited++ || o->wait_since < since)) since = o->wait_since;
    }
    if (cap && !w->ops) w->partial = 1;
    if (waited) w->blocked_for = now - (since > e->last_enqueue_at ? since : e->last_enqueue_at);
    pthread_mutex_unlock(&e->mu);
    return waited;
}

/* Wire: u64 enqueues, f64 blocked_for, u8 partial, u32 n, n x (i32 op, i32 set, u8
 * waited, string name). */
static int send_report(engine_t *e, const wait_report_t *w) {
    buf_t b = {0};
    uint8_t partial = (uint8_t)w->partial;
    uint32_t n = (uint32_t)w->n;
    int rc = buf_put(&b, &w->enqueues, 8) || buf_put(&b, &w->blocked_for, 8) ||
             buf_put(&b, &partial, 1) || buf_put_u32(&b, n);
    for (int i = 0; !rc && i < w->n; i++)
        rc = buf_put(&b, &w->ops[i].op, 4) || buf_put(&b, &w->ops[i].set, 4) ||
             buf_put(&b, &w->ops[i].waited, 1) || buf_put_str(&b, w->ops[i].name);
    if (!rc) rc = hvdl__send_frame(e, 0, MSG_WAITS, b.data, b.len);
    buf_free(&b);
    return rc;
}

int hvdl__deadlock_take(engine_t *e, int from, const uint8_t *p, int64_t len) {
    struct deadlock *d = state(e);
    if (!d) return hvdl__oom(e, "wait report", len);
    wait_report_t w = {0};
    reader_t r = {.p = p, .left = len};
    uint8_t partial = 0;
    rd_get(&r, &w.enqueues, 8);
    rd_get(&r, &w.blocked_for, 8);
    rd_get(&r, &partial, 1);
    uint32_t n = rd_u32(&r);
    w.partial = partial != 0;
    if (!r.bad && n > MAX_ENTRIES) rd_fail(&r, "it lists more ops than a report may");
    if (!r.bad && n && (HVDL_INJECT(e, INJ_WAIT_ALLOC) || !(w.ops = calloc(n, sizeof *w.ops))))
        return hvdl__oom(e, "wait report", (int64_t)n * (int64_t)sizeof *w.ops);
    for (uint32_t i = 0; !r.bad && i < n; i++) {
        wait_entry_t *x = &w.ops[i];
        rd_get(&r, &x->op, 4);
        rd_get(&r, &x->set, 4);
        rd_get(&r, &x->waited, 1);
        if (!r.bad && (x->op < 0 || x->op > HVDL_OP_JOIN || x->set < 0 || x->set >= HVDL_MAX_SETS))
            rd_fail(&r, "an op kind or process set out of range");
        if (!r.bad && !(x->name = rd_str(&r))) break;
        w.n++;
    }
    if (!r.bad && r.left) rd_fail(&r, "bytes after its last field");
    if (r.bad) {
        report_clear(&w); /* no memory for a name is this rank's failure, not the sender's */
        return r.oom ? hvdl__oom(e, r.why, r.oom_bytes)
                     : hvdl__malformed(e, from, "wait report", r.why);
    }
    w.have = 1;
    report_clear(&d->reports[from]);
    d->reports[from] = w;
    return 0;
}

/* ---- rank 0: the analysis ---- */

/* The collectives: the op types before HVDL_OP_SEND. */
static const char *const OPS[] = {[HVDL_OP_ALLREDUCE] = "allreduce",
                                  [HVDL_OP_ALLGATHER] = "allgather",
                                  [HVDL_OP_BROADCAST] = "broadcast",
                                  [HVDL_OP_BARRIER] = "barrier",
                                  [HVDL_OP_ALLTOALL] = "alltoall",
                                  [HVDL_OP_REDUCESCATTER] = "reducescatter",
                                  [HVDL_OP_JOIN] = "join"};
static const char *const A_OPS[] = {[HVDL_OP_ALLREDUCE] = "an allreduce",
                                    [HVDL_OP_ALLGATHER] = "an allgather",
                                    [HVDL_OP_BROADCAST] = "a broadcast",
                                    [HVDL_OP_BARRIER] = "a barrier",
                                    [HVDL_OP_ALLTOALL] = "an alltoall",
                                    [HVDL_OP_REDUCESCATTER] = "a reducescatter",
                                    [HVDL_OP_JOIN] = "a join"};
_Static_assert(sizeof OPS / sizeof OPS[0] == HVDL_OP_SEND, "a collective without a name");
_Static_assert(sizeof A_OPS / sizeof A_OPS[0] == HVDL_OP_SEND, "a collective without a name");

/* The name the user gave: the bindings negotiate "<kind>.<name>", with "@set<id>" on
 * a process set's ops (request.py). Into out, without the set suffix. */
static const char *user_name(const wait_entry_t *x, char *out, size_t cap) {
    const char *dot = strchr(x->name, '.'), *kind = strstr(x->name, OPS[x->op]);
    const char *s = dot && kind && kind < dot ? dot + 1 : x->name;
    size_t n = strlen(s);
    const char *at = strrchr(s, '@');
    if (at && !strncmp(at, "@set", 4) && x->set) n = (size_t)(at - s);
    snprintf(out, cap, "%.*s", (int)n, s);
    return out;
}

/* "allreduce 'a'", "allreduce 'a' in process set 1", "barrier" (its name is its kind) */
static void describe(const wait_entry_t *x, char *out, size_t cap) {
    char u[256];
    user_name(x, u, sizeof u);
    int k = strcmp(u, OPS[x->op]) ? snprintf(out, cap, "%s '%s'", OPS[x->op], u)
                                  : snprintf(out, cap, "%s", OPS[x->op]);
    if (x->set && k < (int)cap) snprintf(out + k, cap - (size_t)k, " in process set %d", x->set);
}

void hvdl__describe_request(const char *name, int op, int set, char *out, size_t cap) {
    wait_entry_t x = {(char *)name, op, set, 0};
    describe(&x, out, cap);
}

static int submitted(const wait_report_t *w, const wait_entry_t *x) {
    for (int i = 0; i < w->n; i++)
        if (!strcmp(w->ops[i].name, x->name) ||
            (x->op == HVDL_OP_ALLREDUCE && w->ops[i].op == HVDL_OP_JOIN && w->ops[i].set == 0))
            return 1;
    return 0;
}

/* x cannot finish while the ranks in D stay blocked: a member of its set in D lacks it. */
static int stuck(engine_t *e, const uint8_t *in, const wait_entry_t *x) {
    const group_t *g = e->sets[x->set];
    if (!g) return 0; /* rank 0 has not registered it: unknown */
    for (int i = 0; i < g->n; i++)
        if (in[g->ranks[i]] && !submitted(&e->dl->reports[g->ranks[i]], x)) return 1;
    return 0;
}

static void fail_deadlock(engine_t *e, const uint8_t *in) {
    wait_report_t *rep = e->dl->reports;
    char msg[HVDL_MSG_BYTES];
    int k = snprintf(msg, sizeof msg, "deadlock: ");
    int shown = 0, nin = 0;
    for (int r = 0; r < e->size; r++) nin += in[r];
    for (int r = 0; r < e->size && k < (int)sizeof msg - 200; r++) {
        if (!in[r]) continue;
        for (int i = 0; i < rep[r].n; i++) {
            const wait_entry_t *x = &rep[r].ops[i];
            if (!x->waited) continue;
            const char *sep = !shown ? "" : shown == nin - 1 && nin == 2 ? " while " : ", ";
            char what[300];
            describe(x, what, sizeof what);
            k += snprintf(msg + k, sizeof msg - (size_t)k, "%srank %d waits in %s", sep, r, what);
            shown++;
            break;
        }
    }
    k += snprintf(msg + k, sizeof msg - (size_t)k,
                  "; none of them can go on: each waits for an "
                  "op that the others have not submitted and, blocked, never will.");
    /* the same name, different kinds of op: the two halves of one mistake */
    for (int r = 0; r < e->size; r++)
        for (int m = r + 1; in[r] && m < e->size; m++)
            for (int i = 0; in[m] && i < rep[r].n; i++)
                for (int j = 0; j < rep[m].n && k < (int)sizeof msg - 200; j++) {
                    const wait_entry_t *x = &rep[r].ops[i], *y = &rep[m].ops[j];
                    char ux[256], uy[256];
                    if (x->op == y->op ||
                        strcmp(user_name(x, ux, sizeof ux), user_name(y, uy, sizeof uy)))
                        continue;
                    k += snprintf(msg + k, sizeof msg - (size_t)k,
                                  " '%s' is %s on rank %d and %s on rank %d.", ux, A_OPS[x->op], r,
                                  A_OPS[y->op], m);
                }
    if (k < (int)sizeof msg - 120)
        snprintf(msg + k, sizeof msg - (size_t)k,
                 " Every rank must submit the same ops, with the "
                 "same names, in each process set.");
    hvdl__log(e, HVDL_LOG_ERROR, "%s", msg);
    /* told first, as stall.c does: a caller woken by the failure may end the process */
    for (int w = 1; w < e->size; w++)
        if (e->peers[w].ctrl.fd >= 0 && !e->peers[w].ctrl.eof)
            hvdl__send_frame(e, w, MSG_ABORT, msg, (int64_t)strlen(msg));
    hvdl__fail(e, HVDL_ERR_STALLED, "%s", msg);
}

static void analyse(engine_t *e, double now) {
    struct deadlock *d = e->dl;
    wait_report_t *rep = d->reports;
    uint8_t in[e->size];
    int any = 0;
    for (int r = 0; r < e->size; r++)
        any += in[r] = rep[r].have && !rep[r].partial && rep[r].blocked_for >= BLOCKED_S;
    for (int changed = any; changed;) {
        changed = 0;
        for (int r = 0; r < e->size; r++) {
            if (!in[r]) continue;
            for (int i = 0; i < rep[r].n; i++)
                if (rep[r].ops[i].waited && !stuck(e, in, &rep[r].ops[i])) {
                    in[r] = 0;
                    changed = 1;
                    break;
                }
        }
    }
    int same = 1;
    any = 0;
    for (int r = 0; r < e->size; r++) {
        any |= in[r];
        same &= in[r] == d->cycle[r] && (!in[r] || rep[r].enqueues == d->cycle_enqueues[r]);
        d->cycle[r] = in[r];
        d->cycle_enqueues[r] = rep[r].enqueues;
    }
    if (!any || !same) {
        d->cycle_since = now;
        return;
    }
    if (now - d->cycle_since >= STABLE_S) fail_deadlock(e, in);
}

/* Every rank, from the loop: look at this rank's callers; rank 0 also judges. */
int hvdl__deadlock_tick(engine_t *e, double now) {
    if (!e->cfg.stall_check || e->size < 2) return 0;
    struct deadlock *d = e->dl;
    if (d && now < d->next_tick) return 0;
    if (!d && !(d = state(e))) return hvdl__oom(e, "deadlock state", (int64_t)sizeof *d);
    d->next_tick = now + TICK_S;
    if (!atomic_load(&e->waiters) && !d->reported) return 0;
    wait_report_t w;
    int waited = snapshot(e, now, &w);
    int blocked = !w.partial && w.blocked_for >= BLOCKED_S;
    int rc = 0;
    if (e->rank == 0) {
        report_clear(&d->reports[0]);
        d->reports[0] = w;
        d->reports[0].have = 1;
        d->reported = blocked;
        int someone = 0;
        for (int r = 0; r < e->size; r++)
            someone |= d->reports[r].have && d->reports[r].blocked_for >= BLOCKED_S;
        if (someone) analyse(e, now);
        return e->failed ? -1 : 0;
    }
    if (blocked && (!d->reported || d->sent_enqueues != w.enqueues || d->sent_waited != waited)) {
        rc = send_report(e, &w);
        d->reported = 1;
        d->sent_enqueues = w.enqueues;
        d->sent_waited = waited;
    } else if (!blocked && d->reported) {
        wait_report_t none = {.enqueues = w.enqueues, .blocked_for = -1};
        rc = send_report(e, &none);
        d->reported = 0;
    }
    report_clear(&w);
    return rc;
}

/* How often the loop must look while this rank has ops in flight (loop.c). */
int hvdl__deadlock_ms(engine_t *e) {
    return e->cfg.stall_check && e->size > 1 && e->mine.count ? (int)(TICK_S * 1000) : -1;
}

/* rank 0: the ops that `peer` never submitted and that others wait for (names from the
 * coordinator), as " allreduce 'x', allgather 'y'" into out; "" if none is known. */
void hvdl__never_submitted(engine_t *e, int peer, char *out, size_t cap) {
    out[0] = 0;
    coordinator_t *c = e->coord;
    if (!c || !c->pending.vals) return;
    size_t k = 0;
    for (int i = 0; i < c->pending.cap && k + 64 < cap; i++) {
        pending_t *p = c->pending.vals[i];
        if (!p || p->have[peer]) continue;
        const group_t *g = e->sets[p->metas[p->ref].process_set];
        int member = 0;
        for (int j = 0; g && j < g->n; j++) member |= g->ranks[j] == peer;
        if (!member) continue;
        wait_entry_t x = {p->name, p->metas[p->ref].op, p->metas[p->ref].process_set, 0};
        char what[300];
        describe(&x, what, sizeof what);
        k += (size_t)snprintf(out + k, cap - k, "%s%s", k ? ", " : "", what);
    }
}
