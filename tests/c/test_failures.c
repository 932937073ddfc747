/*
 * The failure paths, each caused for real in engines on threads (harness.c): every
 * injection site the engine lists (out of memory and failed sends), a peer that dies in
 * the middle of a frame, and hostile bytes on a control connection. Every rank must
 * report the true cause, naming the rank it belongs to, within half the peer timeout
 * (the cause travels at once; a rank that waited the timeout out missed it). Also: the
 * name tables are whole, and no error is ever reported without a message.
 */
#include "harness.h"
#include "net.h"            /* the frame header, to write a hostile frame by hand */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Larger than one ring staging chunk of the small_pieces settings. */
#define BIG 8195

/* Every name table has an entry for every value of its enum (their sizes are checked at
 * compile time; this finds a value skipped in the middle), and no error, whatever its
 * site, reaches the user without a message. */
static void test_name_tables(void) {
    int before = atomic_load(&g_failures);
    for (int s = 0; s < HVDL_NUM_STATUSES; s++)
        CHECK(strcmp(hvdl_status_name(s), "UNKNOWN"), "status %d has no name", s);
    for (int i = 1; i < INJ_NSITES; i++)
        CHECK(hvdl_inject_site(i) && *hvdl_inject_site(i), "injection site %d has no name", i);
    CHECK(!hvdl_inject_site(INJ_NSITES), "a site past the last one has a name");
    for (int a = ALG_SHM; a < ALG_COUNT; a++)
        CHECK(strcmp(hvdl__alg_name(a), "?"), "algorithm %d has no name", a);
    hvdl__err(HVDL_ERR_SYSTEM, "%s", "");
    CHECK(*hvdl_last_error(), "an error was reported with an empty message");
    engine_t *e = hvdl__engine_new();
    CHECK(e && hvdl__record_failure(e, HVDL_ERR_PEER_LOST, "") && *e->fail_msg,
          "a failure was recorded with an empty cause");
    hvdl__engine_free(e);
    printf("%-40s %s\n", "name tables, empty messages",
           atomic_load(&g_failures) > before ? "FAILED" : "ok");
}

/* What each rank of a failure-path world does, and what it saw. */
/* REPEATED: one name six times (cached after the first: agreed in the segment); STALLED:
 * a cached name that rank 1 stays away from (rank 0's stall scan takes its word over);
 * CHANGED: rank 1's second request of a cached name has another shape (it reaches rank 0
 * as a frame, and rank 0 takes the word over). */
enum {
    DO_NOTHING,
    DO_SMALL_ALLREDUCE,
    DO_BIG_ALLREDUCE,
    DO_FUSED,
    DO_ALLGATHER,
    DO_REDUCESCATTER,
    DO_REPEATED,
    DO_STALLED,
    DO_CHANGED
};
typedef struct outcome {
    int what;
    int status[16];
    char msg[16][HVDL_MSG_BYTES];
} outcome_t;

/* Until it fails (each op at most once, but fusion takes a few rounds to happen). */
static void do_ops(world_t *w, int rank, void *arg) {
    outcome_t *out = arg;
    engine_t *e = w->e[rank];
    float in[4][BIG], res_buf[4][BIG];
    memset(in, 0, sizeof in);
    int rc = 0, rounds = out->what == DO_FUSED                                ? 40
                         : out->what == DO_REPEATED                           ? 6
                         : out->what == DO_STALLED || out->what == DO_CHANGED ? 2
                                                                              : 1;
    char *msg = out->msg[rank];
    for (int k = 0; k < rounds && !rc; k++) {
        char name[4][32];
        for (int t = 0; t < 4; t++) snprintf(name[t], sizeof name[t], "fail.%d.%d", k, t);
        hvdl_request q = make_request(HVDL_OP_ALLREDUCE, HVDL_FLOAT32, 0, name[0], 1, 1, 0);
        q.input = in[0];
        q.output = res_buf[0];
        hvdl_result res = {0};
        switch (out->what) {
        case DO_NOTHING: return;
        case DO_BIG_ALLREDUCE: q.shape[0] = BIG; /* fall through */
        case DO_SMALL_ALLREDUCE: rc = run_op(e, &q, NULL, msg); break;
        case DO_REPEATED:
        case DO_STALLED:
        case DO_CHANGED:
            q.name = k && rank == 1 && out->what == DO_STALLED ? "elsewhere" : "again";
            q.shape[0] = k && rank == 1 && out->what == DO_CHANGED ? 17 : 16;
            rc = run_op(e, &q, NULL, msg);
            break;
        case DO_ALLGATHER:
            q.op = HVDL_OP_ALLGATHER;
            q.output = NULL;
            rc = run_op(e, &q, &res, msg);
            hvdl_free(res.data);
            break;
        case DO_REDUCESCATTER:
            q.op = HVDL_OP_REDUCESCATTER;
            q.shape[0] = 2 * w->size;
            rc = run_op(e, &q, NULL, msg);
            break;
        case DO_FUSED: {      /* several at once, out of place, in separate buffers: fused */
            int64_t h[4];
            int n = 0;
            for (; n < 4; n++) {
                q.name = name[n];
                q.input = in[n];
                q.output = res_buf[n];
                q.shape[0] = 16;
                if ((rc = hvdl__engine_enqueue(e, &q, &h[n]))) {
                    snprintf(msg, HVDL_MSG_BYTES, "%s", hvdl_last_error());
                    break;
                }
            }
            for (int t = 0; t < n; t++) {    /* each is released, failed or not */
                char m[HVDL_MSG_BYTES];
                int r = hvdl__engine_wait(e, h[t], 30);
                if (r) snprintf(m, sizeof m, "hung: no result within 30 s");
                else r = hvdl__engine_release(e, h[t], m, NULL);
                if (r && !rc) {
                    rc = r;
                    snprintf(msg, HVDL_MSG_BYTES, "%s", m);
                }
            }
            break;
        }
        }
    }
    out->status[rank] = rc;
}

/* A failure injected at one site of one rank: where it is visited, and its own words. */
typedef struct inject_case {
    const char *site;
    int victim;
    void (*tweak)(config_t *);
    int what;
    const char *reason;
    const char *const *hosts;    /* NULL: one node, "localhost" */
    int nth;                     /* the visit that fails; 0: the first */
} inject_case_t;

static void slow_cycle(config_t *c) {
    no_shm(c);
    c->cycle_time = 0.02;
}
static void stall_soon(config_t *c) {
    small_pieces(c);
    c->stall_warning = 1;
}
/* Two nodes of two ranks each (the hierarchical algorithms need both to have two). */
static const char *const TWO_NODES[] = {"node-a", "node-a", "node-b", "node-b"};

static const inject_case_t INJECT_CASES[] = {
    {"ring_alloc", 1, no_shm, DO_BIG_ALLREDUCE, "ring staging buffer"},
    {"rd_alloc", 2, no_shm, DO_SMALL_ALLREDUCE, "recursive-doubling scratch buffer"},
    {"shm_attach", 1, small_pieces, DO_NOTHING, "could not set up the shared-memory segment"},
    {"tcp_send", 1, no_shm, DO_BIG_ALLREDUCE, "sending data to rank"},
    {"ctrl_send", 2, small_pieces, DO_SMALL_ALLREDUCE, "sending a control frame to rank 0 failed"},
    {"fusion_alloc", 0, slow_cycle, DO_FUSED, "fusion buffer"},
    {"output_alloc", 2, small_pieces, DO_ALLGATHER, "-byte allgather result"},
    {"plan_alloc", 0, small_pieces, DO_SMALL_ALLREDUCE, "-byte response plan"},
    {"scatter_alloc", 1, no_shm, DO_REDUCESCATTER, "-byte reducescatter buffer"},
    {"decode_alloc", 0, no_shm, DO_SMALL_ALLREDUCE, "-byte request list"},
    {"decode_alloc", 1, no_shm, DO_SMALL_ALLREDUCE, "-byte response list"},
    {"frame_alloc", 2, small_pieces, DO_SMALL_ALLREDUCE, "-byte control frame"},
    {"exec_alloc", 1, small_pieces, DO_SMALL_ALLREDUCE, "-byte table of a response's tensors"},
    {"cache_alloc", 1, no_shm, DO_SMALL_ALLREDUCE, "-byte response-cache entry"},
    {"cache_alloc", 0, no_shm, DO_SMALL_ALLREDUCE, "-byte response-cache entry"},
    {"announce_alloc", 1, small_pieces, DO_SMALL_ALLREDUCE, "-byte request bit vector"},
    {"record_alloc", 0, small_pieces, DO_SMALL_ALLREDUCE, "-byte request record"},
    {"response_alloc", 0, no_shm, DO_SMALL_ALLREDUCE, "-byte response"},
    {"response_alloc", 1, small_pieces, DO_REPEATED, "-byte response"},
    {"plan_frame_alloc", 0, no_shm, DO_SMALL_ALLREDUCE, "-byte table of response frames"},
    {"took_alloc", 0, stall_soon, DO_STALLED, "-byte requests taken over from the segment"},
    {"log_alloc", 1, small_pieces, DO_REPEATED, "-byte response queue"},
    {"nodes_alloc", 0, small_pieces, DO_CHANGED, "-byte record of the nodes' closed words",
     TWO_NODES},
    {"deadlock_alloc", 2, small_pieces, DO_SMALL_ALLREDUCE, "-byte deadlock state"},
    {"hier_alloc", 0, small_pieces, DO_ALLGATHER, "-byte hierarchical allgather buffer", TWO_NODES},
    {"hier_alloc", 1, small_pieces, DO_BIG_ALLREDUCE, "-byte hierarchical share buffer", TWO_NODES},
    {"wait_alloc", 0, small_pieces, DO_STALLED, "-byte wait report"},
    {"start_alloc", 1, small_pieces, DO_NOTHING, "-byte table of the job's nodes"},
    {"start_alloc", 2, small_pieces, DO_NOTHING, "-byte point-to-point state", NULL, 2},
};

/* Every site the engine lists, in-process: each rank reports the victim's cause (3 ranks on
 * one node, or 2 x 2 on two). */
static void test_injected_failures(void) {
    const int ncases = (int)(sizeof INJECT_CASES / sizeof INJECT_CASES[0]);
    int before = atomic_load(&g_failures);
    double start = hvdl_now();
    for (int site = 1; hvdl_inject_site(site); site++) {
        const char *name = hvdl_inject_site(site);
        int found = 0;
        for (int k = 0; k < ncases; k++) {
            const inject_case_t *c = &INJECT_CASES[k];
            if (strcmp(c->site, name)) continue;
            found = 1;
            double t0 = hvdl_now();
            char spec[64], label[80], want[160], injected[96];
            snprintf(spec, sizeof spec, "%s:%d:%d", c->site, c->victim, c->nth ? c->nth : 1);
            snprintf(label, sizeof label, "injected %s", spec);
            const int N = c->hosts ? 4 : 3;
            world_opts_t o = {c->hosts, c->tweak, label, spec, 1};
            world_t *w = world_start(N, &o);
            outcome_t *out = calloc(1, sizeof *out);
            if (!out) {
                fprintf(stderr, "out of memory\n");
                exit(2);
            }
            out->what = c->what;
            if (w->started) world_run(w, do_ops, out);
            /* A rank whose start finished before another's failed (the point-to-point
             * state is start-up's last step) learns the cause at its next op. */
            for (int r = 0; !w->started && r < N; r++) {
                if (w->start_msg[r][0]) continue;
                float x = 1;
                hvdl_request q = make_request(HVDL_OP_ALLREDUCE, HVDL_FLOAT32, 0, "after start", 1,
                                              1, 0);
                q.input = q.output = &x;
                CHECK(run_op(w->e[r], &q, NULL, w->start_msg[r]) != HVDL_OK, "%s: rank %d's op ran",
                      label, r);
            }
            snprintf(want, sizeof want, "rank %d (host %s) failed: ", c->victim,
                     c->hosts ? c->hosts[c->victim] : "localhost");
            snprintf(injected, sizeof injected, "(injected by HOROVODLIKE_TEST_INJECT=%s)",
                     c->site);
            for (int r = 0; r < N; r++) {
                const char *msg = w->started ? out->msg[r] : w->start_msg[r];
                CHECK(w->started ? out->status[r] != HVDL_OK : w->start_msg[r][0] != 0,
                      "%s: rank %d did not fail", label, r);
                CHECK(strstr(msg, want) && strstr(msg, c->reason) && strstr(msg, injected),
                      "%s: rank %d reports '%s', want '%s...%s...%s'", label, r, msg, want,
                      c->reason, injected);
            }
            /* The cause travels at once; a rank that waited out the peer timeout missed it. */
            double took = hvdl_now() - t0, bound = w->e[0]->cfg.peer_timeout / 2;
            CHECK(took < bound, "%s: took %.1f s, more than half the peer timeout", label, took);
            free(out);
            world_stop(w);
        }
        CHECK(found, "injection site %s has no case in tests/c (INJECT_CASES)", name);
    }
    printf("%-40s %6.2f s %s\n", "every injection site, in-process", hvdl_now() - start,
           atomic_load(&g_failures) > before ? "FAILED" : "ok");
    fflush(stdout);
}

/* A peer that breaks: rank 2 of 3 dies halfway through sending a frame (its sockets
 * close after half of one), or sends hostile bytes in a well-framed control frame. Its
 * engine is held still meanwhile (its drive lock), so that nothing of its own is sent
 * between the bytes written here. The others must fail naming it, and not hang. */
enum { HOSTILE_DIES_MID_FRAME, HOSTILE_BAD_FRAME };
enum { HOSTILE_VICTIM = 2 };

static void hostile_body(world_t *w, int rank, void *arg) {
    outcome_t *out = arg;
    engine_t *e = w->e[rank];
    char name[32];
    snprintf(name, sizeof name, "before");
    hvdl_request q = make_request(HVDL_OP_BARRIER, HVDL_UINT8, 0, name, 0, 0, 0);
    CHECK(!run_op(e, &q, NULL, out->msg[rank]), "%s: barrier: %s", w->label, out->msg[rank]);
    if (rank != HOSTILE_VICTIM) {
        float x = 1;
        q = make_request(HVDL_OP_ALLREDUCE, HVDL_FLOAT32, 0, "after", 1, 1, 0);
        q.input = q.output = &x;
        out->status[rank] = run_op(e, &q, NULL, out->msg[rank]);
        return;
    }
    /* A request list: its header, then a word count far larger than the frame holds. */
    struct {
        frame_hdr_t h;
        uint32_t nwords, pad;
    } f = {{WIRE_MAGIC, MSG_REQUESTS, 8}, 0xffffffffu, 0};
    int fd = e->peers[0].ctrl.fd;
    pthread_mutex_lock(&e->drive);
    if (out->what == HOSTILE_DIES_MID_FRAME) {
        f.h.len = 64;        /* announces 64 bytes; 4 come, then the connection closes */
        CHECK(write(fd, &f, sizeof f.h + 4) == (ssize_t)(sizeof f.h + 4), "%s: write failed",
              w->label);
        for (int i = 0; i < w->size; i++) {
            peer_t *p = &e->peers[i];
            if (p->ctrl.fd >= 0) shutdown(p->ctrl.fd, SHUT_RDWR);
            if (p->data_fd >= 0) shutdown(p->data_fd, SHUT_RDWR);
            if (p->p2p_fd >= 0) shutdown(p->p2p_fd, SHUT_RDWR);
        }
    } else {
        CHECK(write(fd, &f, sizeof f) == (ssize_t)sizeof f, "%s: write failed", w->label);
    }
    pthread_mutex_unlock(&e->drive);
}

static void test_hostile_peer(int how) {
    enum { N = 3 };
    const char *label = how == HOSTILE_DIES_MID_FRAME ? "a peer dies mid-frame"
                                                      : "a peer sends a bad frame";
    const char *why = how == HOSTILE_DIES_MID_FRAME
                          ? "its connection closed in the middle of a frame"
                          : "sent a malformed request list (a count larger than the frame holds)";
    int before = atomic_load(&g_failures);
    double t0 = hvdl_now();
    world_opts_t o = {NULL, no_shm, label, NULL, 1};
    world_t *w = world_start(N, &o);
    outcome_t *out = calloc(1, sizeof *out);
    if (!out) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    out->what = how;
    world_run(w, hostile_body, out);
    char want[64];
    snprintf(want, sizeof want, "rank %d (host localhost) was lost: ", HOSTILE_VICTIM);
    double took = hvdl_now() - t0, bound = w->e[0]->cfg.peer_timeout / 2;
    CHECK(took < bound, "%s: took %.1f s, more than half the peer timeout", label, took);
    for (int r = 0; r < N; r++) {
        if (r == HOSTILE_VICTIM) continue;
        const char *msg = out->msg[r];
        CHECK(out->status[r] == HVDL_ERR_PEER_LOST && strstr(msg, want) && strstr(msg, why),
              "%s: rank %d reports status %d '%s', want '%s%s'", label, r, out->status[r], msg,
              want, why);
    }
    free(out);
    world_stop(w);
    printf("%-40s %6.2f s %s\n", label, hvdl_now() - t0,
           atomic_load(&g_failures) > before ? "FAILED" : "ok");
    fflush(stdout);
}

void run_failure_tests(void) {
    test_name_tables();
    test_injected_failures();
    test_hostile_peer(HOSTILE_DIES_MID_FRAME);
    test_hostile_peer(HOSTILE_BAD_FRAME);
}
