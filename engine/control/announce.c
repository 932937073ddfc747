/*
 * Announcing: this rank's side of negotiation. Each cycle the loop hands over the
 * requests enqueued since the last one; they become this rank's in-flight ops (`mine`,
 * matched later against rank 0's responses) and travel to rank 0 in one MSG_REQUESTS
 * frame. A request whose name and metadata equal its response-cache entry travels as
 * one bit; any other travels in full (wire.c encodes). Rank 0 announces to its own
 * coordinator in memory. In a one-node job a request equal to its cache entry is posted
 * in the segment instead (negotiate_shm.c), and goes through rank 0 only when rank 0
 * has closed its id; on several nodes, it is posted in the node's segment and the rank
 * that completes the node's word tells rank 0 for all of them (negotiate_nodes.c).
 */
#include "loop.h"
#include "fail.h"
#include "wire.h"
#include "negotiation.h"
#include "net.h"
#include <stdlib.h>
#include <string.h>

/* Ids this rank completed in its segment: the negotiation publishes them (rank 0, on
 * several nodes: the bits it takes, which its coordinator records). */
static int complete(engine_t *e, const int *done, int ndone) {
    took_t t;
    hvdl__took_init(&t);
    int rc = e->negotiation->complete(e, done, ndone, &t) || hvdl__coordinator_take_bits(e, &t);
    hvdl__took_free(&t);
    return rc ? -1 : 0;
}

int hvdl__announce(engine_t *e) {
    buf_t full = {0};
    int nwords = (e->ncache + 63) / 64, nfull = 0, nbits = 0, ndone = 0, rc = 0;
    /* One allocation: the bit vector, then the ids this rank completes in its segment
     * (negotiate_shm.c; at most one per cache entry, as one op per name is in flight). */
    size_t bytes = 8 * ((size_t)nwords + 1) + sizeof(int) * (size_t)e->ncache;
    uint64_t *bits = HVDL_INJECT(e, INJ_ANNOUNCE_ALLOC) ? NULL : malloc(bytes);
    if (!bits) return hvdl__oom(e, "request bit vector", (int64_t)bytes);
    memset(bits, 0, 8 * ((size_t)nwords + 1));
    int *done = (int *)(bits + nwords + 1);
    op_t *o;
    while ((o = hvdl__queue_pop(&e->unsent))) {
        if (strmap_put(&e->mine, o->name, o)) {
            rc = hvdl__oom(e, "request table", (int64_t)strlen(o->name));
            break;
        }
        hvdl__tl_count_step(e, o->name);
        if (o->meta.op == HVDL_OP_JOIN) {
            e->joined = 1;
            /* what this rank posted goes ahead of its join: what it completed, and (on
             * several nodes) its bits still waiting in words, taken back */
            if (ndone && (rc = complete(e, done, ndone))) break;
            ndone = 0;
            int k = e->negotiation->withdraw(e, bits);
            nbits += k;
            for (int id = 0; e->rank == 0 && k && id < e->ncache; id++) {
                if (!(bits[id / 64] >> (id % 64) & 1)) continue;
                bits[id / 64] &= ~(1ull << (id % 64));
                meta_t m = hvdl__cache_meta_for(e, id, 0);
                if ((rc = hvdl__coord_record(e, 0, e->cache[id].name, &m, NULL, 0))) break;
            }
            if (rc) break;
        }
        int n = o->splits ? e->sets[o->meta.process_set]->n : 0;
        int id = hvdl__cacheable(&o->meta) ? hvdl__cache_lookup(e, o->name) : -1;
        if (id >= 0) {
            meta_t cached = hvdl__cache_meta_for(e, id, e->rank);
            if (!hvdl__cache_meta_equal(&cached, &o->meta)) id = -1;
        }
        int posted = id < 0 ? 0 : e->negotiation->post(e, id);
        if (posted == 2) { done[ndone++] = id; /* ids are distinct: one op per name in flight */ }
        if (posted) continue;
        if (e->rank == 0) {
            if ((rc = hvdl__coord_record(e, 0, o->name, &o->meta, o->splits, n))) break;
            continue;
        }
        if (id >= 0) {
            bits[id / 64] |= 1ull << (id % 64);
            nbits++;
            continue;
        }
        if (hvdl__put_request(&full, o->name, &o->meta, o->splits, n)) {
            rc = hvdl__oom(e, "request frame", full.len);
            break;
        }
        nfull++;
    }
    if (!rc && ndone) rc = complete(e, done, ndone);
    if (!rc && e->rank != 0 && (nbits || nfull)) {
        buf_t msg = {0};
        rc = hvdl__write_requests(&msg, bits, nwords, nfull, &full)
                 ? hvdl__oom(e, "request frame", full.len)
                 : hvdl__send_frame(e, 0, MSG_REQUESTS, msg.data, msg.len);
        buf_free(&msg);
    }
    free(bits);
    buf_free(&full);
    return rc;
}
