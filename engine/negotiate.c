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
 *  d. Ready tensors are planned into fused responses (compatible allreduces up to
 *     HOROVOD_FUSION_THRESHOLD bytes) in the order they became ready, sent to every rank
 *     in one MSG_RESPONSES frame, and executed by every rank in that order. A response for
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
    meta_t *metas;           /* per rank */
    uint8_t *have;           /* per rank */
    int count;
    double first_at;
    double warned_at;
    char *error;             /* set when all are ready and they disagree */
    struct pending *next;    /* link in the ready list */
} pending_t;

typedef struct coordinator {
    strmap_t pending;        /* name -> pending_t*, until every rank is ready */
    pending_t *ready_head, *ready_tail;
    int shutdown_from;       /* rank that asked to shut down, or -1 */
    double last_stall_check;
} coordinator_t;

static const char *OP_NAMES[] = {"allreduce", "allgather", "broadcast", "barrier",
                                 "alltoall", "reducescatter"};
static const char *DTYPE_NAMES[] = {"uint8", "int8", "int16", "int32", "int64", "float16",
                                    "bfloat16", "float32", "float64", "bool"};
static const char *REDUCE_NAMES[] = {"Sum", "Average", "Min", "Max", "Product", "Adasum"};

int hvdl__coordinator_new(engine_t *e) {
    e->coord = calloc(1, sizeof *e->coord);
    if (!e->coord) return -1;
    e->coord->shutdown_from = -1;
    return 0;
}

static void pending_free(pending_t *p) {
    free(p->name);
    free(p->metas);
    free(p->have);
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
    free(c);
    e->coord = NULL;
}

void hvdl__response_free(response_t *r) {
    for (int i = 0; i < r->ntensors; i++) free(r->names[i]);
    free(r->names);
    free(r->cache_ids);
    free(r->dim0);
    free(r->error);
}

/* ---- the response cache ---- */

int hvdl__cache_meta_equal(const meta_t *a, const meta_t *b) {
    if (a->op != b->op || a->dtype != b->dtype || a->reduce_op != b->reduce_op ||
        a->root_rank != b->root_rank || a->process_set != b->process_set ||
        a->ndim != b->ndim || a->prescale != b->prescale || a->postscale != b->postscale)
        return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return 0;
    return 1;
}

static int cache_lookup(engine_t *e, const char *name) {
    intptr_t v = (intptr_t)strmap_get(&e->cache_by_name, name);
    return (int)v - 1;
}

/* The cached request of rank `rank` (allgather's first dimension differs per rank). */
static meta_t cache_meta_for(engine_t *e, int id, int rank) {
    meta_t m = e->cache[id].meta;
    if (e->cache[id].dim0s) m.shape[0] = e->cache[id].dim0s[rank];
    return m;
}

static int cache_store(engine_t *e, int id, const char *name, const meta_t *m, const int64_t *dim0) {
    if (id >= e->ncache) {
        cache_entry_t *c = realloc(e->cache, sizeof *c * (size_t)(id + 1));
        if (!c) return -1;
        memset(c + e->ncache, 0, sizeof *c * (size_t)(id + 1 - e->ncache));
        e->cache = c;
        e->ncache = id + 1;
    }
    cache_entry_t *c = &e->cache[id];
    if (!c->name) {
        c->name = strdup(name);
        strmap_put(&e->cache_by_name, name, (void *)(intptr_t)(id + 1));
    }
    c->meta = *m;
    free(c->dim0s);
    c->dim0s = NULL;
    if (dim0) {
        c->dim0s = malloc(sizeof(int64_t) * (size_t)e->size);
        if (!c->dim0s) return -1;
        memcpy(c->dim0s, dim0, sizeof(int64_t) * (size_t)e->size);
    }
    return 0;
}

/* ---- a. and b.: announcing requests ---- */

static int record(engine_t *e, int from, const char *name, const meta_t *m);
static char *check_agreement(engine_t *e, const pending_t *p);

int hvdl__announce(engine_t *e) {
    buf_t full = {0};
    int nwords = (e->ncache + 63) / 64, nfull = 0;
    uint64_t *bits = calloc((size_t)nwords + 1, 8);
    if (!bits) return -1;
    op_t *o;
    while ((o = hvdl__queue_pop(&e->unsent))) {
        strmap_put(&e->mine, o->name, o);
        if (e->rank == 0) {
            if (record(e, 0, o->name, &o->meta)) { free(bits); buf_free(&full); return -1; }
            continue;
        }
        int id = cache_lookup(e, o->name);
        meta_t cached;
        if (id >= 0 && (cached = cache_meta_for(e, id, e->rank), hvdl__cache_meta_equal(&cached, &o->meta))) {
            bits[id / 64] |= 1ull << (id % 64);
        } else {
            buf_put_str(&full, o->name);
            buf_put(&full, &o->meta, sizeof o->meta);
            nfull++;
        }
    }
    int rc = 0;
    if (e->rank != 0) {
        buf_t msg = {0};
        buf_put_u32(&msg, (uint32_t)nwords);
        buf_put(&msg, bits, 8 * (int64_t)nwords);
        buf_put_u32(&msg, (uint32_t)nfull);
        buf_put(&msg, full.data, full.len);
        rc = hvdl__send_frame(e, 0, MSG_REQUESTS, msg.data, msg.len);
        buf_free(&msg);
    }
    free(bits);
    buf_free(&full);
    return rc;
}

/* ---- c.: rank 0 counts readiness ---- */

static int record(engine_t *e, int from, const char *name, const meta_t *m) {
    coordinator_t *c = e->coord;
    pending_t *p = strmap_get(&c->pending, name);
    if (!p) {
        p = calloc(1, sizeof *p);
        if (!p || !(p->name = strdup(name)) ||
            !(p->metas = calloc((size_t)e->size, sizeof *p->metas)) ||
            !(p->have = calloc((size_t)e->size, 1)) || strmap_put(&c->pending, name, p)) {
            if (p) pending_free(p);
            return -1;
        }
        p->first_at = hvdl_now();
    }
    if (p->have[from]) return 0;   /* refused at enqueue; never twice in flight */
    p->have[from] = 1;
    p->metas[from] = *m;
    if (++p->count < e->size) return 0;
    strmap_del(&c->pending, name);
    p->error = check_agreement(e, p);
    if (c->ready_tail) c->ready_tail->next = p;
    else c->ready_head = p;
    c->ready_tail = p;
    return 0;
}

static int handle_requests(engine_t *e, int from, reader_t *r) {
    uint32_t nwords = rd_u32(r);
    for (uint32_t w = 0; w < nwords && !r->bad; w++) {
        uint64_t word;
        rd_get(r, &word, 8);
        for (int b = 0; b < 64; b++) {
            int id = (int)w * 64 + b;
            if (!(word >> b & 1)) continue;
            if (id >= e->ncache) return -1;
            meta_t m = cache_meta_for(e, id, from);
            if (record(e, from, e->cache[id].name, &m)) return -1;
        }
    }
    uint32_t nfull = rd_u32(r);
    for (uint32_t i = 0; i < nfull && !r->bad; i++) {
        char *name = rd_str(r);
        meta_t m;
        rd_get(r, &m, sizeof m);
        if (!r->bad && record(e, from, name, &m)) { free(name); return -1; }
        free(name);
    }
    return r->bad ? -1 : 0;
}

/* Describe the first field on which ranks disagree, or return 0 if they all agree. */
static void describe_value(const meta_t *m, int field, char *out, size_t cap) {
    switch (field) {
    case 0: snprintf(out, cap, "%s", OP_NAMES[m->op]); break;
    case 1: snprintf(out, cap, "%s", DTYPE_NAMES[m->dtype]); break;
    case 2: {
        int n = snprintf(out, cap, "[");
        for (int d = 0; d < m->ndim && n < (int)cap; d++)
            n += snprintf(out + n, cap - (size_t)n, d ? ", %lld" : "%lld", (long long)m->shape[d]);
        if (n < (int)cap) snprintf(out + n, cap - (size_t)n, "]");
        break;
    }
    case 3: snprintf(out, cap, "%s", REDUCE_NAMES[m->reduce_op]); break;
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
        /* allgather concatenates on the first dimension, which may differ per rank */
        for (int d = a->op == HVDL_OP_ALLGATHER ? 1 : 0; d < a->ndim; d++)
            if (a->shape[d] != b->shape[d]) return 1;
        return 0;
    }
    case 3: return a->op == HVDL_OP_ALLREDUCE && a->reduce_op != b->reduce_op;
    case 4: return a->op == HVDL_OP_BROADCAST && a->root_rank != b->root_rank;
    case 5: return a->prescale != b->prescale || a->postscale != b->postscale;
    default: return a->process_set != b->process_set;
    }
}

static char *check_agreement(engine_t *e, const pending_t *p) {
    for (int f = 0; f < 7; f++) {
        int n_bad = 0;
        for (int r = 1; r < e->size; r++) n_bad += field_differs(&p->metas[0], &p->metas[r], f);
        if (!n_bad) continue;
        char msg[HVDL_MSG_BYTES], val[256];
        describe_value(&p->metas[0], f, val, sizeof val);
        int n = snprintf(msg, sizeof msg, "%s '%s': ranks disagree on %s: rank 0 has %s",
                         OP_NAMES[p->metas[0].op], p->name, FIELD_NAMES[f], val);
        for (int r = 1, shown = 0; r < e->size && n < (int)sizeof msg - 64; r++) {
            if (!field_differs(&p->metas[0], &p->metas[r], f)) continue;
            if (++shown > 6) { n += snprintf(msg + n, sizeof msg - (size_t)n, ", ..."); break; }
            describe_value(&p->metas[r], f, val, sizeof val);
            n += snprintf(msg + n, sizeof msg - (size_t)n, ", rank %d has %s", r, val);
        }
        return strdup(msg);
    }
    return NULL;
}

/* ---- d.: planning, sending and executing responses ---- */

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

/* Append one tensor of a response to the wire form, updating rank 0's cache the same way
 * every worker will when it parses it. A cache hit travels as its id alone. */
static int put_tensor(engine_t *e, buf_t *b, const pending_t *p, int is_error) {
    const meta_t *m = &p->metas[0];
    int gather = m->op == HVDL_OP_ALLGATHER;
    int64_t dim0[e->size];
    for (int r = 0; r < e->size; r++) dim0[r] = gather ? p->metas[r].shape[0] : 0;
    int id = cache_lookup(e, p->name);
    if (!is_error && id >= 0 && hvdl__cache_meta_equal(&e->cache[id].meta, m) &&
        (!gather || !memcmp(e->cache[id].dim0s, dim0, sizeof dim0)))
        return buf_put_u32(b, (uint32_t)id);
    if (is_error) id = -1;
    else if (id < 0 && e->ncache < e->cfg.cache_capacity) id = e->ncache;
    if (id >= 0 && cache_store(e, id, p->name, m, gather ? dim0 : NULL)) return -1;
    return buf_put_u32(b, 0xffffffffu) || buf_put_str(b, p->name) ||
           buf_put_u32(b, (uint32_t)id) || buf_put(b, m, sizeof *m) ||
           (gather && buf_put(b, dim0, sizeof dim0));
}

/* Read one tensor back (workers), mirroring put_tensor's cache update. */
static char *get_tensor(engine_t *e, reader_t *r, int64_t *dim0) {
    uint32_t tag = rd_u32(r);
    if (tag != 0xffffffffu) {
        if (r->bad || tag >= (uint32_t)e->ncache || !e->cache[tag].name) { r->bad = 1; return NULL; }
        if (e->cache[tag].dim0s) memcpy(dim0, e->cache[tag].dim0s, 8 * (size_t)e->size);
        return strdup(e->cache[tag].name);
    }
    char *name = rd_str(r);
    int id = (int)rd_u32(r);
    meta_t m;
    rd_get(r, &m, sizeof m);
    int gather = m.op == HVDL_OP_ALLGATHER;
    if (gather) rd_get(r, dim0, 8 * (int64_t)e->size);
    if (!r->bad && id >= 0 && (id > e->ncache || cache_store(e, id, name, &m, gather ? dim0 : NULL)))
        r->bad = 1;
    return name;
}

static int response_alloc(response_t *r, int n, int size, int gather) {
    r->ntensors = 0;
    r->names = calloc((size_t)n, sizeof(char *));
    r->cache_ids = NULL;
    r->dim0 = gather ? calloc((size_t)n * (size_t)size, 8) : NULL;
    return !r->names || (gather && !r->dim0) ? -1 : 0;
}

/* Take the next group off the ready list: one tensor, or as many compatible allreduces
 * as fit under the fusion threshold (in ready order, skipping incompatible ones). */
static int take_group(engine_t *e, pending_t **group, int cap) {
    coordinator_t *c = e->coord;
    pending_t *first = c->ready_head;
    c->ready_head = first->next;
    group[0] = first;
    int n = 1;
    if (first->error) goto done;
    int64_t bytes = meta_bytes(&first->metas[0]);
    for (pending_t **pp = &c->ready_head; *pp && n < cap;) {
        pending_t *p = *pp;
        int64_t nb = meta_bytes(&p->metas[0]);
        if (fusable(&first->metas[0], &p->metas[0]) && bytes + nb <= e->cfg.fusion_threshold &&
            !p->error) {
            *pp = p->next;
            group[n++] = p;
            bytes += nb;
        } else {
            pp = &p->next;
        }
    }
done:
    c->ready_tail = NULL;
    for (pending_t *p = c->ready_head; p; p = p->next) c->ready_tail = p;
    return n;
}

static int execute_all(engine_t *e, response_t *rs, int n) {
    int rc = 0;
    for (int i = 0; i < n; i++) {
        if (!rc && hvdl__execute(e, &rs[i])) rc = -1;
        hvdl__response_free(&rs[i]);
    }
    free(rs);
    return rc;
}

int hvdl__coordinator_step(engine_t *e) {
    coordinator_t *c = e->coord;
    if (!c->ready_head) return 0;
    buf_t msg = {0};
    int nresp = 0, cap = 8;
    response_t *rs = calloc((size_t)cap, sizeof *rs);
    buf_put_u32(&msg, 0);     /* count, patched below */
    while (c->ready_head && rs) {
        pending_t *group[512];
        int n = take_group(e, group, 512);
        char *err = group[0]->error;
        group[0]->error = NULL;
        if (nresp == cap) rs = realloc(rs, sizeof *rs * (size_t)(cap *= 2));
        response_t *r = &rs[nresp++];
        memset(r, 0, sizeof *r);
        int gather = group[0]->metas[0].op == HVDL_OP_ALLGATHER;
        response_alloc(r, n, e->size, gather);
        r->kind = err ? RESP_ERROR : RESP_OK;
        r->meta = group[0]->metas[0];
        r->error = err;
        buf_put_u32(&msg, (uint32_t)r->kind);
        buf_put(&msg, &r->meta, sizeof r->meta);
        buf_put_u32(&msg, (uint32_t)n);
        for (int i = 0; i < n; i++) {
            put_tensor(e, &msg, group[i], err != NULL);
            r->names[r->ntensors++] = strdup(group[i]->name);
            for (int k = 0; gather && k < e->size; k++)
                r->dim0[(int64_t)i * e->size + k] = group[i]->metas[k].shape[0];
            pending_free(group[i]);
        }
        if (err) buf_put_str(&msg, err);
    }
    if (!rs) return -1;
    memcpy(msg.data, &(uint32_t){(uint32_t)nresp}, 4);
    for (int w = 1; w < e->size; w++) {
        if (hvdl__send_frame(e, w, MSG_RESPONSES, msg.data, msg.len)) {
            buf_free(&msg);
            for (int i = 0; i < nresp; i++) hvdl__response_free(&rs[i]);
            free(rs);
            return -1;
        }
    }
    buf_free(&msg);
    return execute_all(e, rs, nresp);
}

static int handle_responses(engine_t *e, reader_t *r) {
    uint32_t n = rd_u32(r);
    if (r->bad || n > 1u << 24) return -1;
    response_t *rs = calloc(n ? n : 1, sizeof *rs);
    if (!rs) return -1;
    uint32_t got = 0;
    for (; got < n && !r->bad; got++) {
        response_t *x = &rs[got];
        x->kind = (int)rd_u32(r);
        rd_get(r, &x->meta, sizeof x->meta);
        uint32_t nt = rd_u32(r);
        int gather = x->meta.op == HVDL_OP_ALLGATHER;
        if (r->bad || nt > 1u << 24 || response_alloc(x, (int)nt, e->size, gather)) { r->bad = 1; break; }
        for (uint32_t i = 0; i < nt && !r->bad; i++) {
            char *name = get_tensor(e, r, gather ? x->dim0 + (int64_t)i * e->size : NULL);
            if (name) x->names[x->ntensors++] = name;
        }
        if (x->kind == RESP_ERROR) x->error = rd_str(r);
    }
    if (r->bad) {
        for (uint32_t i = 0; i < got; i++) hvdl__response_free(&rs[i]);
        free(rs);
        hvdl__fail(e, HVDL_ERR_SYSTEM, "internal error: a corrupt response list from rank 0");
        return -1;
    }
    return execute_all(e, rs, (int)n);
}

/* ---- shutdown, aborts and the frame dispatcher ---- */

static int begin_shutdown(engine_t *e, int from) {
    coordinator_t *c = e->coord;
    if (c->shutdown_from >= 0) return 0;
    c->shutdown_from = from;
    int32_t who = from;
    for (int w = 1; w < e->size; w++) hvdl__send_frame(e, w, MSG_BYE, &who, sizeof who);
    e->stopped = 1;
    return 0;
}

int hvdl__say_bye(engine_t *e) {
    if (e->rank == 0) return begin_shutdown(e, 0);
    int32_t me = e->rank;
    return hvdl__send_frame(e, 0, MSG_BYE, &me, sizeof me);
}

int hvdl__handle_frame(engine_t *e, int from, int type, const uint8_t *p, int64_t n) {
    reader_t r = {p, n, 0};
    switch (type) {
    case MSG_REQUESTS:
        if (e->rank != 0 || handle_requests(e, from, &r)) {
            hvdl__fail(e, HVDL_ERR_SYSTEM, "internal error: a corrupt request list from rank %d", from);
            return -1;
        }
        return 0;
    case MSG_RESPONSES:
        return handle_responses(e, &r);
    case MSG_BYE:
        if (e->rank == 0) return begin_shutdown(e, from);
        e->stopped = 1;       /* rank 0 says everyone stops */
        return 0;
    case MSG_ABORT: {
        char msg[HVDL_MSG_BYTES];
        snprintf(msg, sizeof msg, "%.*s", (int)(n < HVDL_MSG_BYTES - 1 ? n : HVDL_MSG_BYTES - 1), (const char *)p);
        hvdl__fail(e, HVDL_ERR_PEER_LOST, "%s", msg);
        return -1;
    }
    default:
        hvdl__fail(e, HVDL_ERR_SYSTEM, "internal error: unknown control frame %d from rank %d", type, from);
        return -1;
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
        char missing[512];
        int k = 0;
        for (int r = 0; r < e->size && k < (int)sizeof missing - 16; r++)
            if (!p->have[r]) k += snprintf(missing + k, sizeof missing - (size_t)k, k ? ", %d" : "%d", r);
        if (e->cfg.stall_shutdown > 0 && now - p->first_at > e->cfg.stall_shutdown) {
            hvdl__fail(e, HVDL_ERR_STALLED, "stalled: '%s' was submitted by some ranks %.0f s ago "
                       "but ranks [%s] never submitted it (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS)",
                       p->name, now - p->first_at, missing);
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
