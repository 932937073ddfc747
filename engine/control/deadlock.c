/*
 * Deadlock detection: ops that can never match end the job within seconds, with both
 * halves of the mismatch in one message ("rank 0 waits in allreduce 'a' while rank 1
 * waits in allreduce 'b'", "rank 0 waits in recv 'x' from rank 1 while rank 1 waits in
 * allreduce 'y'"), instead of a per-op stall warning a minute later.
 *
 * A rank is *blocked* when every thread that has used its engine is blocked in an engine
 * wait (callers.c: asleep in hvdl_wait without a timeout, or in a wait declared to last
 * until its op is done, or between two slices of such a wait), the last of them since
 * at least BLOCKED_S. Soundness: such a rank submits nothing more until one of the ops
 * its threads wait on finishes, since a thread that could submit would be busy. A rank
 * with one thread waiting while another computes, sleeps or polls is not blocked, however
 * long that takes: the other thread may still submit what its peers wait for. (What it
 * cannot see: a thread that has never called the engine. Its first op coming after its
 * peers have waited for seconds is then left to the stall inspector, as any busy rank.)
 *
 * When can a waited op finish? A collective when every member of its process set has
 * submitted it (a rank that has joined counts as present for allreduce); a recv from
 * rank p when p has a matching send (same name, to this rank) unfinished, or sent it
 * already (then it arrives within milliseconds, and the report changes); a send to p
 * when p has posted the matching recv. So, with D the blocked ranks:
 *   repeat: drop from D every rank that waits on an op which no member of D lacks
 *   (the members outside D may still submit it, or all have and it will run; a send or
 *   recv whose peer is outside D, or has the matching op posted, may still complete);
 * what is left of D can never go on: that is a deadlock, and the job fails with a
 * message naming what each of those ranks waits in, and same-named ops that differ in
 * kind across them ("'k' is an allreduce on rank 0 and an allgather on rank 1"). A send
 * whose recv is posted never counts as stuck, eager or not. Several ops of one name
 * between one pair count as matched when any is (never a false verdict; such a deadlock
 * among equal names is left to the stall inspector). A rank busy elsewhere is not
 * blocked, so a stall it causes is left to stall.c (HOROVOD_STALL_CHECK_TIME_SECONDS,
 * HOROVOD_STALL_SHUTDOWN_TIME_SECONDS). The verdict is the whole job's only if the same D,
 * with the same reports (their posts and ops), holds for STABLE_S: a report that a rank
 * has just been unblocked may be on its way.
 *
 * Where the facts come from: each rank's own view of its ops (its handle table, under
 * mu: collectives and sends and recvs alike), not rank 0's negotiation state, so ops
 * agreed in a segment (negotiate_shm.c, negotiate_nodes.c) count exactly as those agreed
 * by the coordinator, and point-to-point ops, which rank 0 never sees, take part.
 *
 * Cost model: on the hot path, per call the thread's record is found with two loads and
 * a compare, and a post adds a load and a store of the thread's own counter (callers.c);
 * in a wait that outlasts its spin, a few stores under the mu it takes to sleep. Every
 * TICK_S, while this rank has ops in flight or callers asleep, the loop reads one atomic
 * (callers waiting); only when they have been blocked for BLOCKED_S does it snapshot its
 * ops (O(handles + threads x ops)) and send rank 0 one MSG_WAITS frame (wire.c; again
 * only when that snapshot changes, and once more when it is unblocked). Rank 0's
 * analysis is O(ranks^2 x ops), run only while some rank reports itself blocked.
 */
#include "fail.h"
#include "control.h"
#include "net.h"
#include "wire.h"
#include "callers.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TICK_S 0.5          /* how often a rank looks at its callers */
#define BLOCKED_S 2.0       /* every caller blocked this long, with nothing posted since */
#define STABLE_S 1.5        /* the same deadlock seen this long is the verdict */

struct deadlock {
    double next_tick;
    int reported;            /* this rank told rank 0 it is blocked */
    uint64_t sent_digest;    /* what that report said, to resend only on change */
    wait_report_t *reports;  /* rank 0: per rank */
    uint8_t *cycle;          /* rank 0: the deadlocked ranks last seen */
    uint64_t *cycle_digest;  /* and their reports' digests */
    double cycle_since;
};

void hvdl__deadlock_free(engine_t *e) {
    hvdl__callers_free(e);
    struct deadlock *d = e->dl;
    if (!d) return;
    for (int r = 0; d->reports && r < e->size; r++) hvdl__waits_clear(&d->reports[r]);
    free(d->reports);
    free(d->cycle);
    free(d->cycle_digest);
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
                         !(d->cycle_digest = calloc((size_t)e->size, 8)))) {
        hvdl__deadlock_free(e);
        return NULL;
    }
    return d;
}

/* What a report says, in 64 bits (FNV-1a): equal reports, equal digests. */
static uint64_t digest(const wait_report_t *w) {
    uint64_t h = 1469598103934665603ull;
#define MIX(p, n) \
    for (size_t k_ = 0; k_ < (n); k_++) h = (h ^ ((const uint8_t *)(p))[k_]) * 1099511628211ull
    MIX(&w->posts, 8);
    MIX(&w->n, sizeof w->n);
    for (int i = 0; i < w->n; i++) {
        const wait_entry_t *x = &w->ops[i];
        MIX(&x->op, 4);
        MIX(&x->set, 4);
        MIX(&x->peer, 4);
        MIX(&x->waited, 1);
        MIX(x->name, strlen(x->name) + 1);
    }
#undef MIX
    return h;
}

/* This rank's unfinished ops (under mu), from its handle table: collectives, sends and
 * recvs. Returns the number of waited-on ones. */
static int snapshot(engine_t *e, double now, wait_report_t *w) {
    memset(w, 0, sizeof *w);
    w->blocked_for = -1;
    int waited = 0;
    pthread_mutex_lock(&e->mu);
    double since = 0;
    int all = hvdl__callers_blocked(e, &since, &w->posts);
    int live = 0;
    for (int i = 0; i < e->nslots; i++) live += e->slots[i] && !atomic_load(&e->slots[i]->done);
    int cap = live < HVDL_WAITS_MAX ? live : HVDL_WAITS_MAX;
    w->ops = cap ? calloc((size_t)cap, sizeof *w->ops) : NULL;
    w->partial = live > HVDL_WAITS_MAX || (cap && !w->ops);
    for (int i = 0; w->ops && !w->partial && i < e->nslots; i++) {
        op_t *o = e->slots[i];
        if (!o || atomic_load(&o->done)) continue;
        wait_entry_t *x = &w->ops[w->n];
        if (strlen(o->name) > HVDL_MAX_NAME || !(x->name = strdup(o->name))) {
            w->partial = 1;
            break;
        }
        x->op = o->meta.op;
        x->set = o->meta.process_set;
        x->peer = o->meta.op >= HVDL_OP_SEND ? o->meta.root_rank : -1;
        x->waited = (uint8_t)hvdl__callers_wait_on(e, o);
        waited += x->waited;
        w->n++;
    }
    if (all && waited && !w->partial) w->blocked_for = now - since;
    pthread_mutex_unlock(&e->mu);
    return waited;
}

static int send_report(engine_t *e, const wait_report_t *w) {
    buf_t b = {0};
    int rc = hvdl__put_waits(&b, w);
    if (!rc) rc = hvdl__send_frame(e, 0, MSG_WAITS, b.data, b.len);
    buf_free(&b);
    return rc;
}

int hvdl__deadlock_take(engine_t *e, int from, const uint8_t *p, int64_t len) {
    struct deadlock *d = state(e);
    if (!d) return hvdl__oom(e, "wait report", len);
    wait_report_t w;
    reader_t r = {.p = p, .left = len};
    if (hvdl__read_waits(e, &r, from, &w))
        /* no memory for the report is this rank's failure, not the sender's */
        return r.oom ? hvdl__oom(e, r.why, r.oom_bytes)
                     : hvdl__malformed(e, from, "wait report", r.why);
    w.have = 1;
    hvdl__waits_clear(&d->reports[from]);
    d->reports[from] = w;
    return 0;
}

/* ---- rank 0: the analysis ---- */

/* "an allreduce", "a send": the article an op kind's name takes */
static const char *article(int op) { return strchr("aeiou", hvdl_op_name(op)[0]) ? "an" : "a"; }

static int p2p(const wait_entry_t *x) { return x->op >= HVDL_OP_SEND; }

/* "allreduce 'a'", "allreduce 'a' in process set 1", "barrier" (its name is its kind),
 * "recv 'x' from rank 1", "send 'x' to rank 0" */
static void describe(const wait_entry_t *x, char *out, size_t cap) {
    char u[256];
    hvdl__user_name(x->name, x->op, x->set, u, sizeof u);
    int k = strcmp(u, hvdl_op_name(x->op)) ? snprintf(out, cap, "%s '%s'", hvdl_op_name(x->op), u)
                                           : snprintf(out, cap, "%s", hvdl_op_name(x->op));
    if (p2p(x) && k < (int)cap)
        k += snprintf(out + k, cap - (size_t)k, " %s rank %d",
                      x->op == HVDL_OP_SEND ? "to" : "from", x->peer);
    if (x->set && k < (int)cap) snprintf(out + k, cap - (size_t)k, " in process set %d", x->set);
}

void hvdl__describe_request(const char *name, int op, int set, char *out, size_t cap) {
    wait_entry_t x = {(char *)name, op, set, -1, 0};
    describe(&x, out, cap);
}

/* w (the report of a member of x's set) has submitted the collective x. */
static int submitted(const wait_report_t *w, const wait_entry_t *x) {
    for (int i = 0; i < w->n; i++)
        if ((!p2p(&w->ops[i]) && !strcmp(w->ops[i].name, x->name)) ||
            (x->op == HVDL_OP_ALLREDUCE && w->ops[i].op == HVDL_OP_JOIN && w->ops[i].set == 0))
            return 1;
    return 0;
}

/* w (the report of x's peer) has x's other half unfinished: the send to rank `me` that
 * the recv x takes, or the recv from `me` that takes the send x. */
static int matched(const wait_report_t *w, const wait_entry_t *x, int me) {
    int want = x->op == HVDL_OP_SEND ? HVDL_OP_RECV : HVDL_OP_SEND;
    for (int i = 0; i < w->n; i++)
        if (w->ops[i].op == want && w->ops[i].peer == me && !strcmp(w->ops[i].name, x->name))
            return 1;
    return 0;
}

/* x, waited on by rank me, cannot finish while the ranks in D stay blocked: a member of
 * its set in D lacks it, or its peer is in D without its other half. */
static int stuck(engine_t *e, const uint8_t *in, int me, const wait_entry_t *x) {
    if (p2p(x)) return in[x->peer] && !matched(&e->dl->reports[x->peer], x, me);
    const group_t *g = e->sets[x->set];
    if (!g) return 0; /* rank 0 has not registered it: unknown */
    for (int i = 0; i < g->n; i++)
        if (in[g->ranks[i]] && !submitted(&e->dl->reports[g->ranks[i]], x)) return 1;
    return 0;
}

/* The first op rank r waits on that D holds up (the one to name), or NULL. */
static const wait_entry_t *held_up(engine_t *e, const uint8_t *in, int r) {
    const wait_report_t *w = &e->dl->reports[r];
    for (int i = 0; i < w->n; i++)
        if (w->ops[i].waited && stuck(e, in, r, &w->ops[i])) return &w->ops[i];
    return NULL;
}

static void fail_deadlock(engine_t *e, const uint8_t *in) {
    wait_report_t *rep = e->dl->reports;
    char msg[HVDL_MSG_BYTES];
    int k = snprintf(msg, sizeof msg, "deadlock: ");
    int shown = 0, nin = 0;
    for (int r = 0; r < e->size; r++) nin += in[r];
    for (int r = 0; r < e->size && k < (int)sizeof msg - 200; r++) {
        const wait_entry_t *x = in[r] ? held_up(e, in, r) : NULL;
        if (!x) continue;
        const char *sep = !shown ? "" : shown == nin - 1 && nin == 2 ? " while " : ", ";
        char what[320];
        describe(x, what, sizeof what);
        k += snprintf(msg + k, sizeof msg - (size_t)k, "%srank %d waits in %s", sep, r, what);
        shown++;
    }
    k += snprintf(msg + k, sizeof msg - (size_t)k,
                  "; none of them can go on: each waits for an "
                  "op that the others have not submitted and, blocked, never will.");
    /* the same name, different kinds of collective: the two halves of one mistake */
    for (int r = 0; r < e->size; r++)
        for (int m = r + 1; in[r] && m < e->size; m++)
            for (int i = 0; in[m] && i < rep[r].n; i++)
                for (int j = 0; j < rep[m].n && k < (int)sizeof msg - 200; j++) {
                    const wait_entry_t *x = &rep[r].ops[i], *y = &rep[m].ops[j];
                    char ux[256], uy[256];
                    if (x->op == y->op || p2p(x) || p2p(y) ||
                        strcmp(hvdl__user_name(x->name, x->op, x->set, ux, sizeof ux),
                               hvdl__user_name(y->name, y->op, y->set, uy, sizeof uy)))
                        continue;
                    k += snprintf(msg + k, sizeof msg - (size_t)k,
                                  " '%s' is %s %s on rank %d and %s %s on rank %d.", ux,
                                  article(x->op), hvdl_op_name(x->op), r, article(y->op),
                                  hvdl_op_name(y->op), m);
                }
    if (k < (int)sizeof msg - 120)
        snprintf(msg + k, sizeof msg - (size_t)k,
                 " Every rank must submit the same ops, with the "
                 "same names, in each process set, and each recv needs its peer's send.");
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
                if (rep[r].ops[i].waited && !stuck(e, in, r, &rep[r].ops[i])) {
                    in[r] = 0;
                    changed = 1;
                    break;
                }
        }
    }
    int same = 1;
    any = 0;
    for (int r = 0; r < e->size; r++) {
        uint64_t h = in[r] ? digest(&rep[r]) : 0;
        any |= in[r];
        same &= in[r] == d->cycle[r] && h == d->cycle_digest[r];
        d->cycle[r] = in[r];
        d->cycle_digest[r] = h;
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
    snapshot(e, now, &w);
    int blocked = !w.partial && w.blocked_for >= BLOCKED_S;
    int rc = 0;
    if (e->rank == 0) {
        hvdl__waits_clear(&d->reports[0]);
        d->reports[0] = w;
        d->reports[0].have = 1;
        d->reported = blocked;
        int someone = 0;
        for (int r = 0; r < e->size; r++)
            someone |= d->reports[r].have && d->reports[r].blocked_for >= BLOCKED_S;
        if (someone) analyse(e, now);
        return e->failed ? -1 : 0;
    }
    uint64_t h = digest(&w);
    if (blocked && (!d->reported || d->sent_digest != h)) {
        rc = send_report(e, &w);
        d->reported = 1;
        d->sent_digest = h;
    } else if (!blocked && d->reported) {
        wait_report_t none = {.posts = w.posts, .blocked_for = -1};
        rc = send_report(e, &none);
        d->reported = 0;
    }
    hvdl__waits_clear(&w);
    return rc;
}

/* How often the loop must look while this rank has ops in flight, callers asleep, or a
 * report to take back (loop.c). */
int hvdl__deadlock_ms(engine_t *e) {
    return e->cfg.stall_check && e->size > 1 &&
                   (e->mine.count || atomic_load(&e->waiters) || (e->dl && e->dl->reported))
               ? (int)(TICK_S * 1000)
               : -1;
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
        wait_entry_t x = {p->name, p->metas[p->ref].op, p->metas[p->ref].process_set, -1, 0};
        char what[300];
        describe(&x, what, sizeof what);
        k += (size_t)snprintf(out + k, cap - k, "%s%s", k ? ", " : "", what);
    }
}
