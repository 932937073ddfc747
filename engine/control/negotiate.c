/*
 * Negotiation's one interface (negotiation.h): the choice of implementation, made once
 * at start-up, the rank-0-frames implementation, and what the segment implementations
 * share (the bits rank 0 takes over, the stall scan of a node's words).
 *
 * Through rank 0's frames there is nothing to add to the coordinator: a worker's loop
 * sends its requests in one frame a cycle (announce.c), rank 0 decides and sends the
 * responses, and every rank executes them as they arrive. Its table is made of the
 * shared no-op entries below.
 */
#include "loop.h"
#include "fail.h"
#include "wire.h"
#include "negotiation.h"
#include "net.h"
#include <stdlib.h>
#include <string.h>

int hvdl__negotiation_open(engine_t *e) {
    e->negotiation = &hvdl__negotiate_frames;
    int k = hvdl__negotiate_shm_open(e);
    if (!k) k = hvdl__negotiate_nodes_open(e);
    return k < 0 ? -1 : 0;
}

/* ---- the bits rank 0 takes over ---- */

void hvdl__took_init(took_t *t) {
    t->v = t->inline_v;
    t->n = 0;
    t->cap = (int)(sizeof t->inline_v / sizeof *t->inline_v);
    t->skip_joined = 0;
}

/* The site fires at the first bit taken, before the inline room runs out: the failure
 * takes the path a real one would, and a test need not take over 16 bits at once. */
int hvdl__took_add(engine_t *e, took_t *t, int rank, int id, double since) {
    int inject = HVDL_INJECT(e, INJ_TOOK_ALLOC);
    if (t->n == t->cap || inject) {
        int want = 2 * t->cap;
        size_t bytes = sizeof *t->v * (size_t)want;
        took_bit_t *v = inject ? NULL : t->v == t->inline_v ? malloc(bytes) : realloc(t->v, bytes);
        if (!v) return hvdl__oom(e, "requests taken over from the segment", (int64_t)bytes);
        if (t->v == t->inline_v) memcpy(v, t->inline_v, sizeof t->inline_v);
        t->v = v;
        t->cap = want;
    }
    t->v[t->n++] = (took_bit_t){rank, id, since};
    return 0;
}

void hvdl__took_free(took_t *t) {
    if (t->v != t->inline_v) free(t->v);
    hvdl__took_init(t);
}

/* ---- the stall scan of a node's words (rank 0 on one node, every leader on several) ---- */

double hvdl__stall_after(const engine_t *e) {
    double after = e->cfg.stall_warning;
    if (e->cfg.stall_shutdown > 0 && e->cfg.stall_shutdown < after) after = e->cfg.stall_shutdown;
    return after;
}

/* Cost: one load per word, min(cache size, HVDL_NEG_IDS) words a scan. */
int hvdl__words_scan(
    engine_t *e, words_scan_t *s, _Atomic uint64_t *arrive, double now, double after,
    int (*stuck)(engine_t *e, int id, uint64_t w, double since, double now, took_t *t), took_t *t) {
    for (int id = 0; id < e->ncache && id < HVDL_NEG_IDS; id++) {
        uint64_t w = atomic_load(&arrive[id]);
        if (!(w & HVDL_NEG_MASK) || (w & HVDL_NEG_CLOSED)) {
            s->seen[id] = 0;
        } else if (s->seen[id] != w) {      /* a new round, or a rank has arrived */
            s->seen[id] = w;
            s->seen_at[id] = now;
        } else if (now - s->seen_at[id] >= after) {
            s->seen[id] = 0;
            if (stuck(e, id, w, s->seen_at[id], now, t)) return -1;
        }
    }
    return 0;
}

/* ---- the entries of an implementation that has nothing to do for them ---- */

int hvdl__neg_nothing(engine_t *e) { return 0; }
void hvdl__neg_none(engine_t *e) {}

/* A node's frame, in a job that does not negotiate by nodes, or to a rank that is not
 * the one it is for (negotiate_nodes.c checks the latter itself). */
int hvdl__neg_refuse_frame(engine_t *e, int from, int type, const uint8_t *p, int64_t n,
                           took_t *t) {
    switch (type) {
    case MSG_NODE_DONE: return hvdl__malformed(e, from, "node agreement", "its node has no words");
    case MSG_NODE_POSTED:
        return hvdl__malformed(e, from, "word report", "it leads no node with words");
    case MSG_NODE_CLOSE:
        return hvdl__malformed(e, from, "word closing", "this rank leads no segment");
    default: return hvdl__malformed(e, from, "word reopening", "this rank leads no segment");
    }
}

int hvdl__neg_post_none(engine_t *e, int id) { return 0; }
int hvdl__neg_complete_none(engine_t *e, const int *ids, int n, took_t *t) { return 0; }
int hvdl__neg_withdraw_none(engine_t *e, uint64_t *bits) { return 0; }
int hvdl__neg_close_none(engine_t *e, int from, pending_t *p, const meta_t *m, took_t *t) {
    return 0;
}
int hvdl__neg_took_none(engine_t *e, took_t *t) { return 0; }
int hvdl__neg_settle_none(engine_t *e, const response_t *r, int anyone_joined, took_t *t) {
    return 0;
}
int hvdl__neg_scan_none(engine_t *e, double now, took_t *t) { return 0; }
int hvdl__neg_before_stall_none(engine_t *e, pending_t *p, took_t *t) { return 0; }
void hvdl__neg_applied_none(engine_t *e, const response_t *r) {}
int hvdl__neg_place_now(engine_t *e, response_t *r, int mine) { return 0; }
uint64_t hvdl__neg_position_none(engine_t *e) { return 0; }
int hvdl__neg_finish_none(engine_t *e, uint64_t pos) { return 0; }

/* What an implementation without a log or without rank 0's side leaves as is. */
const negotiation_t hvdl__negotiate_frames = {
    .name = "rank 0's frames",
    .free = hvdl__neg_none,
    .thread_start = hvdl__neg_none,
    .thread_end = hvdl__neg_none,
    .post = hvdl__neg_post_none,
    .complete = hvdl__neg_complete_none,
    .withdraw = hvdl__neg_withdraw_none,
    .close = hvdl__neg_close_none,
    .join = hvdl__neg_took_none,
    .settle = hvdl__neg_settle_none,
    .stall_scan = hvdl__neg_scan_none,
    .before_stall = hvdl__neg_before_stall_none,
    .scan = hvdl__neg_scan_none,
    .watches = hvdl__neg_nothing,
    .applied = hvdl__neg_applied_none,
    .frame = hvdl__neg_refuse_frame,
    HVDL_NEG_NO_LOG,
};
