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
 */
#include "internal.h"
#include <stdlib.h>
#include <string.h>

int hvdl__cache_meta_equal(const meta_t *a, const meta_t *b) {
    if (a->op != b->op || a->dtype != b->dtype || a->reduce_op != b->reduce_op ||
        a->root_rank != b->root_rank || a->process_set != b->process_set ||
        a->ndim != b->ndim || a->prescale != b->prescale || a->postscale != b->postscale)
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

int hvdl__cache_store(engine_t *e, int id, const char *name, const meta_t *m, const int64_t *dim0) {
    if (id > e->ncache) return -1;          /* ids are dense: a gap means divergence */
    if (id == e->ncache) {
        cache_entry_t *c = realloc(e->cache, sizeof *c * (size_t)(id + 1));
        if (!c) return -1;
        memset(c + id, 0, sizeof *c);
        e->cache = c;
        e->ncache = id + 1;
    }
    cache_entry_t *c = &e->cache[id];
    if (!c->name) {
        if (!(c->name = strdup(name)) || strmap_put(&e->cache_by_name, name, (void *)(intptr_t)(id + 1)))
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
