/*
 * The timeline writer. Events are formatted by the thread that records them (the engine
 * thread, or a caller running the engine's work) into a pending buffer (under a mutex,
 * no I/O); a writer thread appends each batch to the file together with
 * the closing "\n]}" in one pwrite at the end of the previous batch, so the file is valid
 * JSON after every write and a crash leaves at most the last batch to lose. The write
 * holds an exclusive flock: a reader that takes a shared flock (the viewer does) can
 * never copy half of a write, even while the job runs.
 *
 * File: {"otherData": {...}, "traceEvents": [ metadata, events ... ]}. ts are microseconds
 * since this engine started; otherData carries start_time_since_epoch_in_micros and
 * clock_offset_us (rank 0's clock minus ours) so a viewer can lay ranks on one axis.
 * HOROVOD_TIMELINE_MAX_MB caps the file; HOROVOD_TIMELINE_START_STEP/STOP_STEP keep only a
 * window of training steps (a step is counted each time the first tensor this engine ever
 * saw is submitted again).
 */
#include "engine.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

struct timeline {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    buf_t pending;           /* formatted events, each starting with ",\n" */
    int stop;
    int fd;
    int64_t tail_at;         /* file offset of the closing "\n]}" */
    int64_t cap;             /* bytes; 0 = no cap */
    int truncated;
    pthread_t writer;
};

static const char CLOSE[] = "\n]}\n";

void hvdl__json_str(buf_t *b, const char *s) {
    buf_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            buf_put(b, "\\", 1);
            buf_put(b, s, 1);
        } else if (c < 0x20) {
            char u[8];
            snprintf(u, sizeof u, "\\u%04x", c);
            buf_put(b, u, 6);
        } else buf_put(b, s, 1);
    }
    buf_put(b, "\"", 1);
}

typedef struct writer_arg {
    engine_t *e;
    struct timeline *t;
} writer_arg_t;

static void *writer_main(void *arg) {
    engine_t *e = ((writer_arg_t *)arg)->e;
    struct timeline *t = ((writer_arg_t *)arg)->t;
    free(arg);
    buf_t batch = {0};
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->pending.len && !t->stop) pthread_cond_wait(&t->cv, &t->mu);
        if (!t->pending.len && t->stop) break;
        buf_t swap = t->pending;      /* take the batch; the engine keeps appending */
        t->pending = batch;
        batch = swap;
        /* The flag is set under mu, where emit() reads it: no event can join pending
         * after the batch that hits the cap, so the note stays the file's last event. */
        int hit = !t->truncated && t->cap && t->tail_at + batch.len > t->cap;
        if (hit) t->truncated = 1;
        pthread_mutex_unlock(&t->mu);
        if (hit) {
            batch.len = 0;
            char note[256];
            int n = snprintf(
                note, sizeof note,
                ",\n{\"name\": \"TIMELINE_TRUNCATED\", \"ph\": \"i\", "
                "\"s\": \"g\", \"pid\": %d, \"tid\": 6, \"ts\": %.1f, \"args\": {\"cap_bytes\": %lld}}",
                e->rank, (hvdl_now() - e->t0) * 1e6, (long long)t->cap);
            buf_put(&batch, note, n);
        }
        if (batch.len) {
            buf_put(&batch, CLOSE, sizeof CLOSE - 1);
            /* A reader that holds a shared flock never sees a half-written batch. */
            flock(t->fd, LOCK_EX);
            if (pwrite(t->fd, batch.data, (size_t)batch.len, t->tail_at) == batch.len)
                t->tail_at += batch.len - (int64_t)(sizeof CLOSE - 1);
            flock(t->fd, LOCK_UN);
        }
        batch.len = 0;
        pthread_mutex_lock(&t->mu);
    }
    pthread_mutex_unlock(&t->mu);
    buf_free(&batch);
    return NULL;
}

static void rank_path(const char *path, int rank, char *out, size_t cap) {
    const char *slash = strrchr(path, '/'), *dot = strrchr(path, '.');
    if (dot && (!slash || dot > slash) && dot != path)
        snprintf(out, cap, "%.*s.rank%d%s", (int)(dot - path), path, rank, dot);
    else snprintf(out, cap, "%s.rank%d.json", path, rank);
}

static void write_header(engine_t *e, buf_t *h) {
    static const char *const LANES[] = {[0] = "",
                                        [TL_NEGOTIATE] = "negotiate",
                                        [TL_QUEUE] = "queue",
                                        [TL_MEMCPY] = "memcpy",
                                        [TL_COLLECTIVE] = "collective",
                                        [TL_ALGORITHM] = "algorithm",
                                        [TL_CYCLES] = "cycles",
                                        [TL_P2P] = "p2p"};
    _Static_assert(sizeof LANES / sizeof LANES[0] == TL_LANES, "a timeline lane without a name");
    char tmp[512];
    int n = snprintf(tmp, sizeof tmp,
                     "{\"otherData\": {\"rank\": %d, \"size\": %d, \"hostname\": ", e->rank,
                     e->size);
    buf_put(h, tmp, n);
    hvdl__json_str(h, e->host);
    n = snprintf(
        tmp, sizeof tmp,
        ", \"start_time_since_epoch_in_micros\": %.0f, \"clock_offset_us\": %.1f, "
        "\"engine\": \"horovodlike\", \"version\": \"0.1.0\"},\n\"traceEvents\": [\n"
        "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": \"rank %d (",
        e->t0_epoch_us, e->clock_offset_us, e->rank, e->rank);
    buf_put(h, tmp, n);
    buf_put(h, e->host, (int64_t)strlen(e->host));
    buf_put(h, ")\"}}", 4);
    for (int i = 1; i < TL_LANES; i++) {
        n = snprintf(tmp, sizeof tmp,
                     ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, "
                     "\"args\": {\"name\": \"%s\"}}",
                     e->rank, i, LANES[i]);
        buf_put(h, tmp, n);
    }
}

int hvdl__timeline_open(engine_t *e, const char *path, int mark_cycles) {
    hvdl__timeline_close(e);
    char file[4096];
    rank_path(path, e->rank, file, sizeof file);
    int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    /* Tools written for Horovod open exactly the path they gave: there, rank 0's trace
     * is a second name (a hard link) for its rank file, so both are always the same
     * valid JSON. Where links are refused (another filesystem, a name in use by a
     * directory) the rank files alone remain, as before. */
    if (e->rank == 0 && strcmp(file, path) != 0 && (unlink(path) == 0 || errno == ENOENT))
        (void)link(file, path);
    struct timeline *t = calloc(1, sizeof *t);
    if (!t) {
        close(fd);
        return -1;
    }
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    t->fd = fd;
    t->cap = e->cfg.timeline_max_bytes;
    atomic_store(&e->tl_mark_cycles, mark_cycles);
    buf_t h = {0};
    write_header(e, &h);
    buf_put(&h, CLOSE, sizeof CLOSE - 1);
    if (pwrite(fd, h.data, (size_t)h.len, 0) != h.len) {
        buf_free(&h);
        close(fd);
        free(t);
        return -1;
    }
    t->tail_at = h.len - (int64_t)(sizeof CLOSE - 1);
    buf_free(&h);
    writer_arg_t *wa = malloc(sizeof *wa);
    if (!wa || pthread_create(&t->writer, NULL, writer_main,
                              wa ? (*wa = (writer_arg_t){e, t}, wa) : NULL)) {
        free(wa);
        close(fd);
        free(t);
        return -1;
    }
    pthread_mutex_lock(&e->tl_mu);
    e->tl = t;
    pthread_mutex_unlock(&e->tl_mu);
    atomic_store(&e->tl_on, 1);
    return 0;
}

void hvdl__timeline_close(engine_t *e) {
    atomic_store(&e->tl_on, 0);
    pthread_mutex_lock(&e->tl_mu);
    struct timeline *t = e->tl;
    e->tl = NULL;
    pthread_mutex_unlock(&e->tl_mu);
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    t->stop = 1;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->writer, NULL);
    close(t->fd);
    buf_free(&t->pending);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    free(t);
}

static int in_window(engine_t *e) {
    return e->step >= e->cfg.timeline_start_step &&
           (e->cfg.timeline_stop_step < 0 || e->step < e->cfg.timeline_stop_step);
}

/* Lock order: e->tl_mu, then t->mu. tl_mu only guards the e->tl pointer against a
 * concurrent stop_timeline(); the writer thread takes t->mu alone. */
static void emit(engine_t *e, const char *text, int n) {
    pthread_mutex_lock(&e->tl_mu);
    struct timeline *t = e->tl;
    if (t) {
        pthread_mutex_lock(&t->mu);
        if (!t->truncated) {
            buf_put(&t->pending, text, n);
            pthread_cond_signal(&t->cv);
        }
        pthread_mutex_unlock(&t->mu);
    }
    pthread_mutex_unlock(&e->tl_mu);
}

static void event(engine_t *e, int lane, const char *name, const char *ph, double t0, double dur,
                  const char *args) {
    if (!in_window(e)) return;
    buf_t b = {0};
    char head[256];
    int n = snprintf(
        head, sizeof head,
        ",\n{\"name\": \"%s\", \"ph\": \"%s\", %s\"pid\": %d, \"tid\": %d, \"ts\": %.1f", name, ph,
        *ph == 'i' ? "\"s\": \"t\", " : "", e->rank, lane, (t0 - e->t0) * 1e6);
    buf_put(&b, head, n);
    if (*ph == 'X') {
        n = snprintf(head, sizeof head, ", \"dur\": %.1f", dur * 1e6);
        buf_put(&b, head, n);
    }
    if (args) {
        buf_put(&b, ", \"args\": {", 11);
        buf_put(&b, args, (int64_t)strlen(args));
        buf_put(&b, "}", 1);
    }
    buf_put(&b, "}", 1);
    emit(e, (const char *)b.data, (int)b.len);
    buf_free(&b);
}

void hvdl__tl_span(engine_t *e, int lane, const char *name, double t0, double t1,
                   const char *args) {
    event(e, lane, name, "X", t0, t1 - t0, args);
}

void hvdl__tl_instant(engine_t *e, int lane, const char *name, double t, const char *args) {
    event(e, lane, name, "i", t, 0, args);
}

/* A training loop submits the same names every step, but start-up (broadcasts of the
 * initial weights) submits names that never recur. So the step marker is the first name
 * seen twice; every later submission of it starts a step. Until it is found, names are
 * remembered (a bounded number). */
void hvdl__tl_count_step(engine_t *e, const char *name) {
    if (!e->first_name) {
        if (strmap_get(&e->seen_names, name)) {
            e->first_name = strdup(name);
            strmap_free(&e->seen_names);
        } else if (e->seen_names.count < 100000) {
            strmap_put(&e->seen_names, name, (void *)1);
            return;
        } else {
            return;
        }
    } else if (strcmp(e->first_name, name)) {
        return;
    }
    e->step++;
    if (!TL_ON(e)) return;
    char args[64];
    snprintf(args, sizeof args, "\"step\": %lld", (long long)e->step);
    hvdl__tl_instant(e, TL_CYCLES, "STEP", hvdl_now(), args);
}

int hvdl__tl_mark_cycles(engine_t *e) { return TL_ON(e) && atomic_load(&e->tl_mark_cycles); }
