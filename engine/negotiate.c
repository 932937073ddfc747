/*
 * Negotiation: deciding, identically on every rank, which tensors to move and in what
 * order. Rank 0 coordinates, as Horovod's controller does:
 *
 *  a. Each rank's loop collects the requests enqueued during one cycle and announces them
 *     to rank 0 in one MSG_REQUESTS frame (rank 0 announces to itself in memory).
 *  b. A request whose name and metadata equal a response-cache entry travels as one bit
 *     of a bit vector; any other request travels in full (name + metadata).
 *  c. Rank 0 expands bits back into requests and counts, per name, the ranks that are
 *     ready. When all are, it checks that they agree (op, dtype, shape, reduce op, root,
 *     scale factors); a disagreement becomes an error response naming the field and the
 *     ranks, and the engine goes on with the next op.
 *     Readiness is per process set (all its members), and a rank that called join()
 *     counts as present for allreduce, contributing zeros.
 *  d. Ready tensors are planned into fused responses (compatible allreduces up to
 *     HOROVOD_FUSION_THRESHOLD bytes) in the order they became ready, sent to every rank
 *     in one MSG_RESPONSES frame (each rank gets the responses of the sets it belongs to), and
 *     executed by every member in that order. A response for
 *     a cached tensor carries its 4-byte cache id instead of its name and metadata.
 *  e. The cache itself is updated from the responses, in order, on every rank, so all
 *     ranks always hold the same cache; rank 0 alone assigns ids.
 *
 * Any rank's shutdown is every rank's (as in Horovod): rank 0 answers the first MSG_BYE
 * with a shutdown response, and every rank fails its unfinished ops with "shut down".
 * Rank 0 also watches for stalls: names that some ranks submitted and others did not.
 */
#include "internal.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct pending {
    char *name;
    meta_t *metas;           /* per global rank */
    int64_t *splits;         /* alltoall: size x size rows, [rank * size + j] */
    uint8_t *have;           /* per global rank: has submitted */
    double *have_at;         /* per global rank: when rank 0 learned it (for the trace) */
    int count;
    int ref;                 /* the first rank that submitted: its meta is the reference */
    double first_at, warned_at;
    char *error;             /* set when ready and the ranks disagree */
    struct pending *next;    /* link in the ready list */
} pending_t;

typedef struct coordinator {
    strmap_t pending;        /* name -> pending_t*, until every member is ready */
    pending_t *ready_head, *ready_tail;
    uint8_t *joined;         /* per rank: called join() and waits for the others */
    int last_joined;
    int shutdown_from;       /* rank that asked to shut down, or -1 */
    double last_stall_check;
} coordinator_t;

static const char *OP_NAMES[] = {"allreduce", "allgather", "broadcast", "barrier",
                                 "alltoall", "reducescatter", "join"};
static const char *DTYPE_NAMES[] = {"uint8", "int8", "int16", "int32", "int64", "float16",
                                    "bfloat16", "float32", "float64", "bool"};
static const char *REDUCE_NAMES[] = {"Sum", "Average", "Min", "Max", "Product", "Adasum"};

int hvdl__coordinator_new(engine_t *e) {
    e->coord = calloc(1, sizeof *e->coord);
    if (!e->coord || !(e->coord->joined = calloc((size_t)e->size, 1))) return -1;
    e->coord->shutdown_from = -1;
    return 0;
}

static void pending_free(pending_t *p) {
    free(p->name);
    free(p->metas);
    free(p->splits);
    free(p->have);
    free(p->have_at);
    free(p->error);
    free(p);
}

void hvdl__coordinator_free(engine_t *e) {
    coordinator_t *c = e->coord;
    if (!c) return;
    for (int i = 0; i < c->pending.cap; i++)
        if (c->pending.vals && c->pending.vals[i]) pending_free(c->pending.vals[i]);
    strmap_free(&c->pending);
    for (pending_t *p = c->ready_head, *n; p; p = n) { n = p->next; pending_free(p); }
    free(c->joined);
    free(c);
    e->coord = NULL;
}

/* ---- agreement ---- */

/* Metadata from the wire is range-checked (wire_check.c); this guards the tables anyway. */
static const char *name_of(const char *const *names, int n, int v) {
    return v >= 0 && v < n ? names[v] : "?";
}

static void describe_value(const meta_t *m, int field, char *out, size_t cap) {
    switch (field) {
    case 0: snprintf(out, cap, "%s", name_of(OP_NAMES, 7, m->op)); break;
    case 1: snprintf(out, cap, "%s", name_of(DTYPE_NAMES, 10, m->dtype)); break;
    case 2: {
        int n = snprintf(out, cap, "[");
        for (int d = 0; d < m->ndim && n < (int)cap; d++)
            n += snprintf(out + n, cap - (size_t)n, d ? ", %lld" : "%lld", (long long)m->shape[d]);
        if (n < (int)cap) snprintf(out + n, cap - (size_t)n, "]");
        break;
    }
    case 3: snprintf(out, cap, "%s", name_of(REDUCE_NAMES, 6, m->reduce_op)); break;
    case 4: snprintf(out, cap, "%d", m->root_rank); break;
    case 5: snprintf(out, cap, "%g/%g", m->prescale, m->postscale); break;
    default: snprintf(out, cap, "%d", m->process_set); break;
    }
}

static const char *FIELD_NAMES[] = {"op", "dtype", "shape", "reduce op", "root rank",
                                    "prescale/postscale", "process set"};

static int field_differs(const meta_t *a, const meta_t *b, int field) {
    switch (field) {
    case 0: return a->op != b->op;
    case 1: return a->dtype != b->dtype;
    case 2: {
        if (a->ndim != b->ndim) return 1;
        /* allgather and alltoall concatenate on the first dimension: it may differ */
        int from = a->op == HVDL_OP_ALLGATHER || a->op == HVDL_OP_ALLTOALL ? 1 : 0;
        for (int d = from; d < a->ndim; d++)
            if (a->shape[d] != b->shape[d]) return 1;
        return 0;
    }
    case 3: return a->reduce_op != b->reduce_op;
    case 4: return a->root_rank != b->root_rank;
    case 5: return a->prescale != b->prescale || a->postscale != b->postscale;
    default: return a->process_set != b->process_set;
    }
}

/* The first field on which the submitting ranks disagree, as a message; NULL if none. */
static char *check_agreement(engine_t *e, const pending_t *p) {
    const meta_t *ref = &p->metas[p->ref];
    for (int f = 0; f < 7; f++) {
        int bad = 0;
        for (int r = 0; r < e->size; r++) bad |= p->have[r] && field_differs(ref, &p->metas[r], f);
        if (!bad) continue;
        char msg[HVDL_MSG_BYTES], val[256];
        describe_value(ref, f, val, sizeof val);
        int n = snprintf(msg, sizeof msg, "%s '%s': ranks disagree on %s: rank %d has %s",
                         name_of(OP_NAMES, 7, ref->op), p->name, FIELD_NAMES[f], p->ref, val);
        for (int r = 0, shown = 0; r < e->size && n < (int)sizeof msg - 64; r++) {
            if (!p->have[r] || !field_differs(ref, &p->metas[r], f)) continue;
            if (++shown > 6) { n += snprintf(msg + n, sizeof msg - (size_t)n, ", ..."); break; }
            describe_value(&p->metas[r], f, val, sizeof val);
            n += snprintf(msg + n, sizeof msg - (size_t)n, ", rank %d has %s", r, val);
        }
        return strdup(msg);
    }
    return NULL;
}

/* ---- readiness ---- */

static void make_ready(coordinator_t *c, pending_t *p) {
    strmap_del(&c->pending, p->name);
    p->next = NULL;
    if (c->ready_tail) c->ready_tail->next = p;
    else c->ready_head = p;
    c->ready_tail = p;
}

/* A name is ready when every member of its set has submitted it. A member that has
 * joined counts as present for allreduce (it contributes zeros); for any other op it
 * never will be, so the op fails rather than wait forever. */
static void maybe_ready(engine_t *e, pending_t *p) {
    coordinator_t *c = e->coord;
    const meta_t *m = &p->metas[p->ref];
    group_t *g = e->sets[m->process_set];
    if (!g) return;                     /* rank 0 has not registered this set yet */
    char joined_missing[256] = "";
    int k = 0;
    for (int i = 0; i < g->n; i++) {
        int r = g->ranks[i];
        if (p->have[r]) continue;
        if (!c->joined[r] || m->op == HVDL_OP_JOIN) return;
        if (m->op == HVDL_OP_ALLREDUCE) continue;
        k += snprintf(joined_missing + k, sizeof joined_missing - (size_t)k, k ? ", %d" : "%d", r);
        if (k >= (int)sizeof joined_missing - 16) break;
    }
    if (k) {
        char msg[HVDL_MSG_BYTES];
        snprintf(msg, sizeof msg, "%s '%s': ranks [%s] have called join(); only allreduce can "
                 "run until every rank has joined", name_of(OP_NAMES, 7, m->op), p->name, joined_missing);
        p->error = strdup(msg);
    } else {
        p->error = check_agreement(e, p);
    }
    make_ready(c, p);
}

void hvdl__coordinator_rescan(engine_t *e) {
    strmap_t *pm = &e->coord->pending;
    /* strmap_del leaves tombstones in place, so walking the slots while deleting is safe */
    for (int i = 0; i < pm->cap; i++)
        if (pm->vals && pm->vals[i]) maybe_ready(e, pm->vals[i]);
}

int hvdl__coord_record(engine_t *e, int from, const char *name, const meta_t *m,
                       const int64_t *splits, int nsplits) {
    coordinator_t *c = e->coord;
    pending_t *p = strmap_get(&c->pending, name);
    if (!p) {
        p = calloc(1, sizeof *p);
        if (!p || !(p->name = strdup(name)) ||
            !(p->metas = calloc((size_t)e->size, sizeof *p->metas)) ||
            !(p->have = calloc((size_t)e->size, 1)) ||
            !(p->have_at = calloc((size_t)e->size, sizeof(double))) || strmap_put(&c->pending, name, p)) {
            if (p) pending_free(p);
            return -1;
        }
        p->ref = from;
        p->first_at = hvdl_now();
    }
    if (p->have[from]) return 0;   /* refused at enqueue; never twice in flight */
    p->have[from] = 1;
    p->have_at[from] = hvdl_now();
    p->metas[from] = *m;
    p->count++;
    if (splits) {
        if (!p->splits && !(p->splits = calloc((size_t)e->size * (size_t)e->size, 8))) return -1;
        memcpy(p->splits + (int64_t)from * e->size, splits, 8 * (size_t)nsplits);
    }
    if (m->op == HVDL_OP_JOIN && m->process_set == 0) {
        c->joined[from] = 1;
        c->last_joined = from;
        maybe_ready(e, p);
        hvdl__coordinator_rescan(e);    /* a join may complete others' allreduces */
        return 0;
    }
    maybe_ready(e, p);
    return 0;
}

/* ---- planning ---- */

static int fusable(const meta_t *a, const meta_t *b) {
    return a->op == HVDL_OP_ALLREDUCE && b->op == HVDL_OP_ALLREDUCE && a->dtype == b->dtype &&
           a->reduce_op == b->reduce_op && a->prescale == b->prescale &&
           a->postscale == b->postscale && a->process_set == b->process_set;
}

static int64_t meta_bytes(const meta_t *m) {
    int64_t n = hvdl_dtype_size(m->dtype);
    for (int d = 0; d < m->ndim; d++) n *= m->shape[d];
    return n;
}

/* Take the next group off the ready list: one tensor, or as many compatible allreduces
 * as fit under the fusion threshold, in ready order (incompatible ones keep their place). */
static int take_group(engine_t *e, pending_t **group, int cap) {
    coordinator_t *c = e->coord;
    pending_t *first = c->ready_head;
    c->ready_head = first->next;
    group[0] = first;
    int n = 1;
    const meta_t *fm = &first->metas[first->ref];
    int64_t bytes = meta_bytes(fm);
    for (pending_t **pp = &c->ready_head; !first->error && *pp && n < cap;) {
        pending_t *p = *pp;
        int64_t nb = meta_bytes(&p->metas[p->ref]);
        if (!p->error && fusable(fm, &p->metas[p->ref]) && bytes + nb <= e->cfg.fusion_threshold) {
            *pp = p->next;
            group[n++] = p;
            bytes += nb;
        } else {
            pp = &p->next;
        }
    }
    c->ready_tail = NULL;
    for (pending_t *p = c->ready_head; p; p = p->next) c->ready_tail = p;
    return n;
}

static int build_response(engine_t *e, response_t *r, pending_t **group, int n) {
    coordinator_t *c = e->coord;
    pending_t *first = group[0];
    const group_t *g = e->sets[first->metas[first->ref].process_set];
    memset(r, 0, sizeof *r);
    r->kind = first->error ? RESP_ERROR : RESP_OK;
    r->meta = first->metas[first->ref];
    r->error = first->error;
    first->error = NULL;
    if (hvdl__response_alloc(r, n, g->n, r->meta.op)) return -1;
    r->received_at = hvdl_now();
    if (TL_ON(e) && !(r->ready_at = calloc((size_t)n * (size_t)e->size, sizeof(double)))) return -1;
    for (int i = 0; i < n; i++) {
        pending_t *p = group[i];
        r->metas[i] = p->metas[p->ref];
        if (r->ready_at) memcpy(r->ready_at + (int64_t)i * e->size, p->have_at, sizeof(double) * (size_t)e->size);
        if (!(r->names[i] = strdup(p->name))) return -1;
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

static int is_member(const group_t *g, int rank) {
    for (int i = 0; i < g->n; i++)
        if (g->ranks[i] == rank) return 1;
    return 0;
}

/* Plan everything ready into responses, send each worker the ones its sets involve (in
 * one frame, in order), then execute this rank's share. */
int hvdl__coordinator_step(engine_t *e) {
    coordinator_t *c = e->coord;
    if (atomic_exchange(&e->sets_changed, 0)) hvdl__coordinator_rescan(e);
    if (!c->ready_head) return 0;
    int nresp = 0, cap = 16, rc = 0;
    response_t *rs = calloc((size_t)cap, sizeof *rs);
    buf_t *wire = calloc((size_t)cap, sizeof *wire);
    while (c->ready_head && rs && wire && !rc) {
        if (nresp == cap) {
            cap *= 2;
            response_t *r2 = realloc(rs, sizeof *rs * (size_t)cap);
            buf_t *w2 = realloc(wire, sizeof *wire * (size_t)cap);
            if (r2) rs = r2;
            if (w2) wire = w2;
            if (!r2 || !w2) { rc = -1; break; }
        }
        pending_t *group[512];
        int n = take_group(e, group, 512);
        memset(&wire[nresp], 0, sizeof *wire);
        rc = build_response(e, &rs[nresp], group, n) || hvdl__write_response(e, &wire[nresp], &rs[nresp]);
        nresp++;
        for (int i = 0; i < n; i++) pending_free(group[i]);
    }
    if (!rs || !wire) rc = -1;
    for (int w = 1; w < e->size && !rc; w++) {
        buf_t msg = {0};
        uint32_t count = 0;
        buf_put_u32(&msg, 0);
        for (int i = 0; i < nresp; i++) {
            if (!is_member(e->sets[rs[i].meta.process_set], w)) continue;
            buf_put(&msg, wire[i].data, wire[i].len);
            count++;
        }
        memcpy(msg.data, &count, 4);
        if (count) rc = hvdl__send_frame(e, w, MSG_RESPONSES, msg.data, msg.len);
        buf_free(&msg);
    }
    for (int i = 0; i < nresp; i++) {
        if (!rc && is_member(e->sets[rs[i].meta.process_set], 0)) rc = hvdl__execute(e, &rs[i]);
        hvdl__response_free(&rs[i]);
        buf_free(&wire[i]);
    }
    free(rs);
    free(wire);
    if (rc && !e->failed) hvdl__fail(e, HVDL_ERR_SYSTEM, "internal error: out of memory while planning responses");
    return rc;
}

static int handle_responses(engine_t *e, reader_t *r) {
    response_t *rs;
    int n, rc = 0;
    if (hvdl__read_responses(e, r, &rs, &n)) return -1;
    double now = hvdl_now();
    for (int i = 0; i < n; i++) {
        rs[i].received_at = now;
        if (!rc) rc = hvdl__execute(e, &rs[i]);
        hvdl__response_free(&rs[i]);
    }
    free(rs);
    return rc;
}

/* ---- shutdown, aborts and the frame dispatcher ---- */

static int begin_shutdown(engine_t *e, int from) {
    coordinator_t *c = e->coord;
    if (c->shutdown_from >= 0) return 0;
    c->shutdown_from = from;
    e->stopped = 1;          /* first: a peer that already left is no loss now */
    int32_t who = from;
    for (int w = 1; w < e->size; w++)
        if (!e->peers[w].ctrl.eof) hvdl__send_frame(e, w, MSG_BYE, &who, sizeof who);
    return 0;
}

int hvdl__say_bye(engine_t *e) {
    if (e->rank == 0) return begin_shutdown(e, 0);
    int32_t me = e->rank;
    return hvdl__send_frame(e, 0, MSG_BYE, &me, sizeof me);
}

/* A frame from `from` that this rank cannot accept: the sender is broken or hostile,
 * and the job cannot go on with it. */
static int malformed(engine_t *e, int from, const char *what, const char *why) {
    char msg[256];
    snprintf(msg, sizeof msg, "sent a malformed %s (%s)", what, why ? why : "unreadable");
    hvdl__peer_lost(e, from, msg);
    return -1;
}

int hvdl__handle_frame(engine_t *e, int from, int type, const uint8_t *p, int64_t n) {
    reader_t r = {p, n, 0, NULL};
    switch (type) {
    case MSG_REQUESTS:
        if (hvdl__parse_requests(e, from, &r)) return e->failed ? -1 : malformed(e, from, "request list", r.why);
        return 0;
    case MSG_RESPONSES:
        if (handle_responses(e, &r)) return e->failed ? -1 : malformed(e, from, "response list", r.why);
        return 0;
    case MSG_BYE:
        if (e->rank == 0) return begin_shutdown(e, from);
        e->stopped = 1;       /* rank 0 says everyone stops */
        return 0;
    case MSG_HEARTBEAT:
        return 0;             /* its arrival was the point (liveness.c) */
    case MSG_ABORT: {
        char msg[HVDL_MSG_BYTES];
        snprintf(msg, sizeof msg, "%.*s", (int)(n < HVDL_MSG_BYTES - 1 ? n : HVDL_MSG_BYTES - 1), (const char *)p);
        hvdl__fail(e, HVDL_ERR_PEER_LOST, "%s", msg);
        /* rank 0 passes a worker's verdict on, so that every rank names the same culprit */
        for (int w = 1; e->rank == 0 && w < e->size; w++)
            if (w != from && e->peers[w].ctrl.fd >= 0 && !e->peers[w].ctrl.eof)
                hvdl__send_frame(e, w, MSG_ABORT, msg, (int64_t)strlen(msg));
        return -1;
    }
    default:      /* net.c lets through only the types this rank may receive */
        return malformed(e, from, "control frame", "a type this rank does not take");
    }
}

/* ---- stalls ---- */

void hvdl__stall_check(engine_t *e, double now) {
    coordinator_t *c = e->coord;
    if (!c || !e->cfg.stall_check || now - c->last_stall_check < 1.0) return;
    c->last_stall_check = now;
    for (int i = 0; i < c->pending.cap; i++) {
        pending_t *p = c->pending.vals ? c->pending.vals[i] : NULL;
        if (!p || now - p->first_at < e->cfg.stall_warning) continue;
        const group_t *g = e->sets[p->metas[p->ref].process_set];
        char missing[512] = "";
        int k = 0;
        for (int i = 0; g && i < g->n && k < (int)sizeof missing - 16; i++)
            if (!p->have[g->ranks[i]])
                k += snprintf(missing + k, sizeof missing - (size_t)k, k ? ", %d" : "%d", g->ranks[i]);
        if (e->cfg.stall_shutdown > 0 && now - p->first_at > e->cfg.stall_shutdown) {
            char msg[HVDL_MSG_BYTES];
            snprintf(msg, sizeof msg, "stalled: '%s' was submitted by some ranks %.0f s ago but ranks "
                     "[%s] never submitted it (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS)",
                     p->name, now - p->first_at, missing);
            hvdl__fail(e, HVDL_ERR_STALLED, "%s", msg);
            /* every rank ends with this reason, rather than later with "rank 0 was lost" */
            for (int w = 1; w < e->size; w++)
                if (e->peers[w].ctrl.fd >= 0 && !e->peers[w].ctrl.eof)
                    hvdl__send_frame(e, w, MSG_ABORT, msg, (int64_t)strlen(msg));
            return;
        }
        if (now - p->warned_at < e->cfg.stall_warning) continue;
        p->warned_at = now;
        hvdl__log(HVDL_LOG_WARNING, "stall: '%s' has waited %.0f s; ranks [%s] have not submitted it. "
                  "One or more ranks may be behind or took a different code path.",
                  p->name, now - p->first_at, missing);
    }
}

int hvdl__coordinator_pending(engine_t *e) {
    return e->coord && e->coord->pending.count > 0;
}
