/*
 * The background loop: one thread per engine, which does the engine's work (I/O,
 * negotiation, execution) under the engine's `drive` lock, letting go of it only while
 * it waits; on one node a caller waiting for its op may take it meanwhile and do the
 * parts that need no waiting itself (hvdl__drive, below). The loop reads top-down;
 * each step is one call into the file that does that job:
 *
 *   take_incoming      ops enqueued by the API move to the loop's own queue
 *   hvdl__announce     (announce.c) unsent requests go to rank 0, as one frame a cycle
 *   hvdl__say_bye      (shutdown.c) this rank asked to shut down; rank 0 ends the
 *                      job (hvdl__shutdown_due) once every rank has
 *   lead               rank 0: hvdl__coordinator_plan (coordinator.c) turns what is
 *                      ready into responses; the loop sends each worker its share of
 *                      the plan (wire.c encodes) and then executes rank 0's (exec.c)
 *   hvdl__stall_check  (stall.c) rank 0 names ranks that hold others up
 *   negotiation run    (negotiation.h) a one-node job executes the responses of the
 *                      segment's log in order: those agreed there and rank 0's
 *   negotiation scan   a node's leader (several nodes) reports words stuck partly set
 *   liveness           (liveness.c) heartbeats and the check on peers
 *   pump               wait (net.c) for an enqueue or a control frame, and do what each
 *                      frame says: requests to the coordinator, responses through the
 *                      cache (cache.c) to execution, a goodbye to shutdown.c, an abort
 *                      to fail.c
 *
 * It sleeps in poll() until an enqueue (the wake eventfd), a control frame or (one node)
 * the segment's doorbell arrives, so an idle engine costs nothing. A request that finds nothing else in flight is announced
 * at once; requests that arrive while others are in flight wait out HOROVOD_CYCLE_TIME
 * from the oldest one, so that requests made close together (a backward pass) are
 * announced, negotiated and fused together.
 *
 * Failure is sticky (fail.c): the loop exits once the engine has failed, and every
 * unfinished op has then been completed with the recorded cause.
 */
#include "loop.h"
#include "fail.h"
#include "wire.h"
#include "liveness.h"
#include "negotiation.h"
#include "net.h"
#include "shm.h"
#include "p2p.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void hvdl__queue_push(op_queue_t *q, op_t *o) {
    o->next = NULL;
    if (q->tail) q->tail->next = o;
    else q->head = o;
    q->tail = o;
}

op_t *hvdl__queue_pop(op_queue_t *q) {
    op_t *o = q->head;
    if (!o) return NULL;
    q->head = o->next;
    if (!q->head) q->tail = NULL;
    o->next = NULL;
    return o;
}

/* Move newly enqueued ops to the loop's own queue; returns whether shutdown was asked.
 * Only the loop thread drains its wake-up: a caller's drive leaves it, so the loop
 * always learns of a shutdown. */
static int take_incoming(engine_t *e, int drain) {
    if (drain) hvdl_wakefd_drain(e->wake_fd);
    pthread_mutex_lock(&e->mu);
    op_t *o;
    while ((o = hvdl__queue_pop(&e->incoming))) {
        if (!e->unsent.head) e->first_unsent_at = hvdl_now();
        hvdl__queue_push(&e->unsent, o);
    }
    int bye = e->shutdown_requested;
    pthread_mutex_unlock(&e->mu);
    return bye;
}

/* How long poll() may sleep: until the cycle ends if requests wait to be announced,
 * a second if rank 0 has something to watch for stalls, else until woken. */
static int sleep_ms(engine_t *e, double now) {
    if (e->unsent.head && e->mine.count == 0) return 0;
    if (e->unsent.head) {
        double left = e->first_unsent_at + e->cfg.cycle_time - now;
        return left <= 0 ? 0 : (int)(left * 1000) + 1;
    }
    if (e->negotiation->deferred(e)) return 1;  /* a log entry waits for room */
    /* rank 0 watches for stalls: pending names, and words partly set in a segment */
    int ms = (hvdl__coordinator_pending(e) || e->negotiation->watches(e)) && e->cfg.stall_check
                 ? 1000
                 : -1;
    int dl = hvdl__deadlock_ms(e);            /* callers blocked on ops in flight */
    if (dl >= 0 && (ms < 0 || dl < ms)) ms = dl;
    int beat = hvdl__liveness_ms(e);          /* heartbeats and the check on peers */
    return ms < 0 || (beat >= 0 && beat < ms) ? beat : ms;
}

static int is_member(const group_t *g, int rank) {
    for (int i = 0; i < g->n; i++)
        if (g->ranks[i] == rank) return 1;
    return 0;
}

/* Send each worker, in one frame, the responses of the plan that involve it. */
static int send_plan(engine_t *e, const response_t *rs, int n) {
    buf_t *wire = HVDL_INJECT(e, INJ_PLAN_FRAME_ALLOC) ? NULL : calloc((size_t)n, sizeof *wire),
          msg = {0};
    int rc = wire ? 0 : hvdl__oom(e, "table of response frames", (int64_t)sizeof *wire * n);
    for (int i = 0; i < n && !rc; i++)
        if (hvdl__write_response(e, &wire[i], &rs[i]))
            rc = hvdl__oom(e, "response frame", wire[i].len);
    for (int w = 1; w < e->size && !rc; w++) {
        uint32_t count = 0;
        msg.len = 0;
        if (buf_put_u32(&msg, 0)) {
            rc = hvdl__oom(e, "response frame", 4);
            break;
        }
        for (int i = 0; i < n; i++) {
            if (!is_member(e->sets[rs[i].meta.process_set], w)) continue;
            if (buf_put(&msg, wire[i].data, wire[i].len)) {
                rc = hvdl__oom(e, "response frame", msg.len);
                break;
            }
            count++;
        }
        if (rc || !count) continue;
        memcpy(msg.data, &count, 4);
        rc = hvdl__send_frame(e, w, MSG_RESPONSES, msg.data, msg.len);
    }
    for (int i = 0; wire && i < n; i++) buf_free(&wire[i]);
    free(wire);
    buf_free(&msg);
    return rc;
}

/* A response this rank takes part in (mine), or rank 0 planned: the negotiation gives it
 * its place (a one-node job: in the segment's log, which runs it in turn), or it runs now. */
static int place(engine_t *e, response_t *r, int mine) {
    int k = e->negotiation->place(e, r, mine);
    return k < 0 ? -1 : !k && mine ? hvdl__execute(e, r) : 0;
}

/* Rank 0: plan, send the plan, then execute rank 0's share of it, in order. */
static int lead(engine_t *e) {
    response_t *rs = NULL;
    int n = 0, rc = hvdl__coordinator_plan(e, &rs, &n);
    if (!rc && n) rc = send_plan(e, rs, n);
    for (int i = 0; i < n; i++) {
        if (!rc) rc = place(e, &rs[i], is_member(e->sets[rs[i].meta.process_set], 0));
        hvdl__response_free(&rs[i]);
    }
    free(rs);
    return rc;
}

/* ---- what to do with each frame ---- */

/* Memory ran out while decoding a frame: this rank's failure, whatever the frame held. */
static int decode_oom(engine_t *e, const reader_t *r) {
    return e->failed ? -1 : hvdl__oom(e, r->why, r->oom_bytes);
}

static int take_requests(engine_t *e, int from, reader_t *r) {
    request_list_t l = {0};
    const char *why = NULL;
    int rc = hvdl__read_requests(e, r, &l);
    if (rc) why = r->why;
    else rc = hvdl__coordinator_take(e, from, &l, &why);
    hvdl__request_list_free(&l);
    if (rc && r->oom) return decode_oom(e, r);
    if (rc && why) return hvdl__malformed(e, from, "request list", why);
    return rc;
}

static int take_responses(engine_t *e, int from, reader_t *r) {
    response_t *rs;
    int n, rc = 0;
    const char *why = NULL;
    if (hvdl__read_responses(e, r, &rs, &n))
        return e->failed ? -1
               : r->oom  ? decode_oom(e, r)
                         : hvdl__malformed(e, from, "response list", r->why);
    /* The cache follows the responses in order, as rank 0's did when it planned them. */
    for (int i = 0; i < n && !rc; i++) {
        rc = hvdl__cache_apply(e, &rs[i], &why);
        if (!rc) e->negotiation->applied(e, &rs[i]);   /* the rounds of the nodes' words */
    }
    if (rc && why) hvdl__malformed(e, from, "response list", why);
    double now = hvdl_now();
    for (int i = 0; i < n; i++) {
        rs[i].received_at = now;
        if (!rc) rc = place(e, &rs[i], 1);
        hvdl__response_free(&rs[i]);
    }
    free(rs);
    return rc;
}

/* The nodes' frames: orders to a node's leader, or (rank 0) bits its coordinator records. */
static int take_node_frame(engine_t *e, int from, int type, const uint8_t *p, int64_t n) {
    took_t t;
    hvdl__took_init(&t);
    int rc = e->negotiation->frame(e, from, type, p, n, &t) || hvdl__coordinator_take_bits(e, &t);
    hvdl__took_free(&t);
    return rc ? -1 : 0;
}

/* A node's leader scans its words, each turn (negotiation.h says when it is due). */
static int scan_words(engine_t *e, double now) {
    took_t t;
    hvdl__took_init(&t);
    int rc = e->negotiation->scan(e, now, &t) || hvdl__coordinator_take_bits(e, &t);
    hvdl__took_free(&t);
    return rc ? -1 : 0;
}

static int on_frame(engine_t *e, int from, int type, const uint8_t *p, int64_t n) {
    reader_t r = {.p = p, .left = n};
    switch (type) {
    case MSG_REQUESTS: return take_requests(e, from, &r);
    case MSG_RESPONSES: return take_responses(e, from, &r);
    case MSG_BYE: return hvdl__bye_received(e, from, p, n);
    case MSG_HEARTBEAT: return 0;         /* its arrival was the point (liveness.c) */
    case MSG_ABORT: return hvdl__abort_received(e, from, p, n);
    case MSG_NODE_DONE:
    case MSG_NODE_POSTED:
    case MSG_NODE_CLOSE:
    case MSG_NODE_REOPEN: return take_node_frame(e, from, type, p, n);
    case MSG_WAITS: return hvdl__deadlock_take(e, from, p, n);
    default:      /* net.c lets through only the types this rank may receive */
        return hvdl__malformed(e, from, "control frame", "a type this rank does not take");
    }
}

/* Handle every complete frame buffered from peer. Returns how many, or -1. */
static int handle_buffered(engine_t *e, int peer) {
    int type, k, count = 0;
    uint8_t *p;
    int64_t len;
    while ((k = hvdl__frame_take(e, peer, &type, &p, &len)) > 0) {
        int rc = on_frame(e, peer, type, p, len);
        free(p);
        if (rc) return -1;
        count++;
    }
    return k < 0 ? -1 : count;
}

/* Frames already buffered (read during a data transfer) are handled first, without
 * waiting; else wait up to timeout_ms and handle what came. */
static int pump(engine_t *e, int timeout_ms) {
    int handled = 0;
    for (int i = 0; i < e->size; i++) {
        if (e->peers[i].ctrl.fd < 0) continue;
        int k = handle_buffered(e, i);
        if (k < 0) return -1;
        handled += k;
        if (e->peers[i].ctrl.eof && !e->stopped) {
            /* closed after its goodbye, and the goodbye did not stop us: it was a worker
             * telling rank 0, which has now answered everyone */
            hvdl__peer_lost(e, i, "its connection closed");
            return -1;
        }
    }
    if (handled || e->stopped) return 0;
    int closed = hvdl__wait_control(e, timeout_ms, e->wake_fd);
    if (closed >= 0) {
        /* A frame that came before the close (a BYE, an ABORT) still counts. */
        if (handle_buffered(e, closed) < 0 || e->failed) return -1;
        hvdl__peer_lost(e, closed, hvdl__closed_why(e, closed));
        return -1;
    }
    for (int i = 0; i < e->size; i++)
        if (e->peers[i].ctrl.fd >= 0 && handle_buffered(e, i) < 0) return -1;
    return 0;
}

/* One cycle of the engine's work, run by the loop thread (by_caller 0) or by a caller
 * waiting for its op while the loop thread is not at work (by_caller 1, hvdl__drive). A
 * nonzero return ends the loop; a caller wakes the loop thread instead. What differs:
 *   - only the loop drains its wake-up (so it always learns of a shutdown), and only the
 *     loop says goodbye: a caller that finds shutdown asked hands it to the loop;
 *   - the loop marks every cycle on the timeline; a caller, which looks far more often,
 *     only the cycles where it announces;
 *   - a caller never does the waiting work: the stall check, a node leader's scan, the
 *     p2p connections, deadlock detection, heartbeats, and waiting for frames and
 *     handling them (pump): what a caller's sends and collectives buffer, the loop
 *     handles.
 * The steps shared are one code path, in one order, so that a driving caller completes a
 * small op exactly as the loop would (the small-op latency depends on it). */
static int run_cycle(engine_t *e, int by_caller) {
    int bye = take_incoming(e, !by_caller);
    if (bye && by_caller) return 1;                   /* a shutdown is the loop's */
    double now = hvdl_now();
    /* An engine with nothing awaiting a response announces at once: there is nothing
     * to fuse with, and waiting would only add latency. Requests that arrive while
     * others are in flight wait out the cycle and travel (and fuse) together. */
    int announce = e->unsent.head &&
                   (bye || e->mine.count == 0 || now - e->first_unsent_at >= e->cfg.cycle_time);
    if ((announce || !by_caller) && hvdl__tl_mark_cycles(e))
        hvdl__tl_instant(e, TL_CYCLES, "CYCLE_START", now, NULL);
    if (announce && hvdl__announce(e)) return 1;
    if (bye && !e->bye_sent) {
        e->bye_sent = 1;
        if (hvdl__say_bye(e)) return 1;
    }
    if (e->rank == 0) {
        if (lead(e)) return 1;
        if (!by_caller) hvdl__stall_check(e, now);
    }
    if (e->negotiation->run(e)) return 1;             /* the segment's log, in order */
    if (by_caller) return 0;
    if (hvdl__shutdown_due(e)) return 1;              /* every rank has said goodbye */
    if (scan_words(e, now)) return 1;                 /* a node leader's stuck words */
    if (hvdl__p2p_tend(e)) return 1;                  /* a p2p connection broke */
    if (hvdl__deadlock_tick(e, now)) return 1;        /* callers blocked for good */
    if (hvdl__liveness_check(e, hvdl_now())) return 1;
    if (e->failed || e->stopped) return 1;
    return pump(e, sleep_ms(e, hvdl_now()));
}

/* A caller waiting for its op runs the loop's work itself when the loop thread is not
 * running it (it sleeps, or waits in hvdl__wait_control): run_cycle's part that needs no
 * waiting. On one node a small op then needs no wake-up at all: the last caller to
 * arrive completes the request in the segment and executes it, and a caller already
 * waiting sees the log's entry and executes it too. */
int hvdl__drive(engine_t *e) {
    if (pthread_mutex_trylock(&e->drive)) return 0;   /* the loop thread is at work */
    int wake = 0;
    if (!e->failed && !e->stopped) {
        e->negotiation->watch_begin(e);
        wake = run_cycle(e, 1);
    }
    pthread_mutex_unlock(&e->drive);
    if (wake || e->failed) hvdl__wake(e);
    return 1;
}

void hvdl__drive_enter(engine_t *e) { atomic_fetch_add(&e->watchers, 1); }

/* The last caller to stop driving hands the log back to the loop thread: if it sleeps,
 * its doorbell is armed again, and it is woken if work came meanwhile (it sleeps with a
 * timeout chosen before the callers' work). */
void hvdl__drive_leave(engine_t *e) {
    pthread_mutex_lock(&e->drive);
    int wake = atomic_fetch_sub(&e->watchers, 1) == 1 &&
               (e->negotiation->watch_end(e) || e->unsent.head);
    pthread_mutex_unlock(&e->drive);
    if (wake) hvdl__wake(e);
}

void *hvdl__loop(void *arg) {
    engine_t *e = arg;
    pthread_mutex_lock(&e->drive);        /* let go only while waiting (net.c) */
    e->negotiation->thread_start(e);
    while (!e->failed && !e->stopped)
        if (run_cycle(e, 0)) break;
    /* From here on enqueue refuses (it checks this flag under mu), so every op that made
     * it in is completed below and none can slip in after. Only a real shutdown is
     * reported as one: every other exit has recorded its cause (fail.c). */
    pthread_mutex_lock(&e->mu);
    e->shutdown_requested = 1;
    int failed = e->failed;
    if (!failed && e->stopped) {
        char why[HVDL_MSG_BYTES + 64];
        snprintf(why, sizeof why, "horovodlike was shut down (%s) before this op finished",
                 e->bye_why[0] ? e->bye_why : "a rank called shutdown");
        hvdl__complete_all_locked(e, HVDL_ERR_SHUT_DOWN, why);
    }
    pthread_mutex_unlock(&e->mu);
    if (!failed && !e->stopped)
        hvdl__fail(e, HVDL_ERR_SYSTEM,
                   "internal error: the background loop stopped without recording why");
    if (e->stopped && !e->failed) hvdl__goodbye(e);
    e->negotiation->thread_end(e);
    hvdl__shm_report(e);
    pthread_mutex_unlock(&e->drive);
    return NULL;
}
