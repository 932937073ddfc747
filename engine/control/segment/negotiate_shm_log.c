/*
 * One node's response log (negotiate_shm.c): appending an entry, at once or, without
 * room, later.
 *
 * The log is a ring of NEG_LOG entries; an entry is written only once every rank has
 * executed the one NEG_LOG before it. A rank that finds no room keeps the entry
 * (deferred) and publishes it when there is room, never blocking: the ranks it waits
 * for may be waiting for it in a collective.
 *
 * Every rank appends (a rank that completes an arrival word, rank 0 for its planned
 * responses) and every rank executes each entry in order (negotiate_shm.c, run_until):
 * a slot is free once every rank's `consumed` has passed it. After a write, the ranks
 * whose loops sleep are woken by their doorbells.
 */
#include "fail.h"
#include "negotiation.h"
#include "negotiate_shm.h"
#include <stdlib.h>
#include <string.h>

static void ring_sleepers(struct neg *n) {
    for (int q = 0; q < n->nlocal; q++) {
        neg_rank_t *r = &n->ranks[q];
        if (q != n->me && atomic_load(&r->sleeping) && atomic_exchange(&r->sleeping, 0))
            hvdl_doorbell_ring(atomic_load(&r->pid), atomic_load(&r->tid));
    }
}

/* Whether entry seq may be written: every rank has executed the entry of its slot. */
static int room_for(struct neg *n, uint64_t seq) {
    for (int q = 0; q < n->nlocal; q++)
        if (atomic_load(&n->ranks[q].consumed) + NEG_LOG <= seq) return 0;
    return 1;
}

static void write_entry(struct neg *n, uint64_t seq, const neg_entry_t *src) {
    neg_entry_t *d = &n->log[seq % NEG_LOG];
    d->kind = src->kind;
    d->n = src->n;
    d->u = src->u;
    atomic_store(&d->stamp, seq + 1);      /* seq_cst: read before any sleeper's flag */
}

void hvdl__neg_shm_publish(struct neg *n) {
    int k = 0;
    while (k < n->ndefer && room_for(n, n->defer[k].seq)) {
        write_entry(n, n->defer[k].seq, &n->defer[k].ent);
        k++;
    }
    if (!k) return;
    memmove(n->defer, n->defer + k, sizeof *n->defer * (size_t)(n->ndefer - k));
    n->ndefer -= k;
    ring_sleepers(n);
}

/* Room for one more element in a doubling array *p of *cap elements holding n. */
int hvdl__neg_shm_grow(engine_t *e, void **p, int *cap, int n, size_t elem, const char *what) {
    if (n < *cap) return 0;
    int want = *cap ? 2 * *cap : 16;
    void *q = HVDL_INJECT(e, INJ_LOG_ALLOC) ? NULL : realloc(*p, elem * (size_t)want);
    if (!q) return hvdl__oom(e, what, (int64_t)(elem * (size_t)want));
    *p = q;
    *cap = want;
    return 0;
}

int hvdl__neg_shm_append(engine_t *e, const neg_entry_t *ent) {
    struct neg *n = e->neg;
    uint64_t seq = atomic_fetch_add(n->tail, 1);
    if (!n->ndefer && room_for(n, seq)) {
        write_entry(n, seq, ent);
        ring_sleepers(n);
        return 0;
    }
    if (hvdl__neg_shm_grow(e, (void **)&n->defer, &n->capdefer, n->ndefer, sizeof *n->defer,
                           "negotiation log entry"))
        return -1;
    n->defer[n->ndefer++] = (deferred_t){seq, *ent};
    return 0;
}
