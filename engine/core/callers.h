/*
 * The threads that use the engine, and what each waits on (callers.c): deadlock.c counts
 * a rank as blocked only when every one of them is blocked in an engine wait.
 */
#ifndef HVDL_CALLERS_H
#define HVDL_CALLERS_H
#include "engine.h"

/* What a thread is doing, as deadlock.c sees it: anything but waiting (it may submit),
 * asleep in hvdl_wait, between the slices of a wait it declared to last until its op is
 * done (hvdl_waits_until_done), or back from an undeclared wait's timeout (busy, but a
 * declared wait on the same op that follows with no call between keeps its start). */
enum { CALLER_BUSY, CALLER_ASLEEP, CALLER_BETWEEN, CALLER_TIMED_OUT };

typedef struct caller {
    atomic_int refs;         /* the thread's own, and one per engine whose table lists it */
    atomic_int exited;       /* the thread has ended (the key's destructor) */
    atomic_int state;        /* CALLER_*: set by its thread, read under the engine's mu */
    atomic_llong until;      /* the handle it waits for in slices (0: none); its thread's */
    atomic_ullong posts;     /* ops it posted (written by its thread alone: load, store) */
    uint64_t serial;         /* the engine it last joined (its thread only) */
    /* Under the engine's mu, written by its thread as it goes to sleep: */
    engine_t *e;             /* the engine it waits in */
    op_t *op;                /* the op, and its handle (the pair names it: no reuse) */
    int64_t handle;
    int forever;             /* the wait has no timeout */
    double since;            /* when this wait began (its first slice) */
} caller_t;

extern __thread caller_t *hvdl__tl_caller;
caller_t *hvdl__caller_join(engine_t *e);

/* The calling thread's record in e's table (joined on its first call), or NULL where
 * there was no memory for it (then e never counts as blocked). Two loads and a compare
 * once joined. */
static inline caller_t *hvdl__caller(engine_t *e) {
    caller_t *c = hvdl__tl_caller;
    if (c && c->serial == atomic_load_explicit(&e->caller_serial, memory_order_relaxed)) return c;
    return hvdl__caller_join(e);
}

/* The thread posts an op (ps: it is busy, and the rank's posts change). */
static inline void hvdl__caller_posts(caller_t *c) {
    if (!c) return;
    atomic_store_explicit(&c->posts, atomic_load_explicit(&c->posts, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    if (atomic_load_explicit(&c->state, memory_order_relaxed) != CALLER_BUSY)
        atomic_store_explicit(&c->state, CALLER_BUSY, memory_order_relaxed);
}

/* The thread does something else with the engine than wait on: it is busy. */
static inline void hvdl__caller_busy(caller_t *c) {
    if (c && atomic_load_explicit(&c->state, memory_order_relaxed) != CALLER_BUSY)
        atomic_store_explicit(&c->state, CALLER_BUSY, memory_order_relaxed);
}

/* Under e->mu, from hvdl__engine_wait: going to sleep on o, and back from that sleep. */
void hvdl__caller_sleeps(engine_t *e, caller_t *c, op_t *o, double timeout_s, double now);
void hvdl__caller_woke(caller_t *c, const op_t *o);

/* Under e->mu, for deadlock.c: whether every live thread that has used e is blocked in a
 * wait (then *since is when the last of them began waiting), and the ops they post. */
int hvdl__callers_blocked(engine_t *e, double *since, uint64_t *posts);
/* Under e->mu: a blocked thread waits on o. */
int hvdl__callers_wait_on(engine_t *e, const op_t *o);
void hvdl__callers_free(engine_t *e);
#endif
