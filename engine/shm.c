/*
 * The shared-memory segment of one node and job, and the one synchronisation primitive
 * the shm collectives use: "I finished phase v" / "wait until every local rank has".
 *
 * Naming and clean-up: local rank 0 creates /hvdl-<job>-<node> (job = rank 0's nonce,
 * node = a hash of the host name), the others open it, and the last local rank to map
 * it unlinks it (a rank that gives up, on the start timeout or a local rank's death,
 * unlinks it too). From then on the segment has no name: it lives
 * exactly as long as the processes that map it, so a crash can never leave one behind
 * and a later job can never find a stale one.
 *
 * Waiting: spin briefly on the peers' phase counters (a phase usually completes within
 * microseconds when every rank has a core), then block in futex_wait on the counter.
 * Posting wakes sleepers only when the shared sleeper count says there are any, so the
 * common case is one store. While blocked, the control sockets are watched, so a dead
 * local rank (reported by rank 0) ends the wait at once.
 */
#define _GNU_SOURCE
#include "internal.h"
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

static size_t header_bytes(int nlocal) { return (size_t)LINE * (size_t)(2 + nlocal); }

static _Atomic uint32_t *seq_of(hvdl_shm_t *s, int local) {
    return (_Atomic uint32_t *)(s->base + LINE * (1 + local));
}

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
        snprintf(why, sizeof why, "not every local rank attached within %.0f s (HOROVODLIKE_START_TIMEOUT)",
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
            snprintf(why, sizeof why, "rank %d (host %s) died while the local ranks attached", r, e->host);
            return why;
        }
    }
    usleep(1000);
    return NULL;
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
    if (!s) return -1;
    s->nlocal = nlocal;
    s->me = me;
    /* Oversubscribed ranks take turns on a core: fewer, larger pieces mean fewer turns. */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    s->oversubscribed = nlocal > cores;
    s->chunk = e->cfg.shm_chunk_bytes * (s->oversubscribed ? 4 : 1);
    s->slot_bytes = s->chunk * (nlocal + 1);       /* a piece (nlocal chunks) + a result */
    size_t bytes = header_bytes(nlocal) + (size_t)nlocal * 2 * (size_t)s->slot_bytes;
    char name[96];
    snprintf(name, sizeof name, "/hvdl-%016llx-%016llx", (unsigned long long)e->peers[0].nonce,
             (unsigned long long)fnv(e->host));
    double deadline = hvdl_now() + e->cfg.start_timeout;
    const char *why = NULL;
    int fd = -1, err = 0;
    if (HVDL_INJECT(e, INJ_SHM_ATTACH)) { why = "cannot attach it"; goto fail; }
    if (me == 0) {
        fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd < 0 || ftruncate(fd, (off_t)bytes)) { err = errno; why = "cannot create it"; goto fail; }
    } else {
        struct stat st;
        while ((fd = shm_open(name, O_RDWR, 0600)) < 0 || fstat(fd, &st) || (size_t)st.st_size < bytes) {
            if (fd >= 0) close(fd);
            fd = -1;
            if ((why = attach_wait(e, deadline))) goto fail;
        }
    }
    s->base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (s->base == MAP_FAILED) { s->base = NULL; err = errno; why = "cannot map it"; goto fail; }
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
    hvdl__fail_job(e, HVDL_ERR_SYSTEM, "could not set up the shared-memory segment %s of host %s "
               "with %d local ranks: %s%s%s", name, e->host, nlocal, why,
               err ? ": " : "", err ? strerror(err) : "");
    shm_unlink(name);               /* whoever fails removes the name: none is left behind */
    if (s->base) munmap(s->base, bytes);
    free(s);
    return -1;
}

void hvdl__shm_close(engine_t *e) {
    if (!e->shm) return;
    munmap(e->shm->base, e->shm->bytes);
    free(e->shm);
    e->shm = NULL;
}

void hvdl__shm_post(ctx_t *c) {
    hvdl_shm_t *s = c->shm;
    _Atomic uint32_t *mine = seq_of(s, s->me);
    atomic_store_explicit(mine, ++s->phase, memory_order_release);
    if (atomic_load(&((shm_header_t *)s->base)->sleepers))
        hvdl_futex_wake_all(mine);
}

static int reached(_Atomic uint32_t *seq, uint32_t v) {
    return (int32_t)(atomic_load_explicit(seq, memory_order_acquire) - v) >= 0;
}

/* The global rank of this node's local rank `local`. */
static int global_rank(engine_t *e, int local) {
    for (int r = 0, k = 0; r < e->size; r++)
        if (!strcmp(e->peers[r].host, e->host) && k++ == local) return r;
    return -1;
}

/* Wait until every local rank has posted the phase this rank just posted. */
int hvdl__shm_wait_all(ctx_t *c) {
    engine_t *e = c->engine;
    hvdl_shm_t *s = c->shm;
    shm_header_t *h = (shm_header_t *)s->base;
    uint32_t v = s->phase;
    double now = hvdl_now(), spin_until = now + c->spin_us * 1e-6;
    if (hvdl__liveness_check(e, now)) return -1;
    for (int q = 0; q < s->nlocal; q++) {
        _Atomic uint32_t *seq = seq_of(s, q);
        while (!reached(seq, v) && hvdl_now() < spin_until)
            for (int i = 0; i < 16; i++) hvdl_pause();
        double since = hvdl_now();
        while (!reached(seq, v)) {
            uint32_t cur = atomic_load(seq);
            atomic_fetch_add(&h->sleepers, 1);
            struct timespec ts = {0, 50 * 1000 * 1000};
            if (!reached(seq, v)) hvdl_futex_wait(seq, cur, &ts);
            atomic_fetch_sub(&h->sleepers, 1);
            if (reached(seq, v)) break;
            /* Still waiting: has anyone reported a dead rank? Is everyone alive? */
            if (hvdl__watch_control(e, 0) || hvdl__liveness_check(e, hvdl_now())) return -1;
            /* One heartbeat interval later than liveness.c, as the TCP transport does. */
            if (hvdl_now() - since > e->cfg.peer_timeout + hvdl__heartbeat_interval(e)) {
                char why[160];
                snprintf(why, sizeof why, "its shared-memory flag did not advance for %.0f s",
                         hvdl_now() - since);
                int r = global_rank(e, q);
                if (r >= 0) hvdl__peer_lost(e, r, why);
                else hvdl__fail(e, HVDL_ERR_PEER_LOST, "local rank %d %s", q, why);
                return -1;
            }
        }
    }
    return 0;
}
