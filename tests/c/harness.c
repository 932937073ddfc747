#include "harness.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

atomic_int g_failures;

/* One write per failure, so that ranks' messages never interleave; the first 20 only. */
void check_failed(const char *file, int line, const char *fmt, ...) {
    if (atomic_fetch_add(&g_failures, 1) >= 20) return;
    char msg[1024];
    int n = snprintf(msg, sizeof msg, "FAIL %s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", msg);
}

typedef struct job {
    world_t *w;
    int rank;
    const char *blobs;
    void (*body)(world_t *w, int rank, void *arg);
    void *arg;
    int rc;
    char msg[HVDL_MSG_BYTES];
} job_t;

static void on_threads(world_t *w, void *(*fn)(void *), job_t *jobs) {
    pthread_t t[w->size];
    for (int r = 0; r < w->size; r++)
        if (pthread_create(&t[r], NULL, fn, &jobs[r])) {
            fprintf(stderr, "%s: cannot start a thread\n", w->label);
            exit(2);
        }
    for (int r = 0; r < w->size; r++) pthread_join(t[r], NULL);
}

static void *start_one(void *p) {
    job_t *j = p;
    j->rc = hvdl__engine_start(j->w->e[j->rank], j->rank, j->w->size, j->blobs);
    if (j->rc) snprintf(j->msg, sizeof j->msg, "%s", hvdl_last_error());
    return NULL;
}

world_t *world_start(int size, const world_opts_t *o) {
    world_t *w = calloc(1, sizeof *w);
    char *blobs = calloc((size_t)size, HVDL_BLOB_BYTES);
    job_t *jobs = calloc((size_t)size, sizeof *jobs);
    if (!w || !blobs || !jobs || !(w->e = calloc((size_t)size, sizeof *w->e))) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    w->size = size;
    w->label = o->label;
    w->may_fail = o->may_fail;
    if (!(w->start_msg = calloc((size_t)size, sizeof *w->start_msg))) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    static const unsigned char key[] = "tests/c job key";
    for (int r = 0; r < size; r++) {
        engine_t *e = hvdl__engine_new();
        if (!e) {
            fprintf(stderr, "out of memory\n");
            exit(2);
        }
        if (o->tweak) o->tweak(&e->cfg);
        if (o->inject && hvdl__inject_parse(o->inject, &e->cfg)) {
            fprintf(stderr, "%s: '%s' is not site[:rank[:nth]] with a known site\n", w->label,
                    o->inject);
            exit(2);
        }
        const char *host = o->hosts ? o->hosts[r] : "localhost";
        if (hvdl__engine_prepare(e, host, "127.0.0.1", "127.0.0.1", key, (int)sizeof key - 1,
                                 blobs + (size_t)r * HVDL_BLOB_BYTES)) {
            fprintf(stderr, "%s: prepare of rank %d failed: %s\n", w->label, r, hvdl_last_error());
            exit(2);
        }
        w->e[r] = e;
    }
    for (int r = 0; r < size; r++) jobs[r] = (job_t){.w = w, .rank = r, .blobs = blobs};
    on_threads(w, start_one, jobs);
    w->started = 1;
    for (int r = 0; r < size; r++) {
        if (!jobs[r].rc) continue;
        w->started = 0;
        snprintf(w->start_msg[r], HVDL_MSG_BYTES, "%s", jobs[r].msg);
        if (!o->may_fail) {
            fprintf(stderr, "%s: start of rank %d of %d failed: %s\n", w->label, r, size,
                    jobs[r].msg);
            exit(2);
        }
    }
    free(jobs);
    free(blobs);
    return w;
}

static void *run_one(void *p) {
    job_t *j = p;
    j->body(j->w, j->rank, j->arg);
    return NULL;
}

void world_run(world_t *w, void (*body)(world_t *w, int rank, void *arg), void *arg) {
    job_t jobs[w->size];
    for (int r = 0; r < w->size; r++)
        jobs[r] = (job_t){.w = w, .rank = r, .body = body, .arg = arg};
    on_threads(w, run_one, jobs);
}

static void *stop_one(void *p) {
    job_t *j = p;
    j->rc = hvdl__engine_shutdown(j->w->e[j->rank]);
    return NULL;
}

void world_stop(world_t *w) {
    job_t jobs[w->size];
    for (int r = 0; r < w->size; r++) jobs[r] = (job_t){.w = w, .rank = r};
    on_threads(w, stop_one, jobs);
    for (int r = 0; r < w->size; r++) {
        CHECK(w->may_fail || !w->e[r]->failed, "%s: rank %d failed: %s", w->label, r,
              w->e[r]->fail_msg);
        hvdl__engine_free(w->e[r]);
    }
    free(w->start_msg);
    free(w->e);
    free(w);
}

hvdl_request make_request(int op, int dtype, int set, const char *name, int ndim, int64_t d0,
                          int64_t d1) {
    hvdl_request q = {.op = op,
                      .dtype = dtype,
                      .reduce_op = HVDL_SUM,
                      .process_set = set,
                      .ndim = ndim,
                      .prescale = 1.0,
                      .postscale = 1.0,
                      .name = name};
    q.shape[0] = d0;
    q.shape[1] = d1;
    return q;
}

void small_pieces(config_t *c) {
    c->shm_chunk_bytes = 256;      /* shm pieces of a few hundred bytes */
    c->chunk_bytes = 256;          /* TCP receive-and-reduce staging */
    c->small_bytes = 64;           /* recursive doubling up to 64 bytes, then the ring */
    c->cycle_time = 0.0002;
    c->peer_timeout = 10;          /* a hang becomes a named failure soon */
}

void no_shm(config_t *c) {
    small_pieces(c);
    c->shm = 0;
}

/* Enqueue, wait and release at once, as the blocking Python calls do (hvdl_run: flagged
 * HVDL_CALLER_WAITS, so on one node the waiting thread does the engine's work itself). */
int run_op(engine_t *e, const hvdl_request *q, hvdl_result *res, char *msg) {
    int64_t h;
    /* waited for as the bindings wait (ops.py): half-second slices, declared to the
     * deadlock check (hvdl_waits_until_done), here for at most 60 s */
    int rc = hvdl__engine_run(e, q, q->input, q->output, 0.5, &h, msg, res);
    if (!h) return rc;
    hvdl_waits_until_done(h);
    double end = hvdl_now() + 60;
    do rc = hvdl__engine_wait(e, h, 0.5);
    while (rc == HVDL_ERR_TIMEOUT && hvdl_now() < end);
    hvdl_waits_until_done(0);
    if (rc == HVDL_OK) return hvdl__engine_release(e, h, msg, res);
    CHECK(0, "'%s' not done after 60 s", q->name);
    if (msg) snprintf(msg, HVDL_MSG_BYTES, "op '%s' not finished after 60.0 s", q->name);
    return rc;
}

/* The trace holds one JSON event per line; a collective's reads
 * {"name": "ALLREDUCE", ..., "args": {"tensors": ["<names>"], ..., "algorithm": "<alg>"}}. */
void traced_algorithm(const char *trace, const char *tensor, char *out, size_t cap) {
    out[0] = 0;
    FILE *f = fopen(trace, "r");
    if (!f) return;
    char want[160], line[4096];
    snprintf(want, sizeof want, "\"tensors\": [\"%s\"]", tensor);
    while (fgets(line, sizeof line, f)) {
        const char *at = strstr(line, want), *alg = at ? strstr(at, "\"algorithm\": \"") : NULL;
        if (!alg) continue;
        alg += strlen("\"algorithm\": \"");
        snprintf(out, cap, "%.*s", (int)strcspn(alg, "\""), alg);
        break;
    }
    fclose(f);
    remove(trace);
}
