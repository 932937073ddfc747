/*
 * The negotiation messages on the wire: pure encode and decode. Nothing here changes
 * engine state; the response cache is consulted and updated by negotiation (cache.c),
 * which decides which tensors travel as a cache id.
 *
 *   MSG_REQUESTS  u32 nwords, nwords x u64 bit vector (one bit per cached request),
 *                 u32 nfull, nfull x { str name, meta, u32 nsplits, nsplits x i64 }
 *   MSG_RESPONSES u32 count, count x response
 *   response      u32 kind, meta, u32 ntensors, ntensors x tensor,
 *                 [alltoall: n x n i64 rows], [error: str message]
 *   tensor        u32 cache id (a hit: name and metadata come from the cache)
 *                 | 0xffffffff, str name, i32 id to store under or -1, meta,
 *                   [allgather: n x i64 first dimensions]
 * The small frames (goodbye, clock sync, the nodes' frames) are laid out in frames.h.
 * Integers are in host order: every rank of a job runs on the same architecture. Every
 * count is bounded by the bytes that carry it, and every field is checked
 * (wire_check.c) before anything trusts it. Running out of memory while decoding is
 * this rank's failure, not the sender's: it is marked with rd_oom, and the loop reports
 * it as such (loop.c), never as a malformed frame.
 */
#include "wire.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FULL_TAG 0xffffffffu

/* ---- requests (every rank -> rank 0) ---- */

int hvdl__put_request(buf_t *full, const char *name, const meta_t *m, const int64_t *splits,
                      int n) {
    return buf_put_str(full, name) || buf_put(full, m, sizeof *m) ||
           buf_put_u32(full, (uint32_t)n) || buf_put(full, splits, 8 * (int64_t)n);
}

int hvdl__write_requests(buf_t *msg, const uint64_t *bits, int nwords, int nfull,
                         const buf_t *full) {
    return buf_put_u32(msg, (uint32_t)nwords) || buf_put(msg, bits, 8 * (int64_t)nwords) ||
           buf_put_u32(msg, (uint32_t)nfull) || buf_put(msg, full->data, full->len);
}

#define STR_(x) #x
#define STR(x) STR_(x) /* a number's digits, for a reason that must be a literal */

/* A name from the wire: 1..HVDL_MAX_NAME bytes without NUL (as enqueue requires), or NULL. */
static char *rd_name(reader_t *r) {
    char *name = rd_str(r);
    if (name && (!*name || strlen(name) > HVDL_MAX_NAME)) {
        free(name);
        rd_fail(r, "a name that is empty or longer than " STR(HVDL_MAX_NAME) " bytes");
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
    if (!r->bad && (int64_t)*n > r->left / min_bytes_each)
        return rd_fail(r, "a count larger than the frame holds");
    return r->bad ? -1 : 0;
}

int hvdl__read_requests(engine_t *e, reader_t *r, request_list_t *out) {
    uint32_t nwords, nfull;
    memset(out, 0, sizeof *out);
    if (rd_count(r, &nwords, 8)) return -1;
    for (uint32_t w = 0; w < nwords && !r->bad; w++) {
        uint64_t word;
        rd_get(r, &word, 8);
        for (int b = 0; b < 64 && !r->bad && word; b++) {
            if (!(word >> b & 1)) continue;
            if (out->nhits % 64 == 0) {
                uint32_t *h = realloc(out->hits, sizeof *h * (size_t)(out->nhits + 64));
                if (!h) return rd_oom(r, "request list", (int64_t)sizeof *h * (out->nhits + 64));
                out->hits = h;
            }
            out->hits[out->nhits++] = w * 64 + (uint32_t)b;
        }
    }
    if (rd_count(r, &nfull, 4 + (int64_t)sizeof(meta_t) + 4)) return -1;
    if (nfull &&
        (HVDL_INJECT(e, INJ_DECODE_ALLOC) || !(out->full = calloc(nfull, sizeof *out->full))))
        return rd_oom(r, "request list", (int64_t)nfull * (int64_t)sizeof *out->full);
    for (uint32_t i = 0; i < nfull && !r->bad; i++) {
        request_t *q = &out->full[out->nfull];
        uint32_t n = 0;
        if (!(q->name = rd_name(r)) || rd_meta(e, r, &q->meta) || rd_count(r, &n, 8) ||
            n > (uint32_t)e->size) {
            free(q->name);
            q->name = NULL;
            return rd_fail(r, "more splits than ranks");
        }
        out->nfull++;
        if (n) {
            if (HVDL_INJECT(e, INJ_DECODE_ALLOC) || !(q->splits = malloc(8 * (size_t)n)))
                return rd_oom(r, "request's splits", 8 * (int64_t)n);
            rd_get(r, q->splits, 8 * (int64_t)n);
            q->nsplits = n;
        }
        group_t *g = e->sets[q->meta.process_set];
        const char *why = r->bad ? NULL
                                 : hvdl__splits_problem(&q->meta, q->splits, n, g ? g->n : -1);
        if (r->bad || why) return rd_fail(r, why);
    }
    if (!r->bad && r->left) return rd_fail(r, "bytes after its last field");
    return r->bad ? -1 : 0;
}

void hvdl__request_list_free(request_list_t *l) {
    for (int i = 0; i < l->nfull; i++) {
        free(l->full[i].name);
        free(l->full[i].splits);
    }
    free(l->full);
    free(l->hits);
    memset(l, 0, sizeof *l);
}

/* ---- responses (rank 0 -> members) ---- */

/* One tensor: its cache id alone if it is cached, else in full (cache.c decided). */
static int write_tensor(buf_t *b, const response_t *r, int i, int n) {
    if (r->cached[i]) return buf_put_u32(b, (uint32_t)r->cache_id[i]);
    const int64_t *dim0 = r->dim0 ? r->dim0 + (int64_t)i * n : NULL;
    return buf_put_u32(b, FULL_TAG) || buf_put_str(b, r->names[i]) ||
           buf_put_u32(b, (uint32_t)r->cache_id[i]) ||
           buf_put(b, &r->metas[i], sizeof r->metas[i]) ||
           (dim0 && buf_put(b, dim0, 8 * (int64_t)n));
}

int hvdl__write_response(engine_t *e, buf_t *b, const response_t *r) {
    int n = e->sets[r->meta.process_set]->n;
    if (buf_put_u32(b, (uint32_t)r->kind) || buf_put(b, &r->meta, sizeof r->meta) ||
        buf_put_u32(b, (uint32_t)r->ntensors))
        return -1;
    for (int i = 0; i < r->ntensors; i++)
        if (write_tensor(b, r, i, n)) return -1;
    if (r->matrix && buf_put(b, r->matrix, 8 * (int64_t)n * n)) return -1;
    if (r->kind != RESP_OK && buf_put_str(b, r->error)) return -1;
    return 0;
}

/* One tensor: a cache id (names[i] stays NULL until cache.c fills it) or in full. */
static int read_tensor(engine_t *e, reader_t *r, response_t *x, int i, int n) {
    uint32_t tag = rd_u32(r);
    if (r->bad) return -1;
    if (tag != FULL_TAG) {
        if (tag > INT32_MAX) return rd_fail(r, "a cache id that does not exist");
        x->cached[i] = 1;
        x->cache_id[i] = (int32_t)tag;
        return 0;
    }
    char *name = rd_name(r);
    x->names[i] = name;
    x->cache_id[i] = (int32_t)rd_u32(r);
    rd_meta(e, r, &x->metas[i]);
    if (x->dim0) rd_get(r, x->dim0 + (int64_t)i * n, 8 * (int64_t)n);
    if (!r->bad && x->cache_id[i] < -1)
        rd_fail(r, "a cache id out of order or for an uncacheable tensor");
    return r->bad ? -1 : 0;
}

static int read_response(engine_t *e, reader_t *r, response_t *x) {
    uint32_t nt;
    x->kind = (int)rd_u32(r);
    if (!r->bad && (x->kind < RESP_OK || x->kind > RESP_SHUTDOWN))
        return rd_fail(r, "an unknown response kind");
    if (rd_meta(e, r, &x->meta) || rd_count(r, &nt, 4)) return -1;
    group_t *g = e->sets[x->meta.process_set];
    if (!g || g->me < 0) return rd_fail(r, "a response for a process set this rank is not in");
    if (nt > HVDL_MAX_FUSED) return rd_fail(r, "more tensors than one response may carry");
    int n = g->n;
    if (hvdl__response_alloc(x, (int)nt, n, x->meta.op))
        return rd_oom(r, "response", (int64_t)nt * n * 8);
    for (uint32_t i = 0; i < nt && !r->bad; i++) {
        x->ntensors++;
        if (read_tensor(e, r, x, (int)i, n)) break;
    }
    if (x->matrix) rd_get(r, x->matrix, 8 * (int64_t)n * n);
    if (x->kind != RESP_OK) x->error = rd_str(r);
    return r->bad ? -1 : 0;
}

int hvdl__read_responses(engine_t *e, reader_t *r, response_t **out, int *count) {
    uint32_t n;
    if (rd_count(r, &n, 4 + (int64_t)sizeof(meta_t) + 4)) return -1;
    response_t *rs = HVDL_INJECT(e, INJ_DECODE_ALLOC) ? NULL : calloc(n ? n : 1, sizeof *rs);
    if (!rs) return rd_oom(r, "response list", (int64_t)(n ? n : 1) * (int64_t)sizeof *rs);
    for (uint32_t i = 0; i < n; i++) {
        if (read_response(e, r, &rs[i]) ||
            (i == n - 1 && r->left && rd_fail(r, "bytes after its last field"))) {
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
    r->cache_id = calloc((size_t)ntensors + 1, sizeof(int32_t));
    r->cached = calloc((size_t)ntensors + 1, 1);
    r->dim0 = op == HVDL_OP_ALLGATHER ? calloc((size_t)ntensors * (size_t)n + 1, 8) : NULL;
    r->matrix = op == HVDL_OP_ALLTOALL ? calloc((size_t)n * (size_t)n, 8) : NULL;
    return !r->names || !r->metas || !r->cache_id || !r->cached ||
                   (op == HVDL_OP_ALLGATHER && !r->dim0) || (op == HVDL_OP_ALLTOALL && !r->matrix)
               ? -1
               : 0;
}

void hvdl__response_free(response_t *r) {
    for (int i = 0; i < r->ntensors; i++) free(r->names[i]);
    free(r->names);
    free(r->metas);
    free(r->cache_id);
    free(r->cached);
    free(r->dim0);
    free(r->matrix);
    free(r->error);
    free(r->ready_at);
    memset(r, 0, sizeof *r);
}

/* ---- the small frames (frames.h) ---- */

/* The frame must end where its fields do. */
static int rd_end(reader_t *r) {
    if (!r->bad && r->left) return rd_fail(r, "bytes after its last field");
    return r->bad ? -1 : 0;
}

int64_t hvdl__put_bye(uint8_t *out, const bye_t *b) {
    memcpy(out, &b->who, 4);
    if (!b->has_pos) return 4;
    int n = b->ntext < 0 ? 0 : b->ntext > HVDL_BYE_TEXT ? HVDL_BYE_TEXT : b->ntext;
    memcpy(out + 4, &b->pos, 8);
    if (n) memcpy(out + 12, b->text, (size_t)n);
    return 12 + n;
}

int hvdl__read_bye(reader_t *r, bye_t *out) {
    memset(out, 0, sizeof *out);
    if (r->left > HVDL_BYE_MAX) return rd_fail(r, "a goodbye longer than its fields");
    rd_get(r, &out->who, 4);
    if (!r->bad && r->left) {
        out->has_pos = 1;
        rd_get(r, &out->pos, 8);
        if (!r->bad) {               /* the rest is text: any byte is harmless in %.*s */
            out->text = (const char *)r->p;
            out->ntext = (int)r->left;
            r->p += r->left;
            r->left = 0;
        }
    }
    return rd_end(r);
}

int hvdl__read_ping(reader_t *r) { return rd_end(r); }

void hvdl__put_pong(uint8_t *out, double wall_us) { memcpy(out, &wall_us, HVDL_PONG_BYTES); }

int hvdl__read_pong(reader_t *r, double *wall_us) {
    rd_get(r, wall_us, HVDL_PONG_BYTES);
    return rd_end(r);
}

int64_t hvdl__put_words(uint8_t *out, const void *values, int n) {
    if (n > 0) memcpy(out, values, 4 * (size_t)n);
    return 4 * (int64_t)n;
}

int hvdl__read_words(reader_t *r, uint32_t *out, int *n) {
    *n = 0;
    if (r->left % 4) return rd_fail(r, "a length that is not a whole number of 4-byte values");
    if (r->left > 4 * (int64_t)HVDL_NEG_IDS)
        return rd_fail(r, "more values than a segment has cache ids");
    *n = (int)(r->left / 4);
    rd_get(r, out, r->left);
    return rd_end(r);
}

void hvdl__put_node_posted(uint8_t *out, const node_posted_t *m) {
    memset(out, 0, HVDL_NODE_POSTED_BYTES);
    memcpy(out, &m->id, 4);
    memcpy(out + 8, &m->mask, 8);
    memcpy(out + 16, &m->waited, 8);
}

int hvdl__read_node_posted(reader_t *r, node_posted_t *out) {
    uint32_t pad;
    rd_get(r, &out->id, 4);
    rd_get(r, &pad, 4);              /* ignored, as it always was */
    rd_get(r, &out->mask, 8);
    rd_get(r, &out->waited, 8);
    return rd_end(r);
}

void hvdl__put_node_close(uint8_t *out, const node_close_t *m) {
    memcpy(out, &m->id, 4);
    memcpy(out + 4, &m->round, 4);
}

int hvdl__read_node_close(reader_t *r, node_close_t *out) {
    rd_get(r, &out->id, 4);
    rd_get(r, &out->round, 4);
    return rd_end(r);
}

/* ---- a rank's wait report (MSG_WAITS, deadlock.c) ---- */

/* The bindings negotiate a request as "<kind>.<name>" ("p2p.<name>" for a send or recv),
 * with "@set<id>" on a process set's ops (horovodlike/common/request.py, engine_name):
 * the one place the engine reads that form. The set is its own field (a report's entries
 * carry it, as a request's metadata does), so only a set's suffix is cut, never parsed. */
const char *hvdl__user_name(const char *name, int op, int set, char *out, size_t cap) {
    const char *dot = strchr(name, '.');
    const char *kind = strstr(name, op >= HVDL_OP_SEND ? "p2p" : hvdl_op_name(op));
    const char *s = dot && kind && kind < dot ? dot + 1 : name;
    size_t n = strlen(s);
    const char *at = strrchr(s, '@');
    if (at && !strncmp(at, "@set", 4) && set) n = (size_t)(at - s);
    snprintf(out, cap, "%.*s", (int)n, s);
    return out;
}

int hvdl__put_waits(buf_t *b, const wait_report_t *w) {
    uint8_t partial = (uint8_t)w->partial;
    int rc = buf_put(b, &w->posts, 8) || buf_put(b, &w->blocked_for, 8) ||
             buf_put(b, &partial, 1) || buf_put_u32(b, (uint32_t)w->n);
    for (int i = 0; !rc && i < w->n; i++) {
        const wait_entry_t *x = &w->ops[i];
        rc = buf_put(b, &x->op, 4) || buf_put(b, &x->set, 4) || buf_put(b, &x->peer, 4) ||
             buf_put(b, &x->waited, 1) || buf_put_str(b, x->name);
    }
    return rc;
}

void hvdl__waits_clear(wait_report_t *w) {
    for (int i = 0; i < w->n; i++) free(w->ops[i].name);
    free(w->ops);
    memset(w, 0, sizeof *w);
}

/* An entry's kind, set and peer: a collective has no peer; a send or recv's peer is
 * another rank of the job. */
static const char *entry_problem(const wait_entry_t *x, int size, int from) {
    if (x->op < 0 || x->op > HVDL_OP_RECV) return "an op kind out of range";
    if (x->set < 0 || x->set >= HVDL_MAX_SETS) return "a process set out of range";
    if (x->op < HVDL_OP_SEND ? x->peer != -1 : x->peer < 0 || x->peer >= size || x->peer == from)
        return "a peer rank out of range";
    if (x->waited > 1) return "a waited flag that is neither 0 nor 1";
    return NULL;
}

int hvdl__read_waits(engine_t *e, reader_t *r, int from, wait_report_t *out) {
    memset(out, 0, sizeof *out);
    int size = e ? e->size : 1 << 20;
    uint8_t partial = 0;
    uint32_t n = 0;
    rd_get(r, &out->posts, 8);
    rd_get(r, &out->blocked_for, 8);
    rd_get(r, &partial, 1);
    if (!r->bad && partial > 1) rd_fail(r, "a partial flag that is neither 0 nor 1");
    out->partial = partial;
    /* an entry is at least 13 bytes and a name's length word and one byte */
    if (!r->bad && !rd_count(r, &n, 18) && n > HVDL_WAITS_MAX)
        rd_fail(r, "it lists more ops than a report may");
    if (!r->bad && n &&
        ((e && HVDL_INJECT(e, INJ_WAIT_ALLOC)) || !(out->ops = calloc(n, sizeof *out->ops))))
        rd_oom(r, "wait report", (int64_t)n * (int64_t)sizeof *out->ops);
    for (uint32_t i = 0; !r->bad && i < n; i++) {
        wait_entry_t *x = &out->ops[i];
        rd_get(r, &x->op, 4);
        rd_get(r, &x->set, 4);
        rd_get(r, &x->peer, 4);
        rd_get(r, &x->waited, 1);
        const char *why = r->bad ? NULL : entry_problem(x, size, from);
        if (why) rd_fail(r, why);
        if (!r->bad && !(x->name = rd_name(r))) break;
        out->n++;
    }
    if (!r->bad) rd_end(r);
    if (r->bad) hvdl__waits_clear(out);
    return r->bad ? -1 : 0;
}
