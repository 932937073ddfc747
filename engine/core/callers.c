/*
 * The threads that use the engine (the callers of hvdl_enqueue, hvdl_run, hvdl_wait and
 * hvdl_poll), and what each of them waits on: what deadlock.c needs to say that a rank
 * can submit nothing more. A rank whose one thread waits while another computes is not
 * blocked: the computing thread may still submit what the others wait for.
 *
 * A thread's record (caller_t) is its own, made on its first call into an engine and
 * kept in that engine's table (e->callers, under mu). The record is reference-counted
 * (the thread, and each engine that lists it), so neither side outlives the other's
 * memory: a thread that ends marks its record exited (a pthread key's destructor, which
 * touches only the record), and the engine drops exited records at its next look; an
 * engine freed first drops its references. A thread is found again by a thread-local
 * pointer and the serial of the engine it joined last (engines of one process are
 * numbered, so a new engine at a freed one's address is not mistaken for it).
 *
 * What counts as blocked: a thread asleep in hvdl_wait with no timeout, or on the op it
 * declared it waits for until done (hvdl_waits_until_done: the Python layer waits in
 * half-second slices so that Ctrl-C is honoured between them, and declares it), or
 * between two such slices (a declared wait that follows an undeclared slice on the same
 * op, with no call between, keeps that slice's start). A thread asleep in a wait with a
 * timeout it did not declare may go on when the timeout passes, and is busy; so is every thread doing anything
 * else, and every thread that has not yet called the engine is unknown (it is not
 * counted: the one case this cannot see, a thread whose first op comes after its peers
 * wait, is left to the stall inspector, as before).
 *
 * Cost model: a call finds its record with two loads and a compare; a post adds a load
 * and a store of the thread's own counter (no atomic read-modify-write, no lock) and a
 * load of its state. Joining (once per thread and engine) and every change made while
 * going to sleep are under mu, which the wait's slow path already takes. The table is
 * read only by deadlock.c's snapshot, when a caller has waited for seconds.
 */
#include "callers.h"
#include <stdlib.h>

struct callers {
    caller_t **v;
    int n, cap;
    uint64_t gone_posts;     /* posts of the threads that have ended */
    int unknown;             /* a thread could not be recorded: never blocked */
};

__thread caller_t *hvdl__tl_caller;
static pthread_key_t key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static atomic_int key_ok;
/* The engines' serials: the one value shared by all of a process's engines, as a thread's
 * record outlives the engine it last joined. */
static atomic_ullong serials;

static void unref(caller_t *c) {
    if (atomic_fetch_sub(&c->refs, 1) == 1) free(c);
}

static void thread_ends(void *p) {
    caller_t *c = p;
    atomic_store(&c->exited, 1);
    unref(c);
}

static void make_key(void) { atomic_store(&key_ok, !pthread_key_create(&key, thread_ends)); }

caller_t *hvdl__caller_join(engine_t *e) {
    pthread_once(&key_once, make_key);
    caller_t *c = hvdl__tl_caller;
    /* no record, or no destructor to tell the engine the thread ended: unknown */
    if (!c && atomic_load(&key_ok) && (c = calloc(1, sizeof *c))) {
        atomic_store(&c->refs, 1);
        if (pthread_setspecific(key, c)) {
            free(c);
            c = NULL;
        } else {
            hvdl__tl_caller = c;
        }
    }
    pthread_mutex_lock(&e->mu);
    struct callers *t = e->callers;
    if (!t && (t = e->callers = calloc(1, sizeof *t)))
        atomic_store_explicit(&e->caller_serial, atomic_fetch_add(&serials, 1) + 1,
                              memory_order_relaxed);
    int listed = 0;
    for (int i = 0; c && t && i < t->n && !listed; i++) listed = t->v[i] == c;
    if (c && t && !listed && t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 8;
        caller_t **v = realloc(t->v, sizeof *v * (size_t)cap);
        if (v) {
            t->v = v;
            t->cap = cap;
        }
    }
    if (c && t && !listed && t->n < t->cap) {
        atomic_fetch_add(&c->refs, 1);
        t->v[t->n++] = c;
        listed = 1;
    }
    if (t && !listed) t->unknown = 1;
    if (c && listed) c->serial = atomic_load_explicit(&e->caller_serial, memory_order_relaxed);
    pthread_mutex_unlock(&e->mu);
    /* without a table the engine cannot count its threads: deadlock.c's snapshot sees
     * e->callers NULL and never calls the rank blocked */
    return c && listed ? c : NULL;
}

void hvdl__caller_sleeps(engine_t *e, caller_t *c, op_t *o, double timeout_s, double now) {
    if (!c) return;
    /* the next slice of one wait keeps its start */
    int s = atomic_load(&c->state);
    if (!((s == CALLER_BETWEEN || s == CALLER_TIMED_OUT) && c->e == e && c->op == o &&
          c->handle == o->handle))
        c->since = now;
    c->e = e;
    c->op = o;
    c->handle = o->handle;
    c->forever = timeout_s < 0;
    atomic_store(&c->state, CALLER_ASLEEP);
}

void hvdl__caller_woke(caller_t *c, const op_t *o) {
    if (!c) return;
    int timed_out = !atomic_load(&o->done);
    atomic_store(&c->state, !timed_out                            ? CALLER_BUSY
                            : atomic_load(&c->until) == o->handle ? CALLER_BETWEEN
                                                                  : CALLER_TIMED_OUT);
}

/* c is blocked on an op of e */
static int blocked(engine_t *e, caller_t *c) {
    int s = atomic_load(&c->state);
    if (s == CALLER_BUSY || s == CALLER_TIMED_OUT || c->e != e) return 0;
    int declared = atomic_load(&c->until) == c->handle;
    return s == CALLER_ASLEEP ? c->forever || declared : declared;
}

int hvdl__callers_blocked(engine_t *e, double *since, uint64_t *posts) {
    struct callers *t = e->callers;
    *since = 0;
    *posts = 0;
    if (!t) return 0;
    int all = !t->unknown && t->n > 0;
    for (int i = 0; i < t->n; i++) {
        caller_t *c = t->v[i];
        if (atomic_load(&c->exited)) { /* the thread ended: it submits nothing more */
            t->gone_posts += atomic_load(&c->posts);
            t->v[i--] = t->v[--t->n];
            unref(c);
            continue;
        }
        *posts += atomic_load(&c->posts);
        if (!blocked(e, c)) all = 0;
        else if (c->since > *since) *since = c->since;
    }
    *posts += t->gone_posts;
    return all;
}

int hvdl__callers_wait_on(engine_t *e, const op_t *o) {
    struct callers *t = e->callers;
    for (int i = 0; t && i < t->n; i++)
        if (t->v[i]->op == o && t->v[i]->handle == o->handle && blocked(e, t->v[i])) return 1;
    return 0;
}

void hvdl__callers_free(engine_t *e) {
    struct callers *t = e->callers;
    if (!t) return;
    for (int i = 0; i < t->n; i++) unref(t->v[i]);
    free(t->v);
    free(t);
    e->callers = NULL;
}

/* The public declaration (horovodlike.h): the calling thread's waits on handle, from now
 * until the op is done, are one wait cut in slices; 0 ends it. */
void hvdl_waits_until_done(int64_t handle) {
    caller_t *c = hvdl__tl_caller;
    if (!c) return;
    atomic_store(&c->until, handle);
    if (!handle && atomic_load(&c->state) == CALLER_BETWEEN) atomic_store(&c->state, CALLER_BUSY);
}
