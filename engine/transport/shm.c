/*
 * The shared-memory segment of one node and job, and the one synchronisation primitive
 * the shm collectives use: a barrier of every local rank, in two halves
 * (hvdl__shm_post: "I arrived", hvdl__shm_wait_all: "wait until every local rank has").
 *
 * Naming and clean-up: local rank 0 creates /hvdl-<job>-<node> (job = rank 0's nonce,
 * node = a hash of the host name), the others open it, and the last local rank to map
 * it unlinks it (a rank that gives up, on the start timeout or a local rank's death,
 * unlinks it too). From then on the segment has no name: it lives
 * exactly as long as the processes that map it, so a crash can never leave one behind
 * and a later job can never find a stale one.
 *
 * The barrier: a shared arrival counter and a generation word, each on its own cache
 * line. Arriving is one atomic add on the counter; the rank whose add completes barrier
 * v (the counter reaches v * L for L local ranks) stores v in the generation word and,
 * only if the shared sleeper count says anyone sleeps, wakes them all with ONE
 * FUTEX_WAKE on that word. Waiters spin briefly on the generation word (a barrier
 * usually completes within microseconds when every rank has a core; no spinning at all
 * when ranks outnumber cores), then block in futex_wait on it. Every rank also stores
 * the barrier it reached in a word of its own, read only to name a rank that stopped.
 *
 * Cost per barrier, L local ranks:
 *   arrivals  L atomic adds on one line: they serialise, ~0.1 us each across cores, so
 *             under 1 us at L = 8; plus one store per rank to its own line;
 *   release   one store of the generation word, seen by every spinning waiter as one
 *             cache-line transfer each; with sleepers, one futex_wake system call;
 *   sleepers  each sleeper is woken once, by the last arrival, when it can go on.
 * A word per rank instead (every rank posts its own word, a waiter waits on each word in
 * turn) costs a waiter up to L - 1 wake-ups per barrier and a FUTEX_WAKE per arrival when
 * anyone sleeps: with 8 ranks on 2 cores a waiter wakes, finds the next rank not there
 * yet, and sleeps again, each time taking the core from a rank that has work to do
 * (measured: docs/benchmarks.md, "One barrier per shared-memory piece").
 * A tree or dissemination barrier would avoid the shared counter but needs log L rounds,
 * each a potential wake-up when oversubscribed: the central counter is the cheap choice
 * for the few ranks of one node.
 *
 * Ordering: each arrival's add is a release, so the slot data a rank wrote before it
 * arrived is visible to the last arrival (its add acquires the whole sequence of adds),
 * whose store of the generation is a release that every waiter acquires. The sleeper
 * count and the generation word form a Dekker pair (both sides sequentially
 * consistent): a waiter that counted itself as a sleeper either sees the new
 * generation before it sleeps or is seen by the last arrival, which then wakes it.
 *
 * Liveness: while blocked (50 ms at a time), the control sockets are watched, so a dead
 * local rank (reported by rank 0) ends the wait at once, and the heartbeats are checked;
 * a barrier that makes no progress for the peer timeout names the first local rank
 * whose own word shows it has not arrived.
 */
#define _GNU_SOURCE
#include "fail.h"
#include "liveness.h"
#include "negotiation.h"
#include "net.h"
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SHM_MAGIC 0x68766c73u   /* "hvls" */
#define LINE 64

typedef struct shm_header {
    _Atomic uint32_t magic;      /* set last by the creator: the segment is ready */
    _Atomic uint32_t attached;   /* local ranks that have mapped it */
    _Atomic uint32_t sleepers;   /* ranks blocked in futex_wait */
    uint32_t nlocal;
    int64_t slot_bytes;
} shm_header_t;

/* Line 0: the header. Line 1: the arrival counter. Line 2: the generation word (what
 * waiters watch, so arrivals do not disturb them), and after it the time of its last
 * release, which a rank that slept reads to count its wake-up. Then one line per local
 * rank: the barrier it reached. Then negotiation's part (negotiate_shm.c). Then the slots. */
static size_t header_bytes(int nlocal) {
    return (size_t)LINE * (size_t)(3 + nlocal) + hvdl__neg_bytes(nlocal);
}

uint8_t *hvdl__shm_neg_area(hvdl_shm_t *s) {
    return s->base + (size_t)LINE * (size_t)(3 + s->nlocal);
}

static _Atomic uint32_t *word_at(hvdl_shm_t *s, int line) {
    return (_Atomic uint32_t *)(s->base + LINE * line);
}
static _Atomic uint32_t *arrived_of(hvdl_shm_t *s) { return word_at(s, 1); }
static _Atomic uint32_t *generation_of(hvdl_shm_t *s) { return word_at(s, 2); }
/* CLOCK_MONOTONIC is one clock for every process of the node. */
static _Atomic double *released_at(hvdl_shm_t *s) {
    return (_Atomic double *)(s->base + LINE * 2 + 8);
}
static _Atomic uint32_t *reached_by(hvdl_shm_t *s, int local) { return word_at(s, 3 + local); }

uint8_t *hvdl__shm_slot(hvdl_shm_t *s, int local, int which) {
    return s->base + header_bytes(s->nlocal) + (size_t)local * 2 * (size_t)s->slot_bytes +
           (size_t)which * (size_t)s->slot_bytes;
}

static uint64_t fnv(const char *s) {
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ULL;
    return h;
}

/* One step of a start-up wait for the other local ranks: NULL to go on waiting, or why
 * not (the start timeout passed, or a local rank died: its data connection closed, and
 * nothing else travels on it before start-up ends). */
static const char *attach_wait(engine_t *e, double deadline) {
    static __thread char why[320];
    if (hvdl__startup_abort(e, 0)) return e->fail_msg;   /* a rank failed and said why */
    if (hvdl_now() > deadline) {
        snprintf(
            why, sizeof why,
            "not every local rank attached within %.0f s (horovodlikerun --start-timeout, or HOROVODLIKE_START_TIMEOUT)",
            e->cfg.start_timeout);
        return why;
    }
    for (int r = 0; r < e->size; r++) {
        int fd = e->peers[r].data_fd;
        if (r == e->rank || fd < 0 || strcmp(e->peers[r].host, e->host)) continue;
        struct pollfd pf = {fd, POLLIN | POLLRDHUP, 0};
        char c;
        if (poll(&pf, 1, 0) == 1 && (pf.revents & (POLLHUP | POLLERR | POLLRDHUP) ||
                                     recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0)) {
            if (hvdl__startup_abort(e, 1000)) return e->fail_msg;   /* did it say why? */
            snprintf(why, sizeof why, "rank %d (host %s) died while the local ranks attached", r,
                     e->host);
            return why;
        }
    }
    usleep(1000);
    return NULL;
}

/* The reductions' chunk (allreduce, reducescatter, alltoall): the setting, but small
 * enough that the node's slots (2 L (L + 1) chunks) stay in the last-level cache. Every
 * rank reads a piece from every slot, so with more ranks the slots grow as L squared,
 * and once they spill, each piece comes from DRAM once more; the extra barriers of
 * smaller pieces cost less than that.
 * Broadcast and allgather read one slot per piece and keep the larger chunk: for them
 * smaller pieces would only add barriers.
 * Measured: docs/benchmarks.md, "Barriers from the segment, reductions sized to the cache".
 * The budget is fixed rather than read from the cache size so that it depends only on
 * L and the agreed setting: nodes of equal size must cut pieces alike (allreduce_hier.c). */
#define SLOTS_BUDGET ((int64_t)4 << 20)
static int64_t reduce_chunk_bytes(int64_t setting, int nlocal) {
    int64_t cap = SLOTS_BUDGET / (2 * (int64_t)nlocal * (nlocal + 1)) & ~(int64_t)63;
    if (cap < 4096) cap = 4096;
    return setting < cap ? setting : cap;
}

int hvdl__shm_open(engine_t *e) {
    int nlocal = 0, me = -1;
    for (int r = 0; r < e->size; r++) {
        if (strcmp(e->peers[r].host, e->host)) continue;
        if (r == e->rank) me = nlocal;
        nlocal++;
    }
    if (nlocal < 2 || !e->cfg.shm) return 0;
    hvdl_shm_t *s = calloc(1, sizeof *s);
    if (!s) return hvdl__oom(e, "shared-memory segment record", (int64_t)sizeof *s);
    s->nlocal = nlocal;
    s->me = me;
    /* Oversubscribed ranks take turns on a core: fewer, larger pieces mean fewer turns
     * for the copies (broadcast, allgather), which read one slot per piece. */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    s->chunk = e->cfg.shm_chunk_bytes * (nlocal > cores ? 4 : 1);
    s->rchunk = reduce_chunk_bytes(e->cfg.shm_chunk_bytes, nlocal);
    s->slot_bytes = s->chunk * (nlocal + 1);       /* a piece (nlocal chunks) + a result */
    size_t bytes = header_bytes(nlocal) + (size_t)nlocal * 2 * (size_t)s->slot_bytes;
    char name[96];
    snprintf(name, sizeof name, "/hvdl-%016llx-%016llx", (unsigned long long)e->peers[0].nonce,
             (unsigned long long)fnv(e->host));
    double deadline = hvdl_now() + e->cfg.start_timeout;
    const char *why = NULL;
    int fd = -1, err = 0;
    if (HVDL_INJECT(e, INJ_SHM_ATTACH)) {
        why = "cannot attach it";
        goto fail;
    }
    if (me == 0) {
        fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd < 0 || ftruncate(fd, (off_t)bytes)) {
            err = errno;
            why = "cannot create it";
            goto fail;
        }
    } else {
        struct stat st;
        while ((fd = shm_open(name, O_RDWR, 0600)) < 0 || fstat(fd, &st) ||
               (size_t)st.st_size < bytes) {
            if (fd >= 0) close(fd);
            fd = -1;
            if ((why = attach_wait(e, deadline))) goto fail;
        }
    }
    s->base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (s->base == MAP_FAILED) {
        s->base = NULL;
        err = errno;
        why = "cannot map it";
        goto fail;
    }
    s->bytes = bytes;
    shm_header_t *h = (shm_header_t *)s->base;
    if (me == 0) {
        h->nlocal = (uint32_t)nlocal;
        h->slot_bytes = s->slot_bytes;
        atomic_store(&h->magic, SHM_MAGIC);
    }
    while (atomic_load(&h->magic) != SHM_MAGIC)
        if ((why = attach_wait(e, deadline))) goto fail;
    /* The last to attach removes the name: from then on the segment is nameless and
     * nothing can be left behind, whoever dies. */
    if (atomic_fetch_add(&h->attached, 1) + 1 == (uint32_t)nlocal) shm_unlink(name);
    while (atomic_load(&h->attached) < (uint32_t)nlocal)
        if ((why = attach_wait(e, deadline))) goto fail;
    e->shm = s;
    return 0;
fail:
    hvdl__fail_job(e, HVDL_ERR_SYSTEM,
                   "could not set up the shared-memory segment %s of host %s "
                   "with %d local ranks: %s%s%s",
                   name, e->host, nlocal, why, err ? ": " : "", err ? strerror(err) : "");
    shm_unlink(name);               /* whoever fails removes the name: none is left behind */
    if (s->base) munmap(s->base, bytes);
    free(s);
    return -1;
}

/* The loop thread, as it ends: what the barriers cost (debug level). */
void hvdl__shm_report(engine_t *e) {
    hvdl_shm_t *s = e->shm;
    if (s && s->waits)
        hvdl__log(
            e, HVDL_LOG_DEBUG,
            "rank %d's shared-memory barriers: %lld waits, %.1f us each on "
            "average; %lld slept, woken %.1f us after the release on average (at most %.0f us)",
            e->rank, (long long)s->waits, s->waited_s * 1e6 / (double)s->waits, (long long)s->slept,
            s->slept ? s->wake_s * 1e6 / (double)s->slept : 0.0, s->wake_max_s * 1e6);
    if (s && s->two_shots) {
        double k = 1e6 / (double)s->two_shots;
        hvdl__log(e, HVDL_LOG_DEBUG,
                  "rank %d's two-shot allreduces: %lld, on average %.1f us copying in, "
                  "%.1f us reducing, %.1f us copying out",
                  e->rank, (long long)s->two_shots, s->copy_in_s * k, s->reduce_s * k,
                  s->copy_out_s * k);
    }
}

void hvdl__shm_close(engine_t *e) {
    if (!e->shm) return;
    munmap(e->shm->base, e->shm->bytes);
    free(e->shm);
    e->shm = NULL;
}

/* Arrive at the next barrier. Every rank calls hvdl__shm_wait_all before it posts again. */
void hvdl__shm_post(ctx_t *c) {
    hvdl_shm_t *s = c->shm;
    uint32_t v = ++s->phase;
    /* Unsigned arithmetic: the counter and v * L wrap alike. */
    uint32_t before = atomic_fetch_add_explicit(arrived_of(s), 1, memory_order_acq_rel);
    if (before + 1 == v * (uint32_t)s->nlocal) {         /* the last to arrive */
        atomic_store_explicit(released_at(s), hvdl_now(), memory_order_relaxed);
        atomic_store(generation_of(s), v);
        if (atomic_load(&((shm_header_t *)s->base)->sleepers))
            hvdl_futex_wake_all(generation_of(s));
    }
    /* After the add: a rank stopped between its add and its release of the barrier has
     * not written this yet, so it is the one named. */
    atomic_store_explicit(reached_by(s, s->me), v, memory_order_relaxed);
}

static int reached(_Atomic uint32_t *word, uint32_t v) {
    return (int32_t)(atomic_load_explicit(word, memory_order_acquire) - v) >= 0;
}

/* The global rank of this node's local rank `local`. */
static int global_rank(engine_t *e, int local) {
    for (int r = 0, k = 0; r < e->size; r++)
        if (!strcmp(e->peers[r].host, e->host) && k++ == local) return r;
    return -1;
}

/* The barrier made no progress for the peer timeout: name the first local rank that has
 * not arrived. */
static int stalled(engine_t *e, hvdl_shm_t *s, uint32_t v, double waited) {
    char why[160];
    snprintf(why, sizeof why, "its shared-memory flag did not advance for %.0f s", waited);
    for (int q = 0; q < s->nlocal; q++) {
        if (reached(reached_by(s, q), v)) continue;
        int r = global_rank(e, q);
        if (r >= 0) hvdl__peer_lost(e, r, why);
        else hvdl__fail(e, HVDL_ERR_PEER_LOST, "local rank %d %s", q, why);
        return -1;
    }
    hvdl__fail(e, HVDL_ERR_PEER_LOST,
               "the local ranks' shared-memory barrier %u did not "
               "complete for %.0f s although every rank arrived",
               v, waited);
    return -1;
}

/* Wait until every local rank has arrived at the barrier this rank last posted. */
int hvdl__shm_wait_all(ctx_t *c) {
    engine_t *e = c->engine;
    hvdl_shm_t *s = c->shm;
    shm_header_t *h = (shm_header_t *)s->base;
    _Atomic uint32_t *gen = generation_of(s);
    uint32_t v = s->phase;
    double now = hvdl_now(), spin_until = now + c->spin_us * 1e-6;
    if (hvdl__liveness_check(e, now)) return -1;
    while (!reached(gen, v) && hvdl_now() < spin_until)
        for (int i = 0; i < 16; i++) hvdl_pause();
    double since = hvdl_now();
    uint32_t seen = atomic_load(arrived_of(s));
    int slept = 0;
    while (!reached(gen, v)) {
        slept = 1;
        uint32_t cur = atomic_load(gen);
        atomic_fetch_add(&h->sleepers, 1);
        struct timespec ts = {0, 50 * 1000 * 1000};
        if (!reached(gen, v)) hvdl_futex_wait(gen, cur, &ts);
        atomic_fetch_sub(&h->sleepers, 1);
        if (reached(gen, v)) break;
        /* Still waiting: has anyone reported a dead rank? Is everyone alive? */
        if (hvdl__watch_control(e, 0) || hvdl__liveness_check(e, hvdl_now())) return -1;
        uint32_t arrived = atomic_load(arrived_of(s));
        if (arrived != seen) seen = arrived, since = hvdl_now();   /* someone arrived */
        /* One heartbeat interval later than liveness.c, as the TCP transport does. */
        else if (hvdl_now() - since > e->cfg.peer_timeout + hvdl__heartbeat_interval(e))
            return stalled(e, s, v, hvdl_now() - since);
    }
    double end = hvdl_now();
    s->waits++;
    s->waited_s += end - now;
    if (slept) {
        /* Exact: the next release needs this rank's arrival, and the generation's acquire
         * orders the time stored before it. */
        double wake = end - atomic_load_explicit(released_at(s), memory_order_relaxed);
        s->slept++;
        s->wake_s += wake;
        if (wake > s->wake_max_s) s->wake_max_s = wake;
    }
    return 0;
}
