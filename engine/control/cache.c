/*
 * The response cache (Horovod's ResponseCache, simplified): name -> the request every rank
 * agreed on last time, under an id that is the same on every rank.
 *
 * It makes repeated negotiation cheap in both directions: a worker whose request equals
 * the cached one sends one bit instead of name and metadata, and rank 0 answers with the
 * 4-byte id instead of the name. Ids are assigned by rank 0 only, in response order, and
 * every rank applies responses in that same order, so the caches never diverge. Entries
 * are never evicted: past HOROVOD_CACHE_CAPACITY new names are simply not cached. Only
 * the global process set is cached, because only its responses reach every rank.
 *
 * Negotiation keeps it, never the codec: rank 0 assigns ids as it plans each response
 * (hvdl__cache_assign), and a worker applies each response it receives, in order, before
 * executing any (hvdl__cache_apply).
 */
#include "fail.h"
#include "control.h"
#include <stdlib.h>
#include <string.h>

int hvdl__cache_meta_equal(const meta_t *a, const meta_t *b) {
    if (a->op != b->op || a->dtype != b->dtype || a->reduce_op != b->reduce_op ||
        a->root_rank != b->root_rank || a->process_set != b->process_set || a->ndim != b->ndim ||
        a->prescale != b->prescale || a->postscale != b->postscale)
        return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return 0;
    return 1;
}

int hvdl__cacheable(const meta_t *m) {
    return m->process_set == 0 && m->op != HVDL_OP_ALLTOALL && m->op != HVDL_OP_JOIN;
}

int hvdl__cache_lookup(engine_t *e, const char *name) {
    intptr_t v = (intptr_t)strmap_get(&e->cache_by_name, name);
    return (int)v - 1;
}

/* The cached request of global rank `rank` (allgather's first dimension differs per rank). */
meta_t hvdl__cache_meta_for(engine_t *e, int id, int rank) {
    meta_t m = e->cache[id].meta;
    if (e->cache[id].dim0s) m.shape[0] = e->cache[id].dim0s[rank];
    return m;
}

static int cache_store(engine_t *e, int id, const char *name, const meta_t *m,
                       const int64_t *dim0) {
    if (id > e->ncache) return -1;          /* ids are dense: a gap means divergence */
    if (id == e->ncache) {
        cache_entry_t *c = HVDL_INJECT(e, INJ_CACHE_ALLOC)
                               ? NULL
                               : realloc(e->cache, sizeof *c * (size_t)(id + 1));
        if (!c) return -1;
        memset(c + id, 0, sizeof *c);
        e->cache = c;
        e->ncache = id + 1;
    }
    cache_entry_t *c = &e->cache[id];
    if (!c->name) {
        if (!(c->name = strdup(name)) ||
            strmap_put(&e->cache_by_name, name, (void *)(intptr_t)(id + 1)))
            return -1;
    }
    c->meta = *m;
    free(c->dim0s);
    c->dim0s = NULL;
    if (dim0) {
        if (!(c->dim0s = malloc(sizeof(int64_t) * (size_t)e->size))) return -1;
        memcpy(c->dim0s, dim0, sizeof(int64_t) * (size_t)e->size);
    }
    return 0;
}

/* Rank 0, as it plans r: which tensors travel as their cache id alone, and the ids new
 * entries are stored under (workers store them under the same ids). */
int hvdl__cache_assign(engine_t *e, response_t *r) {
    int n = e->sets[r->meta.process_set]->n;
    for (int i = 0; i < r->ntensors; i++) {
        const meta_t *m = &r->metas[i];
        const int64_t *dim0 = r->dim0 ? r->dim0 + (int64_t)i * n : NULL;
        int id = -1;
        r->cached[i] = 0;
        if (r->kind == RESP_OK && hvdl__cacheable(m)) {
            id = hvdl__cache_lookup(e, r->names[i]);
            if (id >= 0 && hvdl__cache_meta_equal(&e->cache[id].meta, m) &&
                (!dim0 || !memcmp(e->cache[id].dim0s, dim0, 8 * (size_t)n))) {
                r->cached[i] = 1;
                r->cache_id[i] = id;
                continue;
            }
            if (id < 0 && e->ncache < e->cfg.cache_capacity) id = e->ncache;
            if (id >= 0 && cache_store(e, id, r->names[i], m, dim0))
                return hvdl__oom(e, "response-cache entry", (int64_t)sizeof(cache_entry_t));
        }
        r->cache_id[i] = id;
    }
    return 0;
}

int hvdl__cache_apply(engine_t *e, response_t *r, const char **why) {
    int n = e->sets[r->meta.process_set]->n;
    *why = NULL;
    for (int i = 0; i < r->ntensors; i++) {
        int32_t id = r->cache_id[i];
        int64_t *dim0 = r->dim0 ? r->dim0 + (int64_t)i * n : NULL;
        if (r->cached[i]) {
            if (id < 0 || id >= e->ncache) {
                *why = "a cache id that does not exist";
                return -1;
            }
            r->metas[i] = e->cache[id].meta;
            if (dim0 && e->cache[id].dim0s) memcpy(dim0, e->cache[id].dim0s, 8 * (size_t)n);
            if (!(r->names[i] = strdup(e->cache[id].name)))
                return hvdl__oom(e, "tensor name", (int64_t)strlen(e->cache[id].name));
            continue;
        }
        if (id == -1) continue;
        /* Ids are dense and only the global set is cached (its entries hold size dims). */
        if (id < 0 || id > e->ncache || !hvdl__cacheable(&r->metas[i]) || n != e->size) {
            *why = "a cache id out of order or for an uncacheable tensor";
            return -1;
        }
        if (cache_store(e, id, r->names[i], &r->metas[i], dim0))
            return hvdl__oom(e, "response-cache entry", (int64_t)sizeof(cache_entry_t));
    }
    return 0;
}

void hvdl__cache_free(engine_t *e) {
    for (int i = 0; i < e->ncache; i++) {
        free(e->cache[i].name);
        free(e->cache[i].dim0s);
    }
    free(e->cache);
    e->cache = NULL;
    e->ncache = 0;
    strmap_free(&e->cache_by_name);
}
