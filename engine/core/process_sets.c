/*
 * Process sets: registered by the API under the engine's mutex, read by the loop (and by
 * a caller driving its work) without it. An entry is never freed or moved while the
 * engine lives (removal only marks it), and each slot of the table is an atomic pointer
 * published with release after the entry is filled in, so a reader that sees the
 * pointer sees the whole entry.
 */
#include "engine.h"
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- process sets ---- */

int hvdl__engine_set_add(engine_t *e, int id, const int *ranks, int n) {
    if (!e || !e->peers)
        return hvdl__err(HVDL_ERR_NOT_INITIALIZED,
                         "horovodlike has not been initialized; use hvd.init()");
    if (id < 0 || id >= HVDL_MAX_SETS)
        return hvdl__err(HVDL_ERR_INVALID, "process set id %d: at most %d process sets per job", id,
                         HVDL_MAX_SETS);
    if (n < 1 || n > e->size)
        return hvdl__err(HVDL_ERR_INVALID, "a process set needs 1 to %d ranks, not %d", e->size, n);
    for (int i = 0; i < n; i++)
        if (ranks[i] < 0 || ranks[i] >= e->size || (i && ranks[i] <= ranks[i - 1]))
            return hvdl__err(HVDL_ERR_INVALID,
                             "process set ranks must be sorted, unique and in [0, %d)", e->size);
    group_t *g = calloc(1, sizeof *g);
    if (!g || !(g->ranks = malloc(sizeof(int) * (size_t)n))) {
        free(g);
        return hvdl__err(HVDL_ERR_SYSTEM, "out of memory");
    }
    memcpy(g->ranks, ranks, sizeof(int) * (size_t)n);
    g->id = id;
    g->n = n;
    g->me = -1;
    for (int i = 0; i < n; i++)
        if (ranks[i] == e->rank) g->me = i;
    pthread_mutex_lock(&e->mu);
    int taken = e->sets[id] != NULL;
    /* release: g's fields, written above, are visible to whoever loads the pointer */
    if (!taken) atomic_store_explicit(&e->sets[id], g, memory_order_release);
    pthread_mutex_unlock(&e->mu);
    if (taken) {
        free(g->ranks);
        free(g);
        return hvdl__err(HVDL_ERR_INVALID, "process set id %d is already in use", id);
    }
    /* Rank 0 may already hold requests for this set, waiting for it to be known. */
    atomic_store(&e->sets_changed, 1);
    if (e->wake_fd >= 0) hvdl__wake(e);
    return HVDL_OK;
}

int hvdl__engine_set_remove(engine_t *e, int id) {
    if (!e || !e->peers)
        return hvdl__err(HVDL_ERR_NOT_INITIALIZED,
                         "horovodlike has not been initialized; use hvd.init()");
    if (id == 0) return hvdl__err(HVDL_ERR_INVALID, "the global process set cannot be removed");
    pthread_mutex_lock(&e->mu);
    group_t *g = id > 0 && id < HVDL_MAX_SETS ? e->sets[id] : NULL;
    int ok = g && !g->removed;
    if (ok) g->removed = 1;     /* kept allocated: the loop may still read it */
    pthread_mutex_unlock(&e->mu);
    return ok ? HVDL_OK : hvdl__err(HVDL_ERR_INVALID, "process set %d does not exist", id);
}
