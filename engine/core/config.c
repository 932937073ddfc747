#include "config.h"
#include "log.h"
#include "horovodlike.h"
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <strings.h>

static double env_num(const char *name, double dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    double d = strtod(v, &end);
    if (*end) {
        hvdl__log(NULL, HVDL_LOG_WARNING, "ignoring %s=%s: not a number", name, v);
        return dflt;
    }
    return d;
}

static int env_flag(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") && strcasecmp(v, "false");
}

/* A flag set to false on purpose ("0" or "false"), as against one left unset. */
static int env_off(const char *name) {
    const char *v = getenv(name);
    return v && (!strcmp(v, "0") || !strcasecmp(v, "false"));
}

static int parse_level(const char *v) {
    static const char *names[] = {"TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"};
    for (int i = 0; i < 6; i++)
        if (v && !strcasecmp(v, names[i])) return i;
    return HVDL_LOG_WARNING;
}

void hvdl__config_read(config_t *c) {
    c->log_level = parse_level(getenv("HOROVOD_LOG_LEVEL"));
    hvdl__log_set_level(c->log_level);
    c->fusion_threshold = (int64_t)env_num("HOROVOD_FUSION_THRESHOLD", 128.0 * 1024 * 1024);
    c->cycle_time = env_num("HOROVOD_CYCLE_TIME", 1.0) / 1000.0;
    c->cache_capacity = (int)env_num("HOROVOD_CACHE_CAPACITY", 1024);
    c->stall_check = !env_flag("HOROVOD_STALL_CHECK_DISABLE");
    c->stall_warning = env_num("HOROVOD_STALL_CHECK_TIME_SECONDS", 60);
    c->stall_shutdown = env_num("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", 0);
    c->peer_timeout = env_num("HOROVODLIKE_PEER_TIMEOUT_SECONDS", 30);
    c->elastic = getenv("HOROVODLIKE_ELASTIC_WORKER") != NULL;
    c->chunk_bytes = (int64_t)env_num("HOROVODLIKE_CHUNK_BYTES", 256 * 1024);
    c->socket_buffer = (int64_t)env_num("HOROVODLIKE_SOCKET_BUFFER_BYTES", 4 << 20);
    c->shm = env_num("HOROVODLIKE_SHM", 1) != 0;
    c->shm_negotiate = env_num("HOROVODLIKE_SHM_NEGOTIATE", 1) != 0;
    c->spin_us = (int)env_num("HOROVODLIKE_SPIN_US", 50);
    c->small_bytes = (int64_t)env_num("HOROVODLIKE_SMALL_BYTES", 64 * 1024);
    c->p2p_eager_bytes = (int64_t)env_num("HOROVODLIKE_P2P_EAGER_BYTES", 64 * 1024);
    c->p2p_mailbox = env_num("HOROVODLIKE_P2P_MAILBOX", c->shm) != 0;
    c->p2p_cma = env_num("HOROVODLIKE_P2P_CMA", 1) != 0;
    c->p2p_ring_bytes = (int64_t)env_num("HOROVODLIKE_P2P_SHM_RING_BYTES", 4 << 20);
    c->p2p_unexpected_bytes = (int64_t)env_num("HOROVODLIKE_P2P_UNEXPECTED_BYTES", 4 << 20);
    c->p2p_announced_bytes = (int64_t)env_num("HOROVODLIKE_P2P_ANNOUNCED_BYTES", 64 << 20);
    /* the values of the algorithm knobs: the ALG_* up to ALG_HIER (config.h) */
    static const char *const ALGS[] = {[ALG_AUTO] = "auto",
                                       [ALG_SHM] = "shm",
                                       [ALG_RING] = "ring",
                                       [ALG_RD] = "rd",
                                       [ALG_HIER] = "hier"};
    _Static_assert(sizeof ALGS / sizeof ALGS[0] == ALG_HIER + 1,
                   "an algorithm knob value without a name");
    const char *alg = getenv("HOROVODLIKE_ALLREDUCE_ALGORITHM");
    c->algorithm = env_flag("HOROVOD_HIERARCHICAL_ALLREDUCE") ? ALG_HIER : ALG_AUTO;
    for (int i = 0; alg && *alg && i <= ALG_HIER; i++)
        if (!strcasecmp(alg, ALGS[i])) c->algorithm = i;
    /* Hierarchical is our default across nodes (Horovod's is flat), so a Horovod job that
     * says HOROVOD_HIERARCHICAL_ALLREDUCE=0 (horovodrun --no-hierarchical-allreduce)
     * gets what it asked for: auto, less the hierarchical path. Our own knob wins. */
    c->flat_allreduce = env_off("HOROVOD_HIERARCHICAL_ALLREDUCE") && !(alg && *alg);
    const char *ag = getenv("HOROVODLIKE_ALLGATHER_ALGORITHM");
    c->allgather_algorithm = env_flag("HOROVOD_HIERARCHICAL_ALLGATHER") ? ALG_HIER : ALG_AUTO;
    for (int i = 0; ag && *ag && i < 5; i++)
        if (!strcasecmp(ag, ALGS[i])) c->allgather_algorithm = i;
    c->flat_allgather = env_off("HOROVOD_HIERARCHICAL_ALLGATHER") && !(ag && *ag);
    c->shm_chunk_bytes = (int64_t)env_num("HOROVODLIKE_SHM_CHUNK_BYTES", 256 * 1024);
    c->shm_chunk_bytes = c->shm_chunk_bytes < 4096 ? 4096 : c->shm_chunk_bytes & ~(int64_t)63;
    const char *tl = getenv("HOROVOD_TIMELINE");
    snprintf(c->timeline, sizeof c->timeline, "%s", tl && strcmp(tl, "DYNAMIC") ? tl : "");
    c->timeline_mark_cycles = env_flag("HOROVOD_TIMELINE_MARK_CYCLES");
    c->timeline_max_bytes = (int64_t)(env_num("HOROVOD_TIMELINE_MAX_MB", 1024) * 1024 * 1024);
    c->timeline_start_step = (int64_t)env_num("HOROVOD_TIMELINE_START_STEP", 0);
    c->timeline_stop_step = (int64_t)env_num("HOROVOD_TIMELINE_STOP_STEP", -1);
    c->start_timeout = env_num("HOROVODLIKE_START_TIMEOUT", 60);
    if (!(c->start_timeout > 0)) c->start_timeout = 60;     /* also refuses NaN */
    if (c->start_timeout > 86400) c->start_timeout = 86400;
    const char *inject = getenv("HOROVODLIKE_TEST_INJECT");
    if (inject && *inject && hvdl__inject_parse(inject, c))
        hvdl__log(NULL, HVDL_LOG_ERROR,
                  "HOROVODLIKE_TEST_INJECT=%s is not site[:rank[:nth]] with a known "
                  "site; no failure will be injected",
                  inject);
    else if (inject && *inject)
        hvdl__log(NULL, HVDL_LOG_WARNING,
                  "HOROVODLIKE_TEST_INJECT=%s: this job will fail on purpose "
                  "(for testing only)",
                  inject);
    if (c->fusion_threshold < 0) c->fusion_threshold = 0;
    if (c->cycle_time < 0) c->cycle_time = 0;
    if (c->cache_capacity < 0) c->cache_capacity = 0;
    /* Chunks must hold whole elements of every dtype: round to 64 bytes. */
    c->chunk_bytes = c->chunk_bytes < 4096 ? 4096 : c->chunk_bytes & ~(int64_t)63;
}

void hvdl__config_log(const struct engine *e, const config_t *c, int rank) {
    hvdl__log(e, HVDL_LOG_INFO,
              "rank %d config: fusion_threshold=%lld cycle_time_ms=%.3f cache_capacity=%d "
              "stall_check=%d stall_warning_s=%.0f stall_shutdown_s=%.0f peer_timeout_s=%.0f "
              "chunk_bytes=%lld shm=%d shm_chunk_bytes=%lld",
              rank, (long long)c->fusion_threshold, c->cycle_time * 1e3, c->cache_capacity,
              c->stall_check, c->stall_warning, c->stall_shutdown, c->peer_timeout,
              (long long)c->chunk_bytes, c->shm, (long long)c->shm_chunk_bytes);
}

/* The autotuner's knobs. Fusion and the cycle need no agreement (rank 0, or the rank
 * that completes a segment's round, fuses, and the response says what it fused); the
 * algorithms do, which is why they change only as a tune op runs (exec.c), between the
 * same two ops on every rank. A value is an integer code or a size; NaN is refused. */
#define TUNE_MAX_FUSION (1ll << 40)
#define TUNE_MAX_CYCLE_MS 10000.0
static int tune_alg_ok(double a, int allgather) {
    return a == ALG_AUTO || a == ALG_RING || a == ALG_HIER || (!allgather && a == ALG_RD);
}

const char *hvdl__tune_problem(const double *v) {
    for (int i = 0; i < HVDL_TUNE_VALUES; i++)
        if (v[i] != v[i]) return "a value is NaN";
    if (v[HVDL_TUNE_FUSION_BYTES] > (double)TUNE_MAX_FUSION)
        return "the fusion threshold is over 1 TiB";
    if (v[HVDL_TUNE_CYCLE_MS] > TUNE_MAX_CYCLE_MS) return "the cycle time is over 10 s";
    if (v[HVDL_TUNE_ALLREDUCE] >= 0 && !tune_alg_ok(v[HVDL_TUNE_ALLREDUCE], 0))
        return "the allreduce algorithm is not 0 (auto), 2 (ring), 3 (rd) or 4 (hier)";
    if (v[HVDL_TUNE_ALLGATHER] >= 0 && !tune_alg_ok(v[HVDL_TUNE_ALLGATHER], 1))
        return "the allgather algorithm is not 0 (auto), 2 (ring) or 4 (hier)";
    return NULL;
}

void hvdl__config_tune(config_t *c, const double *v) {
    if (hvdl__tune_problem(v)) return;       /* checked at the root's enqueue */
    if (v[HVDL_TUNE_FUSION_BYTES] >= 0) c->fusion_threshold = (int64_t)v[HVDL_TUNE_FUSION_BYTES];
    if (v[HVDL_TUNE_CYCLE_MS] >= 0) c->cycle_time = v[HVDL_TUNE_CYCLE_MS] / 1000.0;
    if (v[HVDL_TUNE_ALLREDUCE] >= 0) {
        c->algorithm = (int)v[HVDL_TUNE_ALLREDUCE];
        c->flat_allreduce = c->algorithm != ALG_AUTO && c->algorithm != ALG_HIER;
    }
    if (v[HVDL_TUNE_ALLGATHER] >= 0) {
        c->allgather_algorithm = (int)v[HVDL_TUNE_ALLGATHER];
        c->flat_allgather = c->allgather_algorithm == ALG_RING;
    }
}

void hvdl__config_agreed(const config_t *c, agreed_t *out) {
    *out = (agreed_t){c->shm,
                      c->algorithm,
                      c->allgather_algorithm,
                      c->shm_negotiate,
                      c->flat_allreduce,
                      c->flat_allgather,
                      c->small_bytes,
                      c->shm_chunk_bytes,
                      c->p2p_eager_bytes,
                      c->p2p_unexpected_bytes,
                      c->p2p_announced_bytes};
}

int hvdl__config_disagree(const agreed_t *a, const agreed_t *b, char *msg, size_t cap) {
    const char *names[] = {"HOROVODLIKE_SHM",
                           "HOROVODLIKE_ALLREDUCE_ALGORITHM (or HOROVOD_HIERARCHICAL_ALLREDUCE)",
                           "HOROVODLIKE_ALLGATHER_ALGORITHM (or HOROVOD_HIERARCHICAL_ALLGATHER)",
                           "HOROVODLIKE_SMALL_BYTES",
                           "HOROVODLIKE_SHM_CHUNK_BYTES",
                           "HOROVODLIKE_SHM_NEGOTIATE",
                           "HOROVOD_HIERARCHICAL_ALLREDUCE=0",
                           "HOROVOD_HIERARCHICAL_ALLGATHER=0",
                           "HOROVODLIKE_P2P_EAGER_BYTES",
                           "HOROVODLIKE_P2P_UNEXPECTED_BYTES",
                           "HOROVODLIKE_P2P_ANNOUNCED_BYTES"};
    int64_t va[] = {a->shm,
                    a->algorithm,
                    a->allgather_algorithm,
                    a->small_bytes,
                    a->shm_chunk_bytes,
                    a->shm_negotiate,
                    a->flat_allreduce,
                    a->flat_allgather,
                    a->p2p_eager_bytes,
                    a->p2p_unexpected_bytes,
                    a->p2p_announced_bytes};
    int64_t vb[] = {b->shm,
                    b->algorithm,
                    b->allgather_algorithm,
                    b->small_bytes,
                    b->shm_chunk_bytes,
                    b->shm_negotiate,
                    b->flat_allreduce,
                    b->flat_allgather,
                    b->p2p_eager_bytes,
                    b->p2p_unexpected_bytes,
                    b->p2p_announced_bytes};
    _Static_assert(sizeof names / sizeof names[0] == sizeof va / sizeof va[0], "a setting unnamed");
    for (int i = 0; i < (int)(sizeof va / sizeof va[0]); i++) {
        if (va[i] == vb[i]) continue;
        snprintf(msg, cap, "%s (%lld here, %lld there)", names[i], (long long)va[i],
                 (long long)vb[i]);
        return 1;
    }
    return 0;
}
