/*
 * The engine's side of the algorithms' context (context.h): filling it at start-up, and
 * the few calls through which an algorithm reaches back into the engine (failure, trace).
 */
#include "fail.h"
#include "liveness.h"
#include "net.h"
#include <stdio.h>

void hvdl__ctx_fill(engine_t *e) {
    e->ctx.rank = e->rank;
    e->ctx.size = e->size;
    e->ctx.node = e->node;
    e->ctx.nnodes = e->nnodes;
    e->ctx.tcp = e->tcp;
    e->ctx.chunk_bytes = e->cfg.chunk_bytes;
    e->ctx.shm = e->shm;
    e->ctx.spin_us = e->shm_spin_us;
    e->ctx.cross = e->cross;
    e->ctx.tl_on = &e->tl_on;
    e->ctx.inject_site = e->cfg.inject_site;
    e->ctx.engine = e;
}

int hvdl__ctx_oom(ctx_t *c, const char *what, int64_t bytes) {
    return hvdl__oom(c->engine, what, bytes);
}

int hvdl__ctx_inject_fire(ctx_t *c) { return hvdl__inject_fire(c->engine); }

void hvdl__ctx_span(ctx_t *c, const char *name, double t0, double t1, int64_t bytes) {
    char args[64];
    snprintf(args, sizeof args, "\"bytes\": %lld", (long long)bytes);
    hvdl__tl_span(c->engine, TL_ALGORITHM, name, t0, t1, args);
}

int hvdl__ctx_watch(ctx_t *c) {
    engine_t *e = c->engine;
    return hvdl__watch_control(e, 0) || hvdl__liveness_check(e, hvdl_now()) || e->failed ? -1 : 0;
}
