/*
 * Every collective and every algorithm, at 1 to 16 ranks, against a reference computed
 * here. Each world is a set of engines on threads (harness.c); which algorithms run
 * follows from the world's shape and settings:
 *
 *   one node, shared memory     shm one-shot / two-shot / fused allreduce, shm allgather,
 *                               broadcast, alltoall, reducescatter; on a process set that
 *                               is part of the node: the TCP algorithms
 *   one node, no shared memory  recursive doubling (small), ring (large), ring allgather,
 *                               chain broadcast, pairwise alltoall, ring reducescatter;
 *                               once more with recursive doubling at every size
 *   several "nodes" (distinct   hierarchical allreduce and allgather on the global set;
 *   host names), shared memory  shm algorithms on a set that is one node; TCP otherwise
 *
 * Each world checks that the engine ran the algorithm expected of it, reading the
 * algorithm from the engine's own trace. Sizes: empty, one element, odd, and above one
 * shared-memory piece (the settings make pieces small so that this stays quick).
 *
 * Then the failure paths (test_failures.c).
 *
 * Usage: engine_tests [max_ranks], in a scratch directory (traces are written there
 * and removed).
 */
#include "harness.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Above one shm piece at any rank count here: chunk 256 B, x4 when oversubscribed, x16
 * local ranks = 16 KiB, and this many 4-byte elements is 32 KiB. Odd on purpose. */
#define BIG 8195
static const int64_t COUNTS[] = {0, 1, 7, BIG};
#define NCOUNTS 4

/* ---- typed access, so one reference serves every dtype ---- */

static double get(int dtype, const void *p, int64_t i) {
    switch (dtype) {
    case HVDL_FLOAT32: return ((const float *)p)[i];
    case HVDL_FLOAT64: return ((const double *)p)[i];
    case HVDL_INT32: return ((const int32_t *)p)[i];
    case HVDL_FLOAT16: return (double)((const _Float16 *)p)[i];
    case HVDL_UINT8: return ((const uint8_t *)p)[i];
    default: abort();
    }
}

static void put(int dtype, void *p, int64_t i, double v) {
    switch (dtype) {
    case HVDL_FLOAT32: ((float *)p)[i] = (float)v; break;
    case HVDL_FLOAT64: ((double *)p)[i] = v; break;
    case HVDL_INT32: ((int32_t *)p)[i] = (int32_t)v; break;
    case HVDL_FLOAT16: ((_Float16 *)p)[i] = (_Float16)v; break;
    case HVDL_UINT8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    default: abort();
    }
}

static double tolerance(int dtype) {
    return dtype == HVDL_FLOAT16 ? 1e-2 : dtype == HVDL_FLOAT32 ? 1e-6 : 1e-12;
}

static int close_to(int dtype, double got, double want) {
    double d = got - want, scale = want < 0 ? -want : want;
    return (d < 0 ? -d : d) <= tolerance(dtype) * (scale > 1 ? scale : 1);
}

/* Inputs: small integers, so sums over 16 ranks are exact in every float type; the
 * product inputs are +-1 and 2, so products stay exact too. */
static double value(int rank, int tensor, int64_t i, int op) {
    if (op == HVDL_PRODUCT)
        return ((rank + i + tensor) % 4 == 0 ? 2 : 1) * ((rank * 3 + i) % 5 == 0 ? -1 : 1);
    return (double)((rank * 7 + tensor * 5 + i * 3) % 13) - 6;
}

static void *alloc_data(int dtype, int64_t count) {
    void *p = calloc((size_t)(count ? count : 1), (size_t)hvdl_dtype_size(dtype));
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

/* What one rank knows about the set it runs in. */
typedef struct member {
    world_t *w;
    engine_t *e;
    int set, n, me;          /* set id, members, my index */
    const int *ranks;        /* members' global ranks */
    const char *where;       /* world label, for messages */
} member_t;

/* ---- allreduce ---- */

typedef struct arcase {
    int dtype, op;
    double prescale, postscale;
} arcase_t;
static const arcase_t AR[] = {
    {HVDL_FLOAT32, HVDL_SUM, 1, 1}, {HVDL_FLOAT32, HVDL_AVERAGE, 1, 1},
    {HVDL_FLOAT64, HVDL_SUM, 1, 1}, {HVDL_INT32, HVDL_MIN, 1, 1},
    {HVDL_INT32, HVDL_MAX, 1, 1},   {HVDL_INT32, HVDL_PRODUCT, 1, 1},
    {HVDL_FLOAT16, HVDL_SUM, 1, 1}, {HVDL_FLOAT32, HVDL_SUM, 2.0, 0.25},
};
#define NAR (int)(sizeof AR / sizeof AR[0])

static double ar_reference(const member_t *m, const arcase_t *c, int t, int64_t i) {
    double acc = 0;
    for (int k = 0; k < m->n; k++) {
        double v = value(m->ranks[k], t, i, c->op) * c->prescale;
        if (k == 0) acc = v;
        else if (c->op == HVDL_MIN) acc = v < acc ? v : acc;
        else if (c->op == HVDL_MAX) acc = v > acc ? v : acc;
        else if (c->op == HVDL_PRODUCT) acc *= v;
        else acc += v;
    }
    if (c->op == HVDL_AVERAGE) acc /= m->n;
    return acc * c->postscale;
}

/* All cases at once (fused responses), then each alone (the single-tensor paths). */
static void test_allreduce(const member_t *m, int fused) {
    int nt = NAR * NCOUNTS;
    void *in[nt], *out[nt];
    int64_t h[nt];
    char names[nt][48];
    for (int t = 0; t < nt; t++) {
        const arcase_t *c = &AR[t / NCOUNTS];
        int64_t count = COUNTS[t % NCOUNTS];
        in[t] = alloc_data(c->dtype, count);
        out[t] = t % 3 == 0 ? in[t] : alloc_data(c->dtype, count);   /* some in place */
        for (int64_t i = 0; i < count; i++) put(c->dtype, in[t], i, value(m->e->rank, t, i, c->op));
        snprintf(names[t], sizeof names[t], "ar.%d.%d.%d", m->set, fused, t);
        hvdl_request q = make_request(HVDL_OP_ALLREDUCE, c->dtype, m->set, names[t], 1, count, 0);
        q.reduce_op = c->op;
        q.prescale = c->prescale;
        q.postscale = c->postscale;
        q.input = in[t];
        q.output = out[t];
        if (fused) {
            CHECK(!hvdl__engine_enqueue(m->e, &q, &h[t]), "%s: enqueue %s: %s", m->where, names[t],
                  hvdl_last_error());
        } else {
            char msg[HVDL_MSG_BYTES];
            int rc = run_op(m->e, &q, NULL, msg);
            CHECK(!rc, "%s: allreduce %s: %s", m->where, names[t], msg);
        }
    }
    for (int t = 0; t < nt; t++) {
        const arcase_t *c = &AR[t / NCOUNTS];
        int64_t count = COUNTS[t % NCOUNTS];
        if (fused) {
            char msg[HVDL_MSG_BYTES];
            CHECK(!hvdl__engine_wait(m->e, h[t], 60), "%s: wait %s: %s", m->where, names[t],
                  hvdl_last_error());
            int rc = hvdl__engine_release(m->e, h[t], msg, NULL);
            CHECK(!rc, "%s: allreduce %s: %s", m->where, names[t], msg);
        }
        int bad = 0;
        for (int64_t i = 0; i < count && !bad; i++) {
            double want = ar_reference(m, c, t, i), got = get(c->dtype, out[t], i);
            bad = !close_to(c->dtype, got, want);
            CHECK(!bad,
                  "%s rank %d: allreduce %s (dtype %d op %d, %lld elements)[%lld] = %g, want %g",
                  m->where, m->e->rank, names[t], c->dtype, c->op, (long long)count, (long long)i,
                  got, want);
        }
        if (out[t] != in[t]) free(out[t]);
        free(in[t]);
    }
}

/* ---- allgather ---- */

/* Rows rank r contributes in size class k: none; one rank one row; a few; many. */
static int64_t ag_rows(int k, int idx, int n) {
    switch (k) {
    case 0: return 0;
    case 1: return idx == n - 1;
    case 2: return idx % 3 + (idx == 0);
    default: return BIG / 3 + idx;
    }
}

static void test_allgather(const member_t *m) {
    const int W = 3, dtype = HVDL_FLOAT32;
    for (int k = 0; k < NCOUNTS; k++) {
        int64_t rows = ag_rows(k, m->me, m->n);
        float *in = alloc_data(dtype, rows * W);
        for (int64_t i = 0; i < rows * W; i++) in[i] = (float)value(m->e->rank, k, i, HVDL_SUM);
        char name[48], msg[HVDL_MSG_BYTES];
        snprintf(name, sizeof name, "ag.%d.%d", m->set, k);
        hvdl_request q = make_request(HVDL_OP_ALLGATHER, dtype, m->set, name, 2, rows, W);
        q.input = in;
        hvdl_result res = {0};
        int rc = run_op(m->e, &q, &res, msg);
        CHECK(!rc, "%s: allgather %s: %s", m->where, name, msg);
        int64_t total = 0;
        for (int j = 0; j < m->n; j++) total += ag_rows(k, j, m->n);
        CHECK(rc || res.first_dim == total, "%s: allgather %s: %lld rows, want %lld", m->where,
              name, (long long)res.first_dim, (long long)total);
        const float *o = res.data;
        for (int j = 0, at = 0, bad = 0; !rc && j < m->n && !bad; j++) {
            int64_t nj = ag_rows(k, j, m->n) * W;
            for (int64_t i = 0; i < nj && !bad; i++) {
                double want = value(m->ranks[j], k, i, HVDL_SUM);
                bad = o[at + i] != want;
                CHECK(!bad, "%s rank %d: allgather %s: block %d [%lld] = %g, want %g", m->where,
                      m->e->rank, name, j, (long long)i, o[at + i], want);
            }
            at += (int)nj;
        }
        hvdl_free(res.data);
        free(in);
    }
}

/* ---- broadcast ---- */

static void test_broadcast(const member_t *m) {
    const int dtypes[] = {HVDL_FLOAT32, HVDL_FLOAT64, HVDL_UINT8};
    for (int t = 0; t < 3 * NCOUNTS; t++) {
        int dtype = dtypes[t / NCOUNTS];
        int64_t count = COUNTS[t % NCOUNTS];
        int root = m->ranks[(t * 3 + 1) % m->n];
        void *in = alloc_data(dtype, count), *out = t % 2 ? in : alloc_data(dtype, count);
        for (int64_t i = 0; i < count; i++)
            put(dtype, in, i, value(m->e->rank, t, i, HVDL_SUM) + 6);
        char name[48], msg[HVDL_MSG_BYTES];
        snprintf(name, sizeof name, "bc.%d.%d", m->set, t);
        hvdl_request q = make_request(HVDL_OP_BROADCAST, dtype, m->set, name, 1, count, 0);
        q.root_rank = root;
        q.input = in;
        q.output = out;
        int rc = run_op(m->e, &q, NULL, msg);
        CHECK(!rc, "%s: broadcast %s: %s", m->where, name, msg);
        for (int64_t i = 0, bad = 0; !rc && i < count && !bad; i++) {
            double want = value(root, t, i, HVDL_SUM) + 6, got = get(dtype, out, i);
            bad = got != want;
            CHECK(!bad, "%s rank %d: broadcast %s from %d [%lld] = %g, want %g", m->where,
                  m->e->rank, name, root, (long long)i, got, want);
        }
        if (out != in) free(out);
        free(in);
    }
}

/* ---- alltoall ---- */

/* Rows member i sends to member j in size class k. */
static int64_t a2a_rows(int k, int i, int j, int n) {
    switch (k) {
    case 0: return 0;
    case 1: return i == 0 && j == n - 1;
    case 2: return (i + 2 * j) % 3;
    default: return BIG / (2 * n) + i + j;
    }
}

static double a2a_value(int from, int to, int k, int64_t e) {
    return value(from * 31 + to, k, e, HVDL_SUM);
}

static void test_alltoall(const member_t *m) {
    const int W = 2, dtype = HVDL_INT32;
    for (int k = 0; k < NCOUNTS; k++) {
        int64_t splits[m->n], rows = 0;
        for (int j = 0; j < m->n; j++) rows += splits[j] = a2a_rows(k, m->me, j, m->n);
        int32_t *in = alloc_data(dtype, rows * W);
        for (int j = 0, at = 0; j < m->n; j++)
            for (int64_t e = 0; e < splits[j] * W; e++)
                in[at++] = (int32_t)a2a_value(m->e->rank, m->ranks[j], k, e);
        char name[48], msg[HVDL_MSG_BYTES];
        snprintf(name, sizeof name, "a2a.%d.%d", m->set, k);
        hvdl_request q = make_request(HVDL_OP_ALLTOALL, dtype, m->set, name, 2, rows, W);
        q.input = in;
        q.splits = splits;
        hvdl_result res = {0};
        int rc = run_op(m->e, &q, &res, msg);
        CHECK(!rc, "%s: alltoall %s: %s", m->where, name, msg);
        const int32_t *o = res.data;
        for (int j = 0, at = 0, bad = 0; !rc && j < m->n && !bad; j++) {
            int64_t got_rows = j < res.nsplits ? res.recv_splits[j] : -1,
                    want_rows = a2a_rows(k, j, m->me, m->n);
            bad = got_rows != want_rows;
            CHECK(!bad, "%s: alltoall %s: %lld rows from member %d, want %lld", m->where, name,
                  (long long)got_rows, j, (long long)want_rows);
            for (int64_t e = 0; !bad && e < want_rows * W; e++) {
                double want = a2a_value(m->ranks[j], m->e->rank, k, e);
                bad = o[at + e] != want;
                CHECK(!bad, "%s rank %d: alltoall %s: from %d [%lld] = %d, want %g", m->where,
                      m->e->rank, name, j, (long long)e, o[at + e], want);
            }
            at += (int)(want_rows * W);
        }
        hvdl_free(res.data);
        hvdl_free(res.recv_splits);
        free(in);
    }
}

/* ---- reducescatter ---- */

static void test_reducescatter(const member_t *m) {
    const int W = 3, dtype = HVDL_FLOAT32;
    const int64_t rows_of[NCOUNTS] = {0, 1, 7, BIG / 2};
    for (int t = 0; t < 2 * NCOUNTS; t++) {
        int op = t < NCOUNTS ? HVDL_SUM : HVDL_AVERAGE;
        int64_t rows = rows_of[t % NCOUNTS];
        float *in = alloc_data(dtype, rows * W);
        for (int64_t i = 0; i < rows * W; i++) in[i] = (float)value(m->e->rank, t, i, HVDL_SUM);
        int64_t first = 0, mine = rows / m->n + (m->me < rows % m->n);
        for (int j = 0; j < m->me; j++) first += rows / m->n + (j < rows % m->n);
        float *out = alloc_data(dtype, mine * W);
        char name[48], msg[HVDL_MSG_BYTES];
        snprintf(name, sizeof name, "rs.%d.%d", m->set, t);
        hvdl_request q = make_request(HVDL_OP_REDUCESCATTER, dtype, m->set, name, 2, rows, W);
        q.reduce_op = op;
        q.input = in;
        q.output = out;
        int rc = run_op(m->e, &q, NULL, msg);
        CHECK(!rc, "%s: reducescatter %s: %s", m->where, name, msg);
        for (int64_t i = 0, bad = 0; !rc && i < mine * W && !bad; i++) {
            double want = 0;
            for (int j = 0; j < m->n; j++) want += value(m->ranks[j], t, first * W + i, HVDL_SUM);
            if (op == HVDL_AVERAGE) want /= m->n;
            bad = !close_to(dtype, out[i], want);
            CHECK(!bad, "%s rank %d: reducescatter %s [%lld] = %g, want %g", m->where, m->e->rank,
                  name, (long long)i, out[i], want);
        }
        free(out);
        free(in);
    }
}

static void test_barrier(const member_t *m) {
    char name[48], msg[HVDL_MSG_BYTES];
    snprintf(name, sizeof name, "barrier.%d", m->set);
    hvdl_request q = make_request(HVDL_OP_BARRIER, HVDL_UINT8, m->set, name, 0, 0, 0);
    CHECK(!run_op(m->e, &q, NULL, msg), "%s: barrier: %s", m->where, msg);
}

/* Point-to-point, a ring on the set: each member sends to the next and receives from
 * the one before, through the p2p thread (and, under TSan, against the callers). The
 * rounds after the first find the pair's mailbox live (engines of one process are on
 * one node): its waiting caller drains it, against the p2p thread answering doorbells. */
static void test_p2p(const member_t *m) {
    if (m->n < 2) return;
    enum { N = 1000, ROUNDS = 4 };
    int32_t out[N], in[N];
    char name[48], msg[HVDL_MSG_BYTES];
    snprintf(name, sizeof name, "p2p.%d", m->set);
    int from = m->ranks[(m->me + m->n - 1) % m->n];
    for (int round = 0; round < ROUNDS; round++) {
        for (int i = 0; i < N; i++) out[i] = m->e->rank * 100000 + round * N + i;
        hvdl_request r = make_request(HVDL_OP_RECV, HVDL_INT32, m->set, name, 1, N, 0);
        r.root_rank = from;
        r.flags = HVDL_RECV_INTO;
        r.output = in;
        int64_t h;
        int rc = hvdl__engine_enqueue(m->e, &r, &h);
        CHECK(!rc, "%s: recv %s: %s", m->where, name, hvdl_last_error());
        if (rc) return;
        hvdl_request q = make_request(HVDL_OP_SEND, HVDL_INT32, m->set, name, 1, N, 0);
        q.root_rank = m->ranks[(m->me + 1) % m->n];
        q.input = out;
        CHECK(!run_op(m->e, &q, NULL, msg), "%s: send %s: %s", m->where, name, msg);
        rc = hvdl__engine_wait(m->e, h, 60) || hvdl__engine_release(m->e, h, msg, NULL);
        CHECK(!rc, "%s: recv %s: %s", m->where, name, msg);
        for (int i = 0; !rc && i < N; i++)
            if (in[i] != from * 100000 + round * N + i) {
                CHECK(0, "%s rank %d: recv %s round %d [%d] = %d, want %d", m->where, m->e->rank,
                      name, round, i, in[i], from * 100000 + round * N + i);
                return;
            }
        if (rc) return;
    }
}

/* ---- worlds ---- */

/* Set 0 is everyone; set 1 (worlds of 3+ ranks) is every other rank from 1, which is
 * never a whole node, so it takes the TCP algorithms even where set 0 uses shm. */
static void body(world_t *w, int rank, void *arg) {
    engine_t *e = w->e[rank];
    int nsets = 1;
    /* the timeline, started while the engine runs, cycles marked: on rank 2, whose trace
     * run_world does not read (ranks 0 and 1 trace from the start) */
    if (w->size == 3 && rank == 2) {
        CHECK(!hvdl__engine_timeline_start(e, "timeline.json", 1), "%s: timeline: %s", w->label,
              hvdl_last_error());   /* each rank writes timeline.rank<r>.json beside it */
    }
    if (w->size >= 3) {
        int odd[w->size], n = 0;
        for (int r = 1; r < w->size; r += 2) odd[n++] = r;
        CHECK(!hvdl__engine_set_add(e, 1, odd, n), "%s: process set: %s", w->label,
              hvdl_last_error());
        nsets = 2;
    }
    for (int set = 0; set < nsets; set++) {
        const group_t *g = e->sets[set];
        if (!g || g->me < 0) continue;
        char where[96];
        snprintf(where, sizeof where, "%s, set %d (%d ranks)", w->label, set, g->n);
        member_t m = {w, e, set, g->n, g->me, g->ranks, where};
        test_allreduce(&m, 1);
        test_allreduce(&m, 0);
        test_allgather(&m);
        test_broadcast(&m);
        test_alltoall(&m);
        test_reducescatter(&m);
        test_barrier(&m);
        test_p2p(&m);
    }
}

/* The two-source kernels against copy-then-reduce, byte for byte, for every dtype and op:
 * each (dtype, op) is its own function behind a table, and a wrong entry would pass every
 * sum test above. Bytes below 0x40 keep every float finite. The length is odd, so the
 * vector loops' tails run too, and the bytes after dst must stay untouched. */
static void test_reduce_kernels(void) {
    enum { N = 1031, GUARD = 64 };
    static uint8_t a[N * 8], b[N * 8], want[N * 8 + GUARD], got[N * 8 + GUARD];
    for (int i = 0; i < N * 8; i++)
        a[i] = (uint8_t)(i * 37 + 11) & 0x3f, b[i] = (uint8_t)(i * 53 + 5) & 0x3f;
    static const int OPS[] = {HVDL_SUM, HVDL_AVERAGE, HVDL_MIN, HVDL_MAX, HVDL_PRODUCT};
    for (int dtype = 0; dtype < HVDL_NUM_DTYPES; dtype++) {
        size_t bytes = (size_t)N * (size_t)hvdl_dtype_size(dtype);
        for (int k = 0; k < 5; k++) {
            memset(want, 0xa5, sizeof want);
            memset(got, 0xa5, sizeof got);
            memcpy(want, a, bytes);
            hvdl__reduce(dtype, OPS[k], want, b, N);
            hvdl__reduce_to(dtype, OPS[k], got, a, b, N);
            CHECK(!memcmp(want, got, sizeof got),
                  "reduce_to: dtype %d op %d differs from copy-then-reduce", dtype, OPS[k]);
        }
    }
    printf("%-40s %s\n", "reduce kernels, two sources", atomic_load(&g_failures) ? "FAILED" : "ok");
}

static void rd_only(config_t *c) {
    no_shm(c);
    c->small_bytes = (int64_t)1 << 40;
}

/* Run every test in a world, and check that the large unfused allreduce of set 0 (and
 * of set 1, where there is one) ran the algorithm the world was built for: want0 and
 * want1 are the names the engine traces (exec.c). Rank 0 traces set 0, rank 1 set 1. */
static void run_world(int size, const char *const *hosts, void (*tweak)(config_t *),
                      const char *kind, const char *want0, const char *want1) {
    static int worlds;
    char label[64], base[64], trace[2][64], got[2][32];
    snprintf(label, sizeof label, "%s, %d ranks", kind, size);
    world_opts_t o = {hosts, tweak, label, NULL, 0};
    double t0 = hvdl_now();
    world_t *w = world_start(size, &o);
    int before = atomic_load(&g_failures), nsets = size >= 3 ? 2 : 1;
    snprintf(base, sizeof base, "engine_tests.%d.json", ++worlds);
    for (int set = 0; set < nsets; set++) {
        CHECK(!hvdl__engine_timeline_start(w->e[set], base, 0), "%s: timeline: %s", label,
              hvdl_last_error());
        snprintf(trace[set], sizeof trace[set], "engine_tests.%d.rank%d.json", worlds, set);
    }
    world_run(w, body, NULL);
    world_stop(w);             /* closes the traces */
    remove(base);              /* rank 0's second name for its trace (timeline.c) */
    for (int set = 0; set < nsets; set++) {
        char tensor[32];
        const char *want = set ? want1 : want0;
        snprintf(tensor, sizeof tensor, "ar.%d.0.%d", set, NCOUNTS - 1); /* float32 sum of BIG */
        traced_algorithm(trace[set], tensor, got[set], sizeof got[set]);
        CHECK(!strcmp(got[set], want), "%s: set %d's allreduce %s ran '%s', want '%s'", label, set,
              tensor, got[set], want);
    }
    printf("%-40s set 0: %-22s %6.2f s %s\n", label, got[0], hvdl_now() - t0,
           atomic_load(&g_failures) > before ? "FAILED" : "ok");
    fflush(stdout);
}

int main(int argc, char **argv) {
    int max_ranks = argc > 1 ? atoi(argv[1]) : 16;
    test_reduce_kernels();
    test_frames();
    test_p2p_frames();
    static const int one_node[] = {1, 2, 3, 4, 5, 8, 16};
    for (size_t i = 0; i < sizeof one_node / sizeof *one_node; i++)
        if (one_node[i] <= max_ranks) /* a rank alone on its node has no segment */
            run_world(one_node[i], NULL, small_pieces, "one node, shm",
                      one_node[i] > 1 ? "shm" : "tcp_ring", "tcp_ring");
    static const int tcp_sizes[] = {2, 3, 4, 7, 16};
    for (size_t i = 0; i < sizeof tcp_sizes / sizeof *tcp_sizes; i++)
        if (tcp_sizes[i] <= max_ranks)
            run_world(tcp_sizes[i], NULL, no_shm, "one node, tcp only", "tcp_ring", "tcp_ring");
    static const int rd_sizes[] = {3, 6}; /* not powers of two: ranks fold in and out */
    for (size_t i = 0; i < sizeof rd_sizes / sizeof *rd_sizes; i++)
        if (rd_sizes[i] <= max_ranks)
            run_world(rd_sizes[i], NULL, rd_only, "one node, recursive doubling",
                      "tcp_recursive_doubling", "tcp_recursive_doubling");
    /* fake nodes: two of two, two of three, three of two (hierarchical); three and one
     * (not homogeneous: shm on the big node for nothing but its own sets, TCP otherwise) */
    static const char *const a2b2[] = {"nodeA", "nodeA", "nodeB", "nodeB"};
    static const char *const a3b3[] = {"nodeA", "nodeA", "nodeA", "nodeB", "nodeB", "nodeB"};
    static const char *const a2b2c2[] = {"nodeA", "nodeB", "nodeC", "nodeA", "nodeB", "nodeC"};
    static const char *const a3b1[] = {"nodeA", "nodeB", "nodeA", "nodeA"};
    /* set 1 (every other rank from 1) is never one node: TCP */
    if (max_ranks >= 4) run_world(4, a2b2, small_pieces, "2 nodes x 2", "hierarchical", "tcp_ring");
    if (max_ranks >= 6) run_world(6, a3b3, small_pieces, "2 nodes x 3", "hierarchical", "tcp_ring");
    if (max_ranks >= 6)
        run_world(6, a2b2c2, small_pieces, "3 nodes x 2, interleaved", "hierarchical", "tcp_ring");
    if (max_ranks >= 4)
        run_world(4, a3b1, small_pieces, "nodes of 3 and 1", "tcp_ring", "tcp_ring");
    run_failure_tests();
    int f = atomic_load(&g_failures);
    printf(f ? "%d check(s) failed\n" : "all checks passed\n", f);
    return f ? 1 : 0;
}
