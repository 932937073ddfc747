/*
 * The coordinator (rank 0), as Horovod's controller:
 *
 *  a. Every rank's loop announces the requests enqueued during one cycle (announce.c);
 *     rank 0's own arrive in memory, a worker's in one MSG_REQUESTS frame, where a
 *     request equal to its response-cache entry is one bit (wire.c, cache.c).
 *  b. Per name, rank 0 counts the ranks that are ready. Readiness is per process set
 *     (all its members), and a rank that called join() counts as present for allreduce,
 *     contributing zeros.
 *  c. When all are ready it checks that they agree (op, dtype, shape, reduce op, root,
 *     scale factors); a disagreement becomes an error response naming the field and the
 *     ranks, and the engine goes on with the next op.
 *  d. hvdl__coordinator_plan turns everything ready into responses, in the order names
 *     became ready, fusing what fusion.c says travels together, and assigns cache ids
 *     (cache.c). It returns the plan: the loop sends it and then executes it.
 *
 * Stalls (names some ranks submitted and others did not) are watched by stall.c. A rank
 * that has said goodbye (shutdown.c) submits nothing more: a name whose set it is in and
 * that it never submitted fails at once, on every member that submits it, naming it. Where cached requests are agreed in
 * node segments (negotiation.h: negotiate_shm.c on one node, negotiate_nodes.c on
 * several), a request that reaches the coordinator otherwise closes its word's round,
 * and the negotiation hands back the bits it took (took_t): the coordinator records them
 * as the requests of their ranks. The negotiation never calls back in here.
 */
#include "fail.h"
#include "wire.h"
#include "negotiation.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int hvdl__coordinator_new(engine_t *e) {
    e->coord = calloc(1, sizeof *e->coord);
    if (!e->coord || !(e->coord->joined = calloc((size_t)e->size, 1)) ||
        !(e->coord->finished = calloc((size_t)e->size, 1)))
        return -1;
    e->coord->shutdown_from = e->coord->last_finished = -1;
    return 0;
}

static void pending_free(pending_t *p) {
    free(p->name);
    free(p->metas);
    free(p->splits);
    free(p->have);
    free(p->have_at);
    free(p->error);
    free(p->closed_nodes);
    free(p);
}

void hvdl__coordinator_free(engine_t *e) {
    coordinator_t *c = e->coord;
    if (!c) return;
    for (int i = 0; i < c->pending.cap; i++)
        if (c->pending.vals && c->pending.vals[i]) pending_free(c->pending.vals[i]);
    strmap_free(&c->pending);
    for (pending_t *p = c->ready_head, *n; p; p = n) {
        n = p->next;
        pending_free(p);
    }
    free(c->joined);
    free(c->finished);
    free(c);
    e->coord = NULL;
}

/* ---- agreement ---- */

/* The reduce ops' names, as Horovod's Python spells them (hvdl_op_name and
 * hvdl_dtype_name, core/names.c, give the others). Indexed by the enum and sized by it,
 * checked at compile time; a value skipped in the middle is NULL, which name_of shows as
 * "?". */
static const char *const REDUCE_NAMES[] = {
    [HVDL_SUM] = "Sum", [HVDL_AVERAGE] = "Average", [HVDL_MIN] = "Min",
    [HVDL_MAX] = "Max", [HVDL_PRODUCT] = "Product", [HVDL_ADASUM] = "Adasum",
};
_Static_assert(sizeof REDUCE_NAMES / sizeof REDUCE_NAMES[0] == HVDL_NUM_REDUCE_OPS,
               "a reduce op without a name");
#define NAME_OF(table, v) name_of(table, (int)(sizeof table / sizeof table[0]), v)

/* Metadata from the wire is range-checked (wire_check.c); this guards the tables anyway. */
static const char *name_of(const char *const *names, int n, int v) {
    return v >= 0 && v < n && names[v] ? names[v] : "?";
}

/* The fields of a request the ranks must agree on, in the order they are checked. */
enum {
    FIELD_OP,
    FIELD_DTYPE,
    FIELD_SHAPE,
    FIELD_REDUCE_OP,
    FIELD_ROOT,
    FIELD_SCALES,
    FIELD_SET,
    FIELD_COUNT
};

static void describe_value(const meta_t *m, int field, char *out, size_t cap) {
    switch (field) {
    case FIELD_OP: snprintf(out, cap, "%s", hvdl_op_name(m->op)); break;
    case FIELD_DTYPE: snprintf(out, cap, "%s", hvdl_dtype_name(m->dtype)); break;
    case FIELD_SHAPE: {
        int n = snprintf(out, cap, "[");
        for (int d = 0; d < m->ndim && n < (int)cap; d++)
            n += snprintf(out + n, cap - (size_t)n, d ? ", %lld" : "%lld", (long long)m->shape[d]);
        if (n < (int)cap) snprintf(out + n, cap - (size_t)n, "]");
        break;
    }
    case FIELD_REDUCE_OP: snprintf(out, cap, "%s", NAME_OF(REDUCE_NAMES, m->reduce_op)); break;
    case FIELD_ROOT: snprintf(out, cap, "%d", m->root_rank); break;
    case FIELD_SCALES: snprintf(out, cap, "%g/%g", m->prescale, m->postscale); break;
    case FIELD_SET:
    default: snprintf(out, cap, "%d", m->process_set); break;
    }
}

static const char *const FIELD_NAMES[] = {
    [FIELD_OP] = "op",           [FIELD_DTYPE] = "dtype",
    [FIELD_SHAPE] = "shape",     [FIELD_REDUCE_OP] = "reduce op",
    [FIELD_ROOT] = "root rank",  [FIELD_SCALES] = "prescale/postscale",
    [FIELD_SET] = "process set",
};
_Static_assert(sizeof FIELD_NAMES / sizeof FIELD_NAMES[0] == FIELD_COUNT, "a field without a name");

static int field_differs(const meta_t *a, const meta_t *b, int field) {
    switch (field) {
    case FIELD_OP: return a->op != b->op;
    case FIELD_DTYPE: return a->dtype != b->dtype;
    case FIELD_SHAPE: {
        if (a->ndim != b->ndim) return 1;
        /* allgather and alltoall concatenate on the first dimension: it may differ */
        int from = a->op == HVDL_OP_ALLGATHER || a->op == HVDL_OP_ALLTOALL ? 1 : 0;
        for (int d = from; d < a->ndim; d++)
            if (a->shape[d] != b->shape[d]) return 1;
        return 0;
    }
    case FIELD_REDUCE_OP: return a->reduce_op != b->reduce_op;
    case FIELD_ROOT: return a->root_rank != b->root_rank;
    case FIELD_SCALES: return a->prescale != b->prescale || a->postscale != b->postscale;
    case FIELD_SET:
    default: return a->process_set != b->process_set;
    }
}

/* The first field on which the submitting ranks disagree, as a message in msg
 * (HVDL_MSG_BYTES): 1, or 0 if they agree. */
static int check_agreement(engine_t *e, const pending_t *p, char *msg) {
    const meta_t *ref = &p->metas[p->ref];
    for (int f = 0; f < FIELD_COUNT; f++) {
        int bad = 0;
        for (int r = 0; r < e->size; r++) bad |= p->have[r] && field_differs(ref, &p->metas[r], f);
        if (!bad) continue;
        const int cap = HVDL_MSG_BYTES;
        char val[256];
        describe_value(ref, f, val, sizeof val);
        int n = snprintf(msg, (size_t)cap, "%s '%s': ranks disagree on %s: rank %d has %s",
                         hvdl_op_name(ref->op), p->name, FIELD_NAMES[f], p->ref, val);
        for (int r = 0, shown = 0; r < e->size && n < cap - 64; r++) {
            if (!p->have[r] || !field_differs(ref, &p->metas[r], f)) continue;
            if (++shown > 6) {
                n += snprintf(msg + n, (size_t)(cap - n), ", ...");
                break;
            }
            describe_value(&p->metas[r], f, val, sizeof val);
            n += snprintf(msg + n, (size_t)(cap - n), ", rank %d has %s", r, val);
        }
        return 1;
    }
    return 0;
}

/* ---- readiness ---- */

static void make_ready(coordinator_t *c, pending_t *p) {
    strmap_del(&c->pending, p->name);
    p->next = NULL;
    if (c->ready_tail) c->ready_tail->next = p;
    else c->ready_head = p;
    c->ready_tail = p;
}

/* A member that said goodbye without submitting p: the first, or -1. */
static int finished_missing(const coordinator_t *c, const group_t *g, const pending_t *p) {
    for (int i = 0; i < g->n; i++)
        if (!p->have[g->ranks[i]] && c->finished[g->ranks[i]]) return g->ranks[i];
    return -1;
}

/* A name is ready when every member of its set has submitted it. A member that has
 * joined counts as present for allreduce (it contributes zeros); for any other op it
 * never will be, so the op fails rather than wait forever. A member that has finished
 * never will be either: the op fails at once (RESP_SHUTDOWN), naming it. */
static void maybe_ready(engine_t *e, pending_t *p) {
    coordinator_t *c = e->coord;
    const meta_t *m = &p->metas[p->ref];
    group_t *g = e->sets[m->process_set];
    if (!g) return;                     /* rank 0 has not registered this set yet */
    char joined_missing[256] = "";
    int k = 0, gone = finished_missing(c, g, p);
    for (int i = 0; i < g->n && gone < 0; i++) {
        int r = g->ranks[i];
        if (p->have[r]) continue;
        if (!c->joined[r] || m->op == HVDL_OP_JOIN) return;
        if (m->op == HVDL_OP_ALLREDUCE) continue;
        k += snprintf(joined_missing + k, sizeof joined_missing - (size_t)k, k ? ", %d" : "%d", r);
        if (k >= (int)sizeof joined_missing - 16) break;
    }
    char msg[HVDL_MSG_BYTES], what[300];
    int bad = 1;
    p->error_gone = gone >= 0;
    if (gone >= 0) {
        hvdl__describe_request(p->name, m->op, m->process_set, what, sizeof what);
        snprintf(msg, sizeof msg,
                 "rank %d called shutdown() without submitting %s, which needs it (a rank "
                 "that has shut down submits nothing more)",
                 gone, what);
    } else if (k) {
        snprintf(msg, sizeof msg,
                 "%s '%s': ranks [%s] have called join(); only allreduce can run until every "
                 "rank has joined",
                 hvdl_op_name(m->op), p->name, joined_missing);
    } else {
        bad = check_agreement(e, p, msg);
    }
    /* no memory for the text: planning fails with this rank's out of memory, never runs
     * the op as if the ranks agreed (the request record's site stands for this one) */
    if (bad && (HVDL_INJECT(e, INJ_RECORD_ALLOC) || !(p->error = strdup(msg))))
        p->error_oom = (int64_t)strlen(msg) + 1;
    make_ready(c, p);
}

static void rescan(engine_t *e) {
    strmap_t *pm = &e->coord->pending;
    /* strmap_del leaves tombstones in place, so walking the slots while deleting is safe */
    for (int i = 0; i < pm->cap; i++)
        if (pm->vals && pm->vals[i]) maybe_ready(e, pm->vals[i]);
}

/* Record from's request. `taken`: it was posted in a segment and taken over by rank 0
 * (negotiation.h), so its word is already closed; otherwise the request reached rank 0
 * as a frame or in memory, and the negotiation closes the round of its word where other
 * ranks may have posted, returning their bits, which are recorded after from's own. */
static int record(engine_t *e, int from, const char *name, const meta_t *m, const int64_t *splits,
                  int nsplits, int taken) {
    coordinator_t *c = e->coord;
    pending_t *p = strmap_get(&c->pending, name);
    if (!p) {
        /* with its alltoall split table, so that one site stands for the whole record */
        p = HVDL_INJECT(e, INJ_RECORD_ALLOC) ? NULL : calloc(1, sizeof *p);
        if (!p || !(p->name = strdup(name)) ||
            !(p->metas = calloc((size_t)e->size, sizeof *p->metas)) ||
            !(p->have = calloc((size_t)e->size, 1)) ||
            !(p->have_at = calloc((size_t)e->size, sizeof(double))) ||
            (splits && !(p->splits = calloc((size_t)e->size * (size_t)e->size, 8))) ||
            strmap_put(&c->pending, name, p)) {
            if (p) pending_free(p);
            return hvdl__oom(e, "request record", (int64_t)e->size * (int64_t)sizeof(meta_t));
        }
        p->ref = from;
        p->first_at = hvdl_now();
    }
    if (p->have[from]) return 0;   /* refused at enqueue; never twice in flight */
    took_t t;
    hvdl__took_init(&t);
    if (!taken && e->negotiation->close(e, from, p, m, &t)) {
        hvdl__took_free(&t);
        return -1;
    }
    p->have[from] = 1;
    p->have_at[from] = hvdl_now();
    p->metas[from] = *m;
    p->count++;
    if (splits) {
        /* a record made by a request without splits (the ranks disagree on the op) */
        if (!p->splits && (HVDL_INJECT(e, INJ_RECORD_ALLOC) ||
                           !(p->splits = calloc((size_t)e->size * (size_t)e->size, 8)))) {
            hvdl__took_free(&t);
            return hvdl__oom(e, "alltoall split table", 8 * (int64_t)e->size * e->size);
        }
        memcpy(p->splits + (int64_t)from * e->size, splits, 8 * (size_t)nsplits);
    }
    if (m->op == HVDL_OP_JOIN && m->process_set == 0) {
        c->joined[from] = 1;
        c->last_joined = from;
        /* the joined rank will post nothing: every word closes, and what was posted in
         * them is recorded before the join counts */
        if (e->negotiation->join(e, &t) || hvdl__coordinator_take_bits(e, &t)) {
            hvdl__took_free(&t);
            return -1;
        }
        maybe_ready(e, p);
        rescan(e);    /* a join may complete others' allreduces */
        return 0;
    }
    maybe_ready(e, p);
    return hvdl__coordinator_take_bits(e, &t);
}

int hvdl__coord_record(engine_t *e, int from, const char *name, const meta_t *m,
                       const int64_t *splits, int nsplits) {
    return record(e, from, name, m, splits, nsplits, 0);
}

/* Requests rank 0 took over from a segment: each as its rank's cached request. A bit of
 * a rank that has joined since is skipped where the negotiation says so (took_t). */
int hvdl__coordinator_take_bits(engine_t *e, took_t *t) {
    int rc = 0;
    for (int i = 0; i < t->n && !rc; i++) {
        const took_bit_t *b = &t->v[i];
        const char *name = e->cache[b->id].name;
        if (b->rank >= 0 && !(t->skip_joined && e->coord->joined[b->rank])) {
            meta_t m = hvdl__cache_meta_for(e, b->id, b->rank);
            rc = record(e, b->rank, name, &m, NULL, 0, 1);
        }
        /* a stall: the name has waited since its word was first seen stuck */
        pending_t *p = rc || b->since <= 0 ? NULL : strmap_get(&e->coord->pending, name);
        if (p && p->first_at > b->since) p->first_at = b->since;
    }
    hvdl__took_free(t);
    return rc;
}

/* A worker's request list: unchanged requests by cache id, then the full ones. */
int hvdl__coordinator_take(engine_t *e, int from, const request_list_t *l, const char **why) {
    *why = NULL;
    for (int i = 0; i < l->nhits; i++) {
        if (l->hits[i] >= (uint32_t)e->ncache) {
            *why = "a cache bit for an entry that does not exist";
            return -1;
        }
        meta_t m = hvdl__cache_meta_for(e, (int)l->hits[i], from);
        if (hvdl__coord_record(e, from, e->cache[l->hits[i]].name, &m, NULL, 0)) return -1;
    }
    for (int i = 0; i < l->nfull; i++) {
        const request_t *q = &l->full[i];
        if (hvdl__coord_record(e, from, q->name, &q->meta, q->splits, (int)q->nsplits)) return -1;
    }
    return 0;
}

/* ---- planning ---- */

static int build_response(engine_t *e, response_t *r, pending_t *group, int n) {
    coordinator_t *c = e->coord;
    pending_t *first = group;
    const group_t *g = e->sets[first->metas[first->ref].process_set];
    memset(r, 0, sizeof *r);
    r->kind = !first->error ? RESP_OK : first->error_gone ? RESP_SHUTDOWN : RESP_ERROR;
    r->meta = first->metas[first->ref];
    r->error = first->error;
    first->error = NULL;
    if (first->error_oom) return hvdl__oom(e, "error message", first->error_oom);
    /* one site for the response's tables, its trace and its names */
    if (HVDL_INJECT(e, INJ_RESPONSE_ALLOC) || hvdl__response_alloc(r, n, g->n, r->meta.op))
        return hvdl__oom(e, "response", (int64_t)n * (int64_t)sizeof(meta_t));
    r->received_at = hvdl_now();
    if (TL_ON(e) && !(r->ready_at = calloc((size_t)n * (size_t)e->size, sizeof(double))))
        return hvdl__oom(e, "response trace", (int64_t)n * e->size * 8);
    pending_t *p = group;
    for (int i = 0; i < n; i++, p = p->next) {
        r->metas[i] = p->metas[p->ref];
        if (r->ready_at)
            memcpy(r->ready_at + (int64_t)i * e->size, p->have_at,
                   sizeof(double) * (size_t)e->size);
        if (!(r->names[i] = strdup(p->name)))
            return hvdl__oom(e, "tensor name", (int64_t)strlen(p->name));
        r->ntensors++;
        for (int k = 0; r->dim0 && k < g->n; k++)
            r->dim0[(int64_t)i * g->n + k] = p->metas[g->ranks[k]].shape[0];
    }
    for (int a = 0; r->matrix && a < g->n; a++)
        for (int b = 0; b < g->n; b++)
            r->matrix[a * g->n + b] = first->splits[(int64_t)g->ranks[a] * e->size + b];
    if (r->meta.op == HVDL_OP_JOIN && r->kind == RESP_OK) {
        r->meta.root_rank = c->last_joined;      /* what join() returns */
        memset(c->joined, 0, (size_t)e->size);
    }
    return 0;
}

/* A join under way, or a rank that has finished: the segments' words stay closed, so
 * that every request reaches rank 0, which knows who will never submit. */
static int anyone_joined(const coordinator_t *c, int size) {
    for (int r = 0; r < size; r++)
        if (c->joined[r] || c->finished[r]) return 1;
    return 0;
}

/* Everything ready, as responses in execution order; rank 0's cache is updated as each
 * is planned, exactly as every worker's will be when it receives them. */
int hvdl__coordinator_plan(engine_t *e, response_t **out, int *count) {
    coordinator_t *c = e->coord;
    *out = NULL;
    *count = 0;
    if (atomic_exchange(&e->sets_changed, 0)) rescan(e);
    if (!c->ready_head) return 0;
    int nresp = 0, cap = 16, rc = 0;
    response_t *rs = calloc((size_t)cap, sizeof *rs);
    if (HVDL_INJECT(e, INJ_PLAN_ALLOC) || !rs) {
        free(rs);
        return hvdl__oom(e, "response plan", (int64_t)sizeof *rs * cap);
    }
    while (c->ready_head && !rc) {
        if (nresp == cap) {
            response_t *r2 = realloc(rs, sizeof *rs * (size_t)cap * 2);
            if (!r2) {
                rc = hvdl__oom(e, "response plan", (int64_t)sizeof *rs * cap * 2);
                break;
            }
            rs = r2;
            cap *= 2;
        }
        int n;
        pending_t *group = hvdl__fusion_take(e, &n);
        took_t t;
        hvdl__took_init(&t);
        rc = build_response(e, &rs[nresp], group, n) || hvdl__cache_assign(e, &rs[nresp]) ||
             e->negotiation->settle(e, &rs[nresp], anyone_joined(c, e->size), &t) ||
             hvdl__coordinator_take_bits(e, &t);
        hvdl__took_free(&t);
        nresp++;
        for (pending_t *p = group, *next; p; p = next) {
            next = p->next;
            pending_free(p);
        }
    }
    if (rc) {
        for (int i = 0; i < nresp; i++) hvdl__response_free(&rs[i]);
        free(rs);
        return -1;
    }
    *out = rs;
    *count = nresp;
    return 0;
}

/* Rank r said goodbye: it submits nothing more. Every word closes (what was posted in
 * them is recorded first, as for a join), and every name of a set r is in that r never
 * submitted fails now. Returns how many ranks have finished, or -1. */
int hvdl__coordinator_finish(engine_t *e, int r) {
    coordinator_t *c = e->coord;
    if (c->finished[r]) return c->nfinished;
    took_t t;
    hvdl__took_init(&t);
    int rc = e->negotiation->join(e, &t) || hvdl__coordinator_take_bits(e, &t);
    hvdl__took_free(&t);
    if (rc) return -1;
    c->finished[r] = 1;
    c->nfinished++;
    rescan(e);
    return c->nfinished;
}

int hvdl__coordinator_pending(engine_t *e) { return e->coord && e->coord->pending.count > 0; }
