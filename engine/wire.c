/*
 * The negotiation messages on the wire, and the cache compression in both directions.
 *
 *   MSG_REQUESTS  u32 nwords, nwords x u64 bit vector (one bit per cached request),
 *                 u32 nfull, nfull x { str name, meta, u32 nsplits, nsplits x i64 }
 *   MSG_RESPONSES u32 count, count x response
 *   response      u32 kind, meta, u32 ntensors, ntensors x tensor,
 *                 [alltoall: n x n i64 rows], [error: str message]
 *   tensor        u32 cache id (a hit: name and metadata come from the cache)
 *                 | 0xffffffff, str name, i32 id to store under or -1, meta,
 *                   [allgather: n x i64 first dimensions]
 * Integers are in host order: every rank of a job runs on the same architecture.
 */
#include "internal.h"
#include <stdlib.h>
#include <string.h>

#define FULL_TAG 0xffffffffu

/* ---- requests (every rank -> rank 0) ---- */

int hvdl__announce(engine_t *e) {
    buf_t full = {0};
    int nwords = (e->ncache + 63) / 64, nfull = 0, rc = 0;
    uint64_t *bits = calloc((size_t)nwords + 1, 8);
    if (!bits) return -1;
    op_t *o;
    while ((o = hvdl__queue_pop(&e->unsent))) {
        if (strmap_put(&e->mine, o->name, o)) { rc = -1; break; }
        hvdl__tl_count_step(e, o->name);
        if (o->meta.op == HVDL_OP_JOIN) e->joined = 1;
        if (e->rank == 0) {
            int n = o->splits ? e->sets[o->meta.process_set]->n : 0;
            if ((rc = hvdl__coord_record(e, 0, o->name, &o->meta, o->splits, n))) break;
            continue;
        }
        int id = hvdl__cacheable(&o->meta) ? hvdl__cache_lookup(e, o->name) : -1;
        if (id >= 0) {
            meta_t cached = hvdl__cache_meta_for(e, id, e->rank);
            if (hvdl__cache_meta_equal(&cached, &o->meta)) {
                bits[id / 64] |= 1ull << (id % 64);
                continue;
            }
        }
        int n = o->splits ? e->sets[o->meta.process_set]->n : 0;
        buf_put_str(&full, o->name);
        buf_put(&full, &o->meta, sizeof o->meta);
        buf_put_u32(&full, (uint32_t)n);
        buf_put(&full, o->splits, 8 * (int64_t)n);
        nfull++;
    }
    if (!rc && e->rank != 0) {
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

/* A name from the wire: 1..4096 bytes without NUL (as enqueue requires), or NULL. */
static char *rd_name(reader_t *r) {
    char *name = rd_str(r);
    if (name && (!*name || strlen(name) > 4096)) {
        free(name);
        rd_fail(r, "a name that is empty or longer than 4096 bytes");
        return NULL;
    }
    return name;
}

static int rd_meta(engine_t *e, reader_t *r, meta_t *m) {
    rd_get(r, m, sizeof *m);
    const char *why = r->bad ? NULL : hvdl__meta_problem(e, m);
    return why ? rd_fail(r, why) : (r->bad ? -1 : 0);
}

/* Every count read from the wire is bounded by the bytes left that must carry it. */
static int rd_count(reader_t *r, uint32_t *n, int64_t min_bytes_each) {
    *n = rd_u32(r);
    if (!r->bad && (int64_t)*n > r->left / min_bytes_each) return rd_fail(r, "a count larger than the frame holds");
    return r->bad ? -1 : 0;
}

int hvdl__parse_requests(engine_t *e, int from, reader_t *r) {
    uint32_t nwords, nfull;
    if (rd_count(r, &nwords, 8)) return -1;
    for (uint32_t w = 0; w < nwords && !r->bad; w++) {
        uint64_t word;
        rd_get(r, &word, 8);
        for (int b = 0; b < 64 && !r->bad; b++) {
            int64_t id = (int64_t)w * 64 + b;
            if (!(word >> b & 1)) continue;
            if (id >= e->ncache) return rd_fail(r, "a cache bit for an entry that does not exist");
            meta_t m = hvdl__cache_meta_for(e, (int)id, from);
            if (hvdl__coord_record(e, from, e->cache[id].name, &m, NULL, 0)) return rd_fail(r, "out of memory");
        }
    }
    if (rd_count(r, &nfull, 4 + (int64_t)sizeof(meta_t) + 4)) return -1;
    for (uint32_t i = 0; i < nfull && !r->bad; i++) {
        char *name = rd_name(r);
        meta_t m;
        uint32_t n = 0;
        if (!name || rd_meta(e, r, &m) || rd_count(r, &n, 8) || n > (uint32_t)e->size) {
            free(name);
            return rd_fail(r, "more splits than ranks");
        }
        int64_t splits[n ? n : 1];
        rd_get(r, splits, 8 * (int64_t)n);
        group_t *g = e->sets[m.process_set];
        const char *why = r->bad ? NULL : hvdl__splits_problem(&m, splits, n, g ? g->n : -1);
        int rc = r->bad || why ? rd_fail(r, why) : hvdl__coord_record(e, from, name, &m, n ? splits : NULL, (int)n);
        free(name);
        if (rc) return rd_fail(r, "out of memory");
    }
    if (!r->bad && r->left) return rd_fail(r, "bytes after its last field");
    return r->bad ? -1 : 0;
}

/* ---- responses (rank 0 -> members) ---- */

/* One tensor; a cache hit travels as its id. Updates rank 0's cache exactly as
 * read_tensor will update every worker's. */
static int write_tensor(engine_t *e, buf_t *b, const response_t *r, int i, int n) {
    const meta_t *m = &r->metas[i];
    const int64_t *dim0 = r->dim0 ? r->dim0 + (int64_t)i * n : NULL;
    int id = -1;
    if (r->kind == RESP_OK && hvdl__cacheable(m)) {
        id = hvdl__cache_lookup(e, r->names[i]);
        if (id >= 0 && hvdl__cache_meta_equal(&e->cache[id].meta, m) &&
            (!dim0 || !memcmp(e->cache[id].dim0s, dim0, 8 * (size_t)n)))
            return buf_put_u32(b, (uint32_t)id);
        if (id < 0 && e->ncache < e->cfg.cache_capacity) id = e->ncache;
        if (id >= 0 && hvdl__cache_store(e, id, r->names[i], m, dim0)) return -1;
    }
    return buf_put_u32(b, FULL_TAG) || buf_put_str(b, r->names[i]) || buf_put_u32(b, (uint32_t)id) ||
           buf_put(b, m, sizeof *m) || (dim0 && buf_put(b, dim0, 8 * (int64_t)n));
}

int hvdl__write_response(engine_t *e, buf_t *b, const response_t *r) {
    int n = e->sets[r->meta.process_set]->n;
    if (buf_put_u32(b, (uint32_t)r->kind) || buf_put(b, &r->meta, sizeof r->meta) ||
        buf_put_u32(b, (uint32_t)r->ntensors))
        return -1;
    for (int i = 0; i < r->ntensors; i++)
        if (write_tensor(e, b, r, i, n)) return -1;
    if (r->matrix && buf_put(b, r->matrix, 8 * (int64_t)n * n)) return -1;
    if (r->kind == RESP_ERROR && buf_put_str(b, r->error)) return -1;
    return 0;
}

static char *read_tensor(engine_t *e, reader_t *r, meta_t *m, int64_t *dim0, int n) {
    uint32_t tag = rd_u32(r);
    if (tag != FULL_TAG) {
        if (r->bad || tag >= (uint32_t)e->ncache) { rd_fail(r, "a cache id that does not exist"); return NULL; }
        *m = e->cache[tag].meta;
        if (dim0 && e->cache[tag].dim0s) memcpy(dim0, e->cache[tag].dim0s, 8 * (size_t)n);
        return strdup(e->cache[tag].name);
    }
    char *name = rd_name(r);
    int32_t id = (int32_t)rd_u32(r);
    rd_meta(e, r, m);
    if (dim0) rd_get(r, dim0, 8 * (int64_t)n);
    /* Ids are dense and only the global set is cached (its entries hold size dims). */
    if (!r->bad && id != -1 && (id < 0 || id > e->ncache || !hvdl__cacheable(m) || n != e->size))
        rd_fail(r, "a cache id out of order or for an uncacheable tensor");
    if (!r->bad && id >= 0 && hvdl__cache_store(e, id, name, m, dim0)) rd_fail(r, "out of memory");
    if (r->bad) { free(name); return NULL; }
    return name;
}

static int read_response(engine_t *e, reader_t *r, response_t *x) {
    uint32_t nt;
    x->kind = (int)rd_u32(r);
    if (!r->bad && (x->kind < RESP_OK || x->kind > RESP_SHUTDOWN)) return rd_fail(r, "an unknown response kind");
    if (rd_meta(e, r, &x->meta) || rd_count(r, &nt, 4)) return -1;
    group_t *g = e->sets[x->meta.process_set];
    if (!g || g->me < 0) return rd_fail(r, "a response for a process set this rank is not in");
    int n = g->n;
    /* A cached allgather carries its first dimensions in the cache, not the frame, so
     * the frame cannot bound them: cap the table instead (real ones hold fused tensors
     * times ranks, far below this). */
    if (x->meta.op == HVDL_OP_ALLGATHER && (int64_t)nt * n > (int64_t)1 << 24)
        return rd_fail(r, "an allgather response with too many tensors");
    if (hvdl__response_alloc(x, (int)nt, n, x->meta.op)) return rd_fail(r, "out of memory");
    for (uint32_t i = 0; i < nt && !r->bad; i++) {
        char *name = read_tensor(e, r, &x->metas[i], x->dim0 ? x->dim0 + (int64_t)i * n : NULL, n);
        if (name) x->names[x->ntensors++] = name;
    }
    if (x->matrix) rd_get(r, x->matrix, 8 * (int64_t)n * n);
    if (x->kind == RESP_ERROR) x->error = rd_str(r);
    return r->bad ? -1 : 0;
}

int hvdl__read_responses(engine_t *e, reader_t *r, response_t **out, int *count) {
    uint32_t n;
    if (rd_count(r, &n, 4 + (int64_t)sizeof(meta_t) + 4)) return -1;
    response_t *rs = calloc(n ? n : 1, sizeof *rs);
    if (!rs) return rd_fail(r, "out of memory");
    for (uint32_t i = 0; i < n; i++) {
        if (read_response(e, r, &rs[i]) || (i == n - 1 && r->left && rd_fail(r, "bytes after its last field"))) {
            for (uint32_t k = 0; k <= i; k++) hvdl__response_free(&rs[k]);
            free(rs);
            return -1;
        }
    }
    *out = rs;
    *count = (int)n;
    return 0;
}

int hvdl__response_alloc(response_t *r, int ntensors, int n, int op) {
    r->ntensors = 0;
    r->names = calloc((size_t)ntensors + 1, sizeof(char *));
    r->metas = calloc((size_t)ntensors + 1, sizeof(meta_t));
    r->dim0 = op == HVDL_OP_ALLGATHER ? calloc((size_t)ntensors * (size_t)n + 1, 8) : NULL;
    r->matrix = op == HVDL_OP_ALLTOALL ? calloc((size_t)n * (size_t)n, 8) : NULL;
    return !r->names || !r->metas || (op == HVDL_OP_ALLGATHER && !r->dim0) ||
           (op == HVDL_OP_ALLTOALL && !r->matrix) ? -1 : 0;
}

void hvdl__response_free(response_t *r) {
    for (int i = 0; i < r->ntensors; i++) free(r->names[i]);
    free(r->names);
    free(r->metas);
    free(r->dim0);
    free(r->matrix);
    free(r->error);
    free(r->ready_at);
    memset(r, 0, sizeof *r);
}
