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
 *   announce_alloc  a rank's announcement: its bit vector and completed ids (announce.c)
 *   record_alloc  rank 0's record of a request: name, metadata, alltoall splits, and the
 *                 text of a disagreement (coordinator.c)
 *   response_alloc  a response's tables: rank 0 planning one (coordinator.c), a rank
 *                 turning the segment's log entry into one (exec.c)
 *   plan_frame_alloc  rank 0's table of response frames for the workers (loop.c)
 *   took_alloc    the bits rank 0 takes over from a segment's words (negotiate.c)
 *   log_alloc     the one-node log's deferred entries and response queue (negotiate_shm.c)
 *   nodes_alloc   rank 0's record of the nodes whose word it closed (negotiate_nodes.c)
 *   deadlock_alloc  the deadlock check's state, at its first tick (deadlock.c)
 *   hier_alloc    the hierarchical algorithms' buffers: allgather's (allgather_hier.c)
 *                 and allreduce's share buffer (collectives_shm.c)
 *   start_alloc   start-up, once connected: the table of the ranks' nodes (api.c), then
 *                 (its second visit) the point-to-point state (p2p_thread.c); the cause reaches
 *                 every rank, and every hvdl_start fails with it
 *   wait_alloc    rank 0 reading a worker's wait report, once a caller has been blocked
 *                 BLOCKED_S (deadlock.c)
 * The tests take this list from the engine (hvdl_inject_site) and cause each site:
 * tests/test_engine_inject.py across processes, tests/c in one.
 *
 * AUDIT: the allocations with no site of their own, by function, and why.
 * tests/test_engine_inject.py (test_every_allocation_has_a_site_or_a_reason) finds every
 * malloc/calloc/realloc/strdup in engine/ and requires a site within 12 lines in its
 * function, or its function here (`file: functions: why`), and no stale entry.
 *   control/cache.c: cache_store hvdl__cache_apply: the rest of a cache entry (its dim0s, a cached tensor's name) on cache_alloc's and response_alloc's path, failing through the same hvdl__oom
 *   control/wire.c: hvdl__response_alloc: a helper; every caller is a site (response_alloc; decode_alloc's path, marked rd_oom)
 *   core/callers.c: hvdl__caller_join: a thread's record or its engine's table, a few dozen bytes: without it the engine never counts this rank as blocked (its deadlock detection is off, the stall inspector stays), by design
 *   control/deadlock.c: snapshot: a wait report without memory goes out partial, which proves nothing and fails nothing, by design
 *   control/coordinator.c: hvdl__coordinator_new: start-up, before rank 0 connects: hvdl_start fails at once with engine set-up failed (its errno); the others fail at their start-up timeout
 *   control/segment/negotiate_shm.c: hvdl__negotiate_shm_open: start-up, once connected: hvdl__oom tells every rank, the path start_alloc's case takes
 *   control/segment/negotiate_nodes.c: hvdl__negotiate_nodes_open: start-up, once connected: hvdl__oom tells every rank, the path start_alloc's case takes
 *   core/api.c: hvdl__engine_new hvdl__engine_start: start-up, before this rank connects: hvdl_prepare or hvdl_start fails at once with out of memory (or engine set-up failed: its errno); the other ranks fail at their start-up timeout, as for a rank that never starts
 *   core/api.c: build_nodes: the cross-node group, beside start_alloc's table, failing its start the same way
 *   transport/shm.c: hvdl__shm_open: start-up, once connected, beside shm_attach: hvdl__oom for the segment's record tells every rank
 *   transport/tcp.c: hvdl__tcp_transport: start-up, before this rank connects: hvdl_start fails at once with engine set-up failed (its errno); the others fail at their start-up timeout
 *   transport/handshake.c: accept_expected: start-up, while connecting: this rank fails naming the table of start-up connections; the others fail connecting to it
 *   p2p/p2p_thread.c: p2p_main: the point-to-point thread's poll table, at its start: without it every point-to-point op fails with out of memory for the point-to-point thread
 *   p2p/p2p_thread.c: hvdl__p2p_leave: a rank's goodbye (F_BYE) to one peer as it shuts down, a few hundred bytes: without it that peer learns it only when the job ends and the connection closes, as before goodbyes, by design
 *   core/ops.c: alloc_slot copy_splits hvdl__engine_enqueue: a caller's thread, refused at once with HVDL_ERR_SYSTEM out of memory; nothing was sent
 *   core/process_sets.c: hvdl__engine_set_add: a caller's thread, refused at once with HVDL_ERR_SYSTEM out of memory
 *   p2p/p2p.c: hvdl__p2p_enqueue op_msg: a point-to-point op, refused or completed with its own out of memory
 *   p2p/p2p_match.c: hvdl__p2p_accept_into: a received point-to-point message: the recv fails, or the job, naming the bytes
 *   p2p/p2p_read.c: begin_payload: a received point-to-point message: the recv fails, or the job, naming the bytes
 *   p2p/p2p_mailbox.c: mb_eager: a received point-to-point message: the recv fails, or the job, naming the bytes
 *   p2p/p2p_write.c: hvdl__p2p_queue_ctl: a rendezvous control frame (clear-to-send, acknowledgement, ring answer), a few dozen bytes: the job fails naming out of memory (the peer would wait for the frame)
 *   p2p/p2p_rendezvous.c: hvdl__p2p_held_entry: the record of a cleared recv, a few dozen bytes: the job fails naming out of memory (the peer would wait for the frame)
 *   p2p/p2p_read.c: sender_frame: the mailbox's switch record, a few dozen bytes: without it the pair goes on over its connection, as when the peer refuses the mailbox
 *   p2p/p2p_complete.c: hvdl__p2p_finish hvdl__p2p_finish_bare: a trace line that is skipped, and the op's message copy, where release reports the engine's cause instead
 *   core/fail.c: complete_locked: the op's message copy; without it release reports the engine's cause (ops.c)
 *   core/timeline.c: hvdl__timeline_open hvdl__tl_count_step: tracing, which warns and goes on without the trace
 *   core/exec.c: hvdl__execute_cached: the trace's posting times of a segment log entry, failing through hvdl__oom as response_alloc's site beside it does
 *   util/util.c: buf_reserve grow rd_str strmap_put: helpers; each caller reports hvdl__oom for what it was building
 * END AUDIT
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
    [INJ_ANNOUNCE_ALLOC] = "announce_alloc",
    [INJ_RECORD_ALLOC] = "record_alloc",
    [INJ_RESPONSE_ALLOC] = "response_alloc",
    [INJ_PLAN_FRAME_ALLOC] = "plan_frame_alloc",
    [INJ_TOOK_ALLOC] = "took_alloc",
    [INJ_LOG_ALLOC] = "log_alloc",
    [INJ_NODES_ALLOC] = "nodes_alloc",
    [INJ_DEADLOCK_ALLOC] = "deadlock_alloc",
    [INJ_HIER_ALLOC] = "hier_alloc",
    [INJ_START_ALLOC] = "start_alloc",
    [INJ_WAIT_ALLOC] = "wait_alloc",
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
