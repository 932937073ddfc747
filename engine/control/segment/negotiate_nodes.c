/*
 * Hierarchical negotiation: in a job on several nodes, the ranks of a node agree on their
 * cached requests in their segment first, and one frame per node tells rank 0.
 *
 * Through rank 0 alone (coordinator.c), every rank sends a frame for every op and rank
 * 0 handles size frames per op. Here each cache id has an arrival word in each node's
 * segment: one bit per local rank, the round it belongs to, and CLOSED. The rank whose
 * compare-and-swap completes its node's mask sends rank 0 one MSG_NODE_DONE frame with
 * every id it completed in that announcement; rank 0 records the request of every rank
 * of that node (their cached requests: a bit means "equal to my cache entry"). Rank 0
 * handles nodes frames per op, not ranks. Responses still reach every rank as frames:
 * the order they fix is what every rank must share, and rank 0 alone decides it.
 *
 * Rounds. A rank's round of an id is how many responses naming it the rank has applied
 * (rank 0: planned); every response naming a cached name reaches every rank, so the
 * rounds agree. A word holds the round its bits belong to. A word is closed for one
 * round: its posts go through rank 0 for that round, and the first post of the next
 * round opens it again. Nobody has to reopen it in time, which rank 0 could not do for
 * a segment it cannot touch.
 *
 * Everything rank 0 checks still holds, because posted bits reach it whenever it needs
 * them (as a took_t, negotiation.h, that the coordinator records), exactly once (a bit
 * is either in a completed word, reported by its completer, or taken out by one swap
 * that closes the word, reported by the node's leader):
 *   a request for a cached name from rank q that reaches rank 0 otherwise (its
 *     metadata changed, or its word was closed) closes that name's word on q's node
 *     for the round (MSG_NODE_CLOSE to the node's leader, its lowest rank), and the
 *     leader returns the bits it took (MSG_NODE_POSTED): a mismatch is named at once,
 *     naming the ranks, as on one node;
 *   every leader scans its words: one stuck partly set in one round for half the stall
 *     warning time is closed and its bits reported, dated, so that rank 0's stall
 *     inspector names exactly the ranks that never submitted;
 *   a join closes every word of every node until it ends (the joined rank never posts),
 *     and its end sets each word closed for the round rank 0 has reached
 *     (MSG_NODE_REOPEN): each id then takes one round through rank 0 and reopens. The
 *     joining rank first takes its own waiting bits back and sends them ahead of its
 *     join (withdraw), so what it submitted counts as submitted.
 * A bit sent in a frame is always safe: rank 0 takes it like any other request.
 *
 * Cost of a repeated op on N nodes of L ranks: one CAS per rank, one small frame per
 * node to rank 0 (instead of one per rank), and rank 0's bookkeeping per node. A leader
 * reads min(cache size, 4096) words once a second.
 */
#include "fail.h"
#include "negotiation.h"
#include "wire.h"
#include "net.h"
#include "shm.h"
#include <stdlib.h>
#include <string.h>

#define NEG_IDS HVDL_NEG_IDS
#define MASK HVDL_NEG_MASK
#define ROUND_SHIFT HVDL_NEG_MAX_RANKS
#define ROUND_MOD ((1ull << 23) - 1) /* rounds count modulo this */
#define ROUND_JOIN ROUND_MOD         /* closed while a join lasts: no round opens it */
#define CLOSED HVDL_NEG_CLOSED
#define ROUND_OF(w) (((w) >> ROUND_SHIFT) & ((1ull << 23) - 1))
#define WORD(round) ((uint64_t)(round) << ROUND_SHIFT)

struct nodeneg {
    _Atomic uint64_t *joined;        /* in the segment: a join closed every word */
    _Atomic uint64_t *arrive;        /* in the segment: per cache id */
    int nlocal, me;                  /* this node's ranks; my local index */
    uint32_t *rounds; /* per cache id: responses naming it applied (rank 0: planned) */
    words_scan_t scan; /* a leader's stall scan: each word as first seen, and when */
    double last_scan;
    /* rank 0 */
    int **node_ranks; /* per node: its global ranks, by local index */
    int *node_n;
    int *has_words; /* per node: it negotiates in its segment */
    int join_closed;
    int64_t agreed, frames; /* ids this rank completed for its node, in how many frames */
    int64_t recorded, taken; /* rank 0: node agreements recorded; words taken over */
};

static int has_words_n(engine_t *e, int n) {
    return e->cfg.shm && e->cfg.shm_negotiate && n >= 2 && n <= HVDL_NEG_MAX_RANKS;
}

static void nodes_free(engine_t *e);
extern const negotiation_t hvdl__negotiate_nodes;

int hvdl__negotiate_nodes_open(engine_t *e) {
    if (e->nnodes < 2 || !e->cfg.shm_negotiate) return 0;
    struct nodeneg *n = calloc(1, sizeof *n);
    if (!n || !(n->rounds = calloc(NEG_IDS, 4))) goto oom;
    if (e->shm && e->shm->nlocal <= HVDL_NEG_MAX_RANKS) {
        uint8_t *a = hvdl__shm_neg_area(e->shm);
        n->joined = (_Atomic uint64_t *)a;
        n->arrive = (_Atomic uint64_t *)(a + 64);
        n->nlocal = e->shm->nlocal;
        n->me = e->shm->me;
        if (n->me == 0 &&
            (!(n->scan.seen = calloc(NEG_IDS, 8)) || !(n->scan.seen_at = calloc(NEG_IDS, 8))))
            goto oom;
    }
    if (e->rank == 0) {
        if (!(n->node_ranks = calloc((size_t)e->nnodes, sizeof *n->node_ranks)) ||
            !(n->node_n = calloc((size_t)e->nnodes, sizeof(int))) ||
            !(n->has_words = calloc((size_t)e->nnodes, sizeof(int))))
            goto oom;
        for (int r = 0; r < e->size; r++) n->node_n[e->node[r]]++;
        for (int k = 0; k < e->nnodes; k++) {
            if (!(n->node_ranks[k] = calloc((size_t)n->node_n[k], sizeof(int)))) goto oom;
            n->has_words[k] = has_words_n(e, n->node_n[k]);
            n->node_n[k] = 0;
        }
        for (int r = 0; r < e->size; r++) n->node_ranks[e->node[r]][n->node_n[e->node[r]]++] = r;
    }
    e->neg = n;
    e->negotiation = &hvdl__negotiate_nodes;
    return 1;
oom:
    e->neg = n;
    nodes_free(e);
    return hvdl__oom(e, "hierarchical negotiation", 8 * NEG_IDS);
}

static void nodes_free(engine_t *e) {
    struct nodeneg *n = e->neg;
    if (!n) return;
    if (n->node_ranks)
        for (int k = 0; k < e->nnodes; k++) free(n->node_ranks[k]);
    free(n->node_ranks);
    free(n->node_n);
    free(n->has_words);
    free(n->rounds);
    free(n->scan.seen);
    free(n->scan.seen_at);
    free(n);
    e->neg = NULL;
}

/* The loop thread, as it ends: what went through the segments (the tests count it). */
static void thread_end(engine_t *e) {
    struct nodeneg *n = e->neg;
    hvdl__log(e, HVDL_LOG_DEBUG,
              "rank %d completed its node's agreement on %lld tensors in %lld "
              "announcements; rank 0 recorded %lld node agreements and took %lld words over",
              e->rank, (long long)n->agreed, (long long)n->frames, (long long)n->recorded,
              (long long)n->taken);
}

/* ---- rounds: counted as responses are planned (rank 0) or applied (workers) ---- */

static void count(engine_t *e, const response_t *r) {
    struct nodeneg *n = e->neg;
    if (r->meta.process_set != 0) return;
    for (int i = 0; i < r->ntensors; i++) {
        int id = r->cache_id[i] >= 0 ? r->cache_id[i] : hvdl__cache_lookup(e, r->names[i]);
        if (id >= 0 && id < NEG_IDS) n->rounds[id]++;
    }
}

static uint64_t round_now(struct nodeneg *n, int id) { return n->rounds[id] % ROUND_MOD; }

/* ---- posting (any rank of a node with a segment) ---- */

static int post(engine_t *e, int id) {
    struct nodeneg *n = e->neg;
    if (!n->arrive || id < 0 || id >= NEG_IDS || atomic_load(n->joined)) return 0;
    uint64_t mine = round_now(n, id), bit = 1ull << n->me, full = (1ull << n->nlocal) - 1;
    _Atomic uint64_t *w = &n->arrive[id];
    uint64_t old = atomic_load(w);
    for (;;) {
        uint64_t r = ROUND_OF(old), base;
        if (old & CLOSED) {
            if (r == mine || r == ROUND_JOIN) return 0; /* rank 0 has this round */
            base = WORD(mine); /* that round is over */
        } else if (r == mine) {
            base = old;
        } else if (!r && !(old & MASK)) {
            base = WORD(mine); /* never used */
        } else {
            return 0; /* not this round's word: rank 0 sorts it out */
        }
        int last = ((base & MASK) | bit) == full;
        uint64_t now = last ? WORD((mine + 1) % ROUND_MOD) : base | bit;
        if (atomic_compare_exchange_weak(w, &old, now)) return last ? 2 : 1;
    }
}

/* This rank is about to announce a join: it takes back its bits still waiting in words,
 * marking them in `bits` (ids), so that they travel by frame ahead of its join (rank 0
 * then counts it as joined only for what it never submitted). Returns how many. */
static int withdraw(engine_t *e, uint64_t *bits) {
    struct nodeneg *n = e->neg;
    int k = 0;
    if (!n->arrive) return 0;
    uint64_t bit = 1ull << n->me;
    for (int id = 0; id < NEG_IDS && id < e->ncache; id++) {
        _Atomic uint64_t *w = &n->arrive[id];
        uint64_t old = atomic_load(w);
        while (!(old & CLOSED) && (old & bit) && ROUND_OF(old) == round_now(n, id))
            if (atomic_compare_exchange_weak(w, &old, old & ~bit)) {
                bits[id / 64] |= 1ull << (id % 64);
                k++;
                break;
            }
    }
    return k;
}

/* The bits of `id`'s word for `round` (closing it for that round), 0 if the word has
 * moved on: the node completed that round (its completer told rank 0), and any bits
 * are the next round's, posted after rank 0 planned this one. */
static uint64_t close_word(struct nodeneg *n, int id, uint64_t round) {
    _Atomic uint64_t *w = &n->arrive[id];
    uint64_t old = atomic_load(w);
    for (;;) {
        uint64_t r = ROUND_OF(old), mask = old & MASK;
        if (r != round && (mask || (!(old & CLOSED) && r == (round + 1) % ROUND_MOD))) return 0;
        if (atomic_compare_exchange_weak(w, &old, CLOSED | WORD(round)))
            return r == round ? mask : 0;
    }
}

/* ---- rank 0: what the segments say goes to the coordinator ---- */

/* The requests of `mask`'s local ranks of node k for cache id `id`, into t (the
 * coordinator records them), dated `since` if not 0. A rank that has joined since is
 * skipped (skip_joined): it took its bits back before its join left (withdraw), so a bit
 * of its own here was taken out of a word by a close that crossed its join; rank 0
 * counts it present as joined, and its op may already be planned. */
static int took_node(engine_t *e, took_t *t, int k, int id, uint64_t mask, double since) {
    struct nodeneg *n = e->neg;
    t->skip_joined = 1;
    for (int q = 0; q < n->node_n[k]; q++)
        if ((mask >> q & 1) && hvdl__took_add(e, t, n->node_ranks[k][q], id, since)) return -1;
    return since > 0 && !mask ? hvdl__took_add(e, t, -1, id, since) : 0;
}

static uint64_t full_mask(int n) { return (1ull << n) - 1; } /* n <= NEG_MAX_RANKS */

/* Rank 0 closes `id` on node k for its round: its own node in place, another through
 * that node's leader, who reports the bits it took. */
static int close_on(engine_t *e, int k, int id, took_t *t) {
    struct nodeneg *n = e->neg;
    n->taken++;
    if (k == e->node[0]) {
        uint64_t mask = n->arrive ? close_word(n, id, round_now(n, id)) : 0;
        return mask ? took_node(e, t, k, id, mask, 0) : 0;
    }
    uint8_t msg[HVDL_NODE_CLOSE_BYTES];
    hvdl__put_node_close(msg, &(node_close_t){id, (uint32_t)round_now(n, id)});
    return hvdl__send_frame(e, n->node_ranks[k][0], MSG_NODE_CLOSE, msg, sizeof msg);
}

/* Rank 0 takes p's word on node k over, once per request record. */
static int take_over(engine_t *e, pending_t *p, int k, int id, took_t *t) {
    struct nodeneg *n = e->neg;
    if (!n->has_words[k] || (p->closed_nodes && p->closed_nodes[k])) return 0;
    if (!p->closed_nodes &&
        (HVDL_INJECT(e, INJ_NODES_ALLOC) || !(p->closed_nodes = calloc((size_t)e->nnodes, 1))))
        return hvdl__oom(e, "record of the nodes' closed words", e->nnodes);
    p->closed_nodes[k] = 1;
    return close_on(e, k, id, t);
}

/* The word of name p for a request with metadata m, or -1 if rank 0 leaves it alone. */
static int word_id(engine_t *e, const pending_t *p, const meta_t *m) {
    struct nodeneg *n = e->neg;
    if (n->join_closed || !hvdl__cacheable(m)) return -1;
    int id = hvdl__cache_lookup(e, p->name);
    return id < NEG_IDS ? id : -1;
}

/* coordinator.c: rank `from`'s request for `p` reached rank 0 as a frame (or, rank 0's,
 * in memory) rather than through its segment: its node's mates may have posted theirs
 * in the word, so rank 0 takes that word over for the round, once. */
static int close_request(engine_t *e, int from, pending_t *p, const meta_t *m, took_t *t) {
    int id = word_id(e, p, m);
    return id < 0 ? 0 : take_over(e, p, e->node[from], id, t);
}

/* stall.c, before naming the ranks missing from p: the bits posted in the words of the
 * nodes those ranks are on come to rank 0 first. 1 if some are on their way (the next
 * check names the ranks), 0 if none (any on rank 0's node are recorded now). */
static int before_stall(engine_t *e, pending_t *p, took_t *t) {
    struct nodeneg *n = e->neg;
    int id = word_id(e, p, &p->metas[p->ref]), asked = 0;
    for (int k = 0; id >= 0 && k < e->nnodes; k++) {
        int missing = 0, had = p->closed_nodes && p->closed_nodes[k];
        for (int q = 0; q < n->node_n[k]; q++) missing |= !p->have[n->node_ranks[k][q]];
        if (!missing) continue;
        if (take_over(e, p, k, id, t)) return -1;
        asked |= !had && n->has_words[k] && k != e->node[0];
    }
    return asked;
}

/* A node's ranks completed `ids` (rank 0's own node: in memory). */
static int node_done(engine_t *e, int k, const int32_t *ids, int count, took_t *t) {
    struct nodeneg *n = e->neg;
    for (int i = 0; i < count; i++) {
        if (took_node(e, t, k, ids[i], full_mask(n->node_n[k]), 0)) return -1;
        n->recorded++;
    }
    return 0;
}

static int take_done(engine_t *e, int from, const uint8_t *p, int64_t len, took_t *t) {
    struct nodeneg *n = e->neg;
    int k = from >= 0 && from < e->size ? e->node[from] : -1;
    if (k < 0 || !n->has_words[k])
        return hvdl__malformed(e, from, "node agreement", "its node has no words");
    reader_t r = {.p = p, .left = len};
    int32_t ids[NEG_IDS];
    uint64_t seen[NEG_IDS / 64] = {0};
    int count;
    if (hvdl__read_words(&r, (uint32_t *)ids, &count))
        return hvdl__malformed(e, from, "node agreement", r.why);
    for (int i = 0; i < count; i++) {
        if (ids[i] < 0 || ids[i] >= e->ncache || ids[i] >= NEG_IDS ||
            !hvdl__cacheable(&e->cache[ids[i]].meta))
            return hvdl__malformed(e, from, "node agreement", "a cache id that does not exist");
        if (seen[ids[i] / 64] >> (ids[i] % 64) & 1)
            return hvdl__malformed(e, from, "node agreement", "a cache id twice");
        seen[ids[i] / 64] |= 1ull << (ids[i] % 64);
    }
    return node_done(e, k, ids, count, t);
}

static int take_posted(engine_t *e, int from, const uint8_t *p, int64_t len, took_t *t) {
    struct nodeneg *n = e->neg;
    int k = from >= 0 && from < e->size ? e->node[from] : -1;
    if (k < 0 || !n->has_words[k] || n->node_ranks[k][0] != from)
        return hvdl__malformed(e, from, "word report", "it leads no node with words");
    reader_t r = {.p = p, .left = len};
    node_posted_t m;
    if (hvdl__read_node_posted(&r, &m)) return hvdl__malformed(e, from, "word report", r.why);
    if (m.id < 0 || m.id >= e->ncache || m.id >= NEG_IDS || (m.mask & ~full_mask(n->node_n[k])) ||
        !(m.waited >= 0 && m.waited < 1e9))
        return hvdl__malformed(e, from, "word report",
                               "a cache id, rank mask or time out of range");
    return took_node(e, t, k, m.id, m.mask, m.waited > 0 ? hvdl_now() - m.waited : 0);
}

/* ---- the node's side: completing, reporting, obeying rank 0 ---- */

static int complete(engine_t *e, const int *ids, int count, took_t *t) {
    struct nodeneg *n = e->neg;
    n->frames++;
    n->agreed += count;
    if (e->rank == 0) return node_done(e, e->node[0], (const int32_t *)ids, count, t);
    uint8_t msg[4 * NEG_IDS]; /* ids this rank completed: distinct, below NEG_IDS */
    return hvdl__send_frame(e, 0, MSG_NODE_DONE, msg, hvdl__put_words(msg, ids, count));
}

static int report(engine_t *e, int id, uint64_t mask, double waited, took_t *t) {
    if (!mask) return 0;
    if (e->rank == 0)
        return took_node(e, t, e->node[0], id, mask, waited > 0 ? hvdl_now() - waited : 0);
    uint8_t msg[HVDL_NODE_POSTED_BYTES];
    hvdl__put_node_posted(msg, &(node_posted_t){id, mask, waited});
    return hvdl__send_frame(e, 0, MSG_NODE_POSTED, msg, sizeof msg);
}

/* A join: every word closes until rank 0 says the join has ended. */
static int close_all(engine_t *e, took_t *t) {
    struct nodeneg *n = e->neg;
    atomic_store(n->joined, 1); /* seq_cst: before the swaps below */
    for (int id = 0; id < NEG_IDS; id++) {
        uint64_t old = atomic_exchange(&n->arrive[id], CLOSED | WORD(ROUND_JOIN));
        if (!(old & CLOSED) && (old & MASK) && report(e, id, old & MASK, 0, t)) return -1;
    }
    return 0;
}

/* The join ended: each word is closed for the round rank 0 had reached. */
static void reopen_all(struct nodeneg *n, const uint32_t *rounds, int count) {
    for (int id = 0; id < NEG_IDS; id++)
        atomic_store(&n->arrive[id], CLOSED | WORD(id < count ? rounds[id] % ROUND_MOD : 0));
    atomic_store(n->joined, 0);
}

static int take_close(engine_t *e, const uint8_t *p, int64_t len, took_t *t) {
    struct nodeneg *n = e->neg;
    if (!n->arrive || n->me != 0)
        return hvdl__malformed(e, 0, "word closing", "this rank leads no segment");
    reader_t r = {.p = p, .left = len};
    node_close_t m;
    if (hvdl__read_node_close(&r, &m)) return hvdl__malformed(e, 0, "word closing", r.why);
    if (m.id == HVDL_CLOSE_ALL) return close_all(e, t);
    if (m.id < 0 || m.id >= NEG_IDS || m.round >= ROUND_MOD)
        return hvdl__malformed(e, 0, "word closing", "a cache id or round out of range");
    return report(e, m.id, close_word(n, m.id, m.round), 0, t);
}

static int take_reopen(engine_t *e, const uint8_t *p, int64_t len) {
    struct nodeneg *n = e->neg;
    if (!n->arrive || n->me != 0)
        return hvdl__malformed(e, 0, "word reopening", "this rank leads no segment");
    reader_t r = {.p = p, .left = len};
    uint32_t rounds[NEG_IDS];
    int count;
    if (hvdl__read_words(&r, rounds, &count)) return hvdl__malformed(e, 0, "word reopening", r.why);
    reopen_all(n, rounds, count);
    return 0;
}

/* ---- rank 0: joins ---- */

static int join(engine_t *e, took_t *t) {
    struct nodeneg *n = e->neg;
    if (n->join_closed) return 0;
    n->join_closed = 1;
    uint8_t all[HVDL_NODE_CLOSE_BYTES];
    hvdl__put_node_close(all, &(node_close_t){HVDL_CLOSE_ALL, 0});
    for (int k = 0; k < e->nnodes; k++) {
        if (!n->has_words[k]) continue;
        if (k == e->node[0]
                ? n->arrive && close_all(e, t)
                : hvdl__send_frame(e, n->node_ranks[k][0], MSG_NODE_CLOSE, all, sizeof all))
            return -1;
    }
    return 0;
}

/* Rank 0 planned r: its rounds count it; a join that has ended reopens the words. */
static int settle(engine_t *e, const response_t *r, int anyone_joined, took_t *t) {
    struct nodeneg *n = e->neg;
    count(e, r);
    if (!n->join_closed || anyone_joined) return 0;
    n->join_closed = 0;
    for (int k = 0; k < e->nnodes; k++) {
        if (!n->has_words[k]) continue;
        if (k == e->node[0]) {
            if (n->arrive) reopen_all(n, n->rounds, NEG_IDS);
        } else {
            uint8_t msg[4 * NEG_IDS];
            int64_t len = hvdl__put_words(msg, n->rounds, NEG_IDS);
            if (hvdl__send_frame(e, n->node_ranks[k][0], MSG_NODE_REOPEN, msg, len)) return -1;
        }
    }
    return 0;
}

/* ---- every leader: words stuck partly set ---- */

static int leads(engine_t *e) {
    struct nodeneg *n = e->neg;
    return n->arrive && n->me == 0;
}

static int stuck(engine_t *e, int id, uint64_t w, double since, double now, took_t *t) {
    struct nodeneg *n = e->neg;
    return report(e, id, close_word(n, id, ROUND_OF(w)), now - since, t);
}

static int scan(engine_t *e, double now, took_t *t) {
    struct nodeneg *n = e->neg;
    if (!leads(e) || !e->cfg.stall_check || now - n->last_scan < 1.0) return 0;
    n->last_scan = now;
    if (atomic_load(n->joined)) return 0;
    /* reported well before rank 0 would warn */
    return hvdl__words_scan(e, &n->scan, n->arrive, now, hvdl__stall_after(e) / 2, stuck, t);
}

/* ---- the nodes' frames (frames.h) ---- */

static int frame(engine_t *e, int from, int type, const uint8_t *p, int64_t len, took_t *t) {
    switch (type) {
    case MSG_NODE_DONE: return take_done(e, from, p, len, t);
    case MSG_NODE_POSTED: return take_posted(e, from, p, len, t);
    case MSG_NODE_CLOSE: return take_close(e, p, len, t);
    default: return take_reopen(e, p, len);
    }
}

const negotiation_t hvdl__negotiate_nodes = {
    .name = "the nodes' segments",
    .free = nodes_free,
    .thread_start = hvdl__neg_none,
    .thread_end = thread_end,
    .post = post,
    .complete = complete,
    .withdraw = withdraw,
    .close = close_request,
    .join = join,
    .settle = settle,
    .stall_scan = hvdl__neg_scan_none, /* the leaders scan their words (scan) */
    .before_stall = before_stall,
    .scan = scan,
    .watches = leads,
    .applied = count,
    .frame = frame,
    HVDL_NEG_NO_LOG, /* rank 0 alone orders: responses run as they arrive */
};
