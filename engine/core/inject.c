/*
 * Failure injection, for testing only. HOROVODLIKE_TEST_INJECT=site[:rank[:nth]] makes
 * the nth visit (default the first) of `rank` (default every rank) to the named site
 * fail there, through the same path the real failure would take: the site records its
 * own cause, and the tests check that every rank of the job reports that cause and that
 * the job ends. Messages of an injected failure say it was injected.
 *
 * Sites (each is one line at the place that can really fail):
 *   ring_alloc    the ring's staging buffer (allreduce_ring.c)
 *   rd_alloc      recursive doubling's scratch buffer (allreduce_rd.c)
 *   shm_attach    attaching the node's shared-memory segment at start-up (shm.c)
 *   tcp_send      a data send to a peer (tcp.c)
 *   ctrl_send     a control frame to a peer (net.c)
 *   fusion_alloc  the fusion buffer (exec.c)
 *   output_alloc  an allgather or alltoall result (exec.c)
 *   plan_alloc    rank 0 planning responses (coordinator.c)
 *   scatter_alloc the ring reducescatter's staging copy of the input (exec.c)
 *   decode_alloc  decoding a control frame: rank 0 a request list, a worker a response
 *                 list (wire.c); reported as this rank's out of memory, never as the
 *                 sender's malformed frame
 *   frame_alloc   the copy of a received control frame (net.c)
 *   exec_alloc    the table of a response's tensors, as it is executed (exec.c)
 *   cache_alloc   a new response-cache entry, on rank 0 and on the workers (cache.c)
 * The tests take this list from the engine (hvdl_inject_site) and cause each site:
 * tests/test_engine_inject.py across processes, tests/c in one.
 *
 * The engine's other allocations, and why they have no site of their own:
 *   - a site above stands for them: they sit on its path and fail through the same
 *     hvdl__oom (the rest of cache_store; the alltoall splits and a joined rank's zeros
 *     beside exec_alloc; the receive buffer beside frame_alloc; wire.c's other decoding
 *     allocations beside decode_alloc, all marked with rd_oom);
 *   - start-up, once, each failing hvdl_start with its own message (api.c, handshake.c,
 *     shm.c, coordinator and deadlock state, p2p_start, the negotiators' open);
 *   - a caller's thread, refused at once with HVDL_ERR_SYSTEM "out of memory" (ops.c,
 *     process_sets.c, point-to-point enqueue), or a point-to-point message completed
 *     with its own "out of memory" (p2p.c), or tracing, which warns and goes on;
 *   - not yet: negotiation's own (announce.c, coordinator.c, negotiate_shm.c,
 *     negotiate_nodes.c, loop.c's response frames), the wait reports (deadlock.c) and
 *     the hierarchical allgather's and shm share buffers; each reports hvdl__oom.
 *
 * Cost when unset: one comparison per site visit (HVDL_INJECT).
 */
#include "engine.h"
#include <stdlib.h>
#include <string.h>

static const char *const SITES[] = {
    [INJ_NONE] = "",
    [INJ_RING_ALLOC] = "ring_alloc",
    [INJ_RD_ALLOC] = "rd_alloc",
    [INJ_SHM_ATTACH] = "shm_attach",
    [INJ_TCP_SEND] = "tcp_send",
    [INJ_CTRL_SEND] = "ctrl_send",
    [INJ_FUSION_ALLOC] = "fusion_alloc",
    [INJ_OUTPUT_ALLOC] = "output_alloc",
    [INJ_PLAN_ALLOC] = "plan_alloc",
    [INJ_SCATTER_ALLOC] = "scatter_alloc",
    [INJ_DECODE_ALLOC] = "decode_alloc",
    [INJ_FRAME_ALLOC] = "frame_alloc",
    [INJ_EXEC_ALLOC] = "exec_alloc",
    [INJ_CACHE_ALLOC] = "cache_alloc",
};
_Static_assert(sizeof SITES / sizeof SITES[0] == INJ_NSITES, "an injection site without a name");

const char *hvdl__inject_site_name(int site) {
    return site > INJ_NONE && site < INJ_NSITES && SITES[site] ? SITES[site] : "";
}

/* The public list, so that the tests cover every site the engine has. */
const char *hvdl_inject_site(int i) {
    return i >= 1 && i < INJ_NSITES ? hvdl__inject_site_name(i) : NULL;
}

int hvdl__inject_parse(const char *spec, config_t *c) {
    c->inject_site = INJ_NONE;
    c->inject_rank = -1;
    c->inject_nth = 1;
    size_t len = strcspn(spec, ":");
    int site = INJ_NONE;
    for (int i = INJ_NONE + 1; i < INJ_NSITES; i++)
        if (SITES[i] && strlen(SITES[i]) == len && !strncmp(spec, SITES[i], len)) site = i;
    if (site == INJ_NONE) return -1;
    const char *p = spec + len;
    char *end;
    int rank = -1, nth = 1;
    if (*p == ':') {
        rank = (int)strtol(p + 1, &end, 10);
        if (end == p + 1 || rank < 0) return -1;
        p = end;
    }
    if (*p == ':') {
        nth = (int)strtol(p + 1, &end, 10);
        if (end == p + 1 || nth < 1) return -1;
        p = end;
    }
    if (*p) return -1;
    c->inject_site = site;
    c->inject_rank = rank;
    c->inject_nth = nth;
    return 0;
}

/* Called when a site matches the configured one: whether this visit fails. */
int hvdl__inject_fire(engine_t *e) {
    if (e->cfg.inject_rank >= 0 && e->cfg.inject_rank != e->rank) return 0;
    if (++e->inject_seen != e->cfg.inject_nth) return 0;
    e->injected = 1;
    return 1;
}
