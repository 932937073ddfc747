/*
 * Point-to-point messages: hvd.send / hvd.recv between two ranks, agreed by those two
 * ranks alone.
 *
 * A send and a recv are matched by (src, dst, name), in posting order among equal
 * names, never by the order of different names. Nothing goes through rank 0 and no
 * other rank takes part: the message itself is the agreement.
 *
 * The channel. Every pair of ranks has a connection of its own for p2p (handshake.c,
 * channel CH_P2P, authenticated with the job key like the data and control
 * connections), served by a thread of its own (p2p_thread.c). So a large send never waits
 * behind a collective on the data sockets or behind negotiation on the loop thread, and
 * a collective never waits behind it.
 *
 * Up to HOROVODLIKE_P2P_EAGER_BYTES the protocol is eager: a send writes its header and
 * payload at once, straight from the caller's buffer; it completes when the kernel has
 * taken the last byte. The caller
 * writes it itself when it is the only message queued for that peer (send_now); what
 * the socket does not take at once, and later sends, the p2p thread writes in order. The
 * receiving thread reads every connection that no waiting caller reads (p2p_poll.c, "The
 * waiting caller reads"). A message whose recv is posted lands
 * directly in that recv's buffer (recv_) or in a buffer allocated for it once its
 * header says how big it is (recv, handed to the caller without a copy). A message
 * whose recv is not posted yet is buffered whole ("unexpected"), within the pair's
 * budget (p2p_credit.c: past it the sender announces it instead, as a large one), and a
 * later recv takes it: recv() takes the buffer itself, recv_() copies it once. Since every message is
 * always read (by the thread whenever no caller waits), no posting order between two
 * ranks can deadlock: an eager send never waits for the matching recv, only for the
 * kernel.
 *
 * Cost model. Between nodes (or HOROVODLIKE_P2P_MAILBOX=0), one message of n bytes
 * (on one node: p2p_mailbox.c; above the threshold: p2p_rendezvous.c):
 *   sender     one sendmsg by the caller (header, name and payload in one call), no
 *              copy and no wake-up; the p2p thread's wake-ups only when the socket
 *              buffer is full or earlier sends to that peer are still queued (and no
 *              caller waits to write them);
 *   receiver   a caller waiting: no wake-up, its recv() calls while it looks and two
 *              epoll_ctl (its wait's start and end); nobody waiting: the p2p thread's
 *              wake-up, and the caller's when it waits later; a posted recv_: header
 *              through a 64 KiB staging buffer, payload straight into the buffer (a
 *              small payload one extra memcpy from the staging buffer); recv(): one
 *              allocation; unmatched: one buffer of n bytes held until the recv, plus
 *              one memcpy for recv_;
 *   latency    the loopback/NIC time + the receiver's recv() (a wake-up or two where
 *              its caller does not look: past HOROVODLIKE_SPIN_US, plus 1 us per
 *              2 KiB up to 1 ms) (measured: docs/benchmarks.md, "Point-to-point
 *              messages", "The waiting caller reads the connection"); bandwidth is
 *              TCP's (the kernel overlaps the pieces: the sender fills the socket
 *              buffer while the receiver drains it).
 *   memory     unmatched eager messages are held in full, at most the pair's budget of
 *              them (p2p_credit.c); an unmatched large one costs the receiver its
 *              announcement only, and announcements are bounded too.
 *
 * This file is the API: a send or a recv, checked and posted on the caller's thread.
 * The rest of the channel is a file per job (p2p_internal.h lists them).
 */
#define _GNU_SOURCE
#include "p2p_internal.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The record of a caller's send or recv op (its peer is the op's root rank), or NULL
 * with the op finished with out of memory. */
static pmsg_t *op_msg(engine_t *e, op_t *o) {
    pmsg_t *m = calloc(1, sizeof *m);
    if (!m) {
        hvdl__p2p_finish_bare(e, o, HVDL_ERR_SYSTEM, "out of memory for a point-to-point message");
        return NULL;
    }
    m->op = o;
    m->peer = o->meta.root_rank;
    m->started = o->enqueued_at;
    return m;
}

/* With q->smu held, as send m is posted: eager while the receiver's credit lasts, else
 * announced (rendezvous: its payload waits here for the recv); one past the announcements
 * the receiver may hold fails at once (p2p_credit.c). 1 when m is finished so. */
static int spend_credit(engine_t *e, ppeer_t *q, pmsg_t *m) {
    const p2p_budget_t *b = &e->p2p->budget;
    int64_t nl = m->hdr.name_len;
    int64_t charge = hvdl__credit_charge(nl, m->hdr.nbytes);
    if (m->kind == K_EAGER && hvdl__credit_take(&q->credit, b, charge)) return 0;
    m->kind = K_RTS;
    char why[HVDL_MSG_BYTES / 2], msg[HVDL_MSG_BYTES];
    if (!hvdl__credit_announce(&q->credit, b, hvdl__credit_charge(nl, 0), why, sizeof why))
        return 0;
    snprintf(msg, sizeof msg, "send '%.200s' on rank %d to rank %d: %s", m->op->name, e->rank,
             m->peer, why);
    hvdl__p2p_finish(e, m, HVDL_ERR_INVALID, msg);
    return 1;
}

/* A send, on the caller's thread: queued behind the peer's earlier sends (in order, so
 * equal names stay first-in first-out), and written at once when it is the only one. A
 * message the socket takes whole completes here, with no wake-up; the rest is the p2p
 * thread's (woken to watch the socket). */
static int send_now(engine_t *e, op_t *o) {
    struct p2p *p = e->p2p;
    pmsg_t *m = op_msg(e, o);
    if (!m) return HVDL_OK;
    m->hdr = (p2p_hdr_t){P2P_MAGIC, (uint32_t)strlen(o->name), o->meta.dtype, o->meta.ndim, {0},
                         o->nbytes};
    memcpy(m->hdr.shape, o->meta.shape, sizeof(int64_t) * (size_t)o->meta.ndim);
    /* Above the eager threshold the receiver is asked first (RTS), and the payload
     * moves once it has a place for it (CTS): it never holds a large message unasked. */
    m->kind = o->nbytes > e->cfg.p2p_eager_bytes && o->nbytes > 0 ? K_RTS : K_EAGER;
    atomic_fetch_add(&p->npending, 1);
    ppeer_t *q = &p->peers[m->peer];
    pthread_mutex_lock(&q->smu);
    if (atomic_load(&q->left)) {                    /* it has shut down: it posts no recv */
        pthread_mutex_unlock(&q->smu);
        hvdl__p2p_finish_closed(e, m, 1);
        return HVDL_OK;
    }
    if (spend_credit(e, q, m)) {                    /* past what the receiver may hold */
        pthread_mutex_unlock(&q->smu);
        return HVDL_OK;
    }
    if (q->mb_state == MB_NONE) hvdl__p2p_offer_mbox(e, m->peer);
    if (m->kind == K_RTS && q->ring_state == 0) hvdl__p2p_offer_ring(e, m->peer);
    push(&q->sends, m);
    if (q->closed) {                      /* the p2p thread fails it (hvdl__p2p_report_closed) */
        pthread_mutex_unlock(&q->smu);
        hvdl__p2p_report_closed(e, m->peer);
        return HVDL_OK;
    }
    if (q->sends.head == m) hvdl__p2p_write_locked(e, m->peer);
    /* the thread watches what is left: the socket (for room), and an announced send's
     * wait (for a failure or a stall: only a thread asleep without a timeout must be
     * woken for that; seq_cst with its sleeping flag, see p2p_main) */
    int queued = q->sends.head || q->ctl.head || q->cur ||
                 (q->rts_wait.head && atomic_load(&p->sleeping));
    pthread_mutex_unlock(&q->smu);
    if (queued) hvdl_wakefd_signal(p->wake_fd);
    return HVDL_OK;
}

/* A recv, posted on the caller's thread (no hand-off to the p2p thread): what the peer
 * put in its mailbox is taken first, then the recv takes the oldest unexpected message
 * of its name or waits among the posted. Checked under rmu: once the p2p thread has
 * seen the stop or a failure it fails everything posted (taking rmu), so a recv posted
 * before that is failed by it, and one after is failed here. */
static int post_now(engine_t *e, op_t *o) {
    struct p2p *p = e->p2p;
    pmsg_t *m = op_msg(e, o);
    if (!m) return HVDL_OK;
    m->kind = K_RECV;
    atomic_fetch_add(&p->npending, 1);
    ppeer_t *q = &p->peers[m->peer];
    pthread_mutex_lock(&q->rmu);
    pthread_mutex_lock(&p->mu);
    int stopped = p->stop;
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_lock(&e->mu);
    int failed = e->failed, status = e->fail_status;
    int over = e->shutdown_requested && !failed;
    char msg[HVDL_MSG_BYTES];
    if (failed) snprintf(msg, sizeof msg, "%s", e->fail_msg);
    pthread_mutex_unlock(&e->mu);
    if (stopped) hvdl__p2p_finish(e, m, HVDL_ERR_SHUT_DOWN, "horovodlike has been shut down");
    else if (failed) hvdl__p2p_finish(e, m, status, msg);
    else if (hvdl__p2p_mb_drain(e, m->peer) == 0) hvdl__p2p_post_recv(e, m, over);
    else push(&q->recvs, m);                        /* the peer broke: the thread fails it */
    pthread_mutex_unlock(&q->rmu);
    hvdl__p2p_caller_flush(e, o->meta.root_rank);
    /* seq_cst, with the thread's sleeping flag: it watches this op (see p2p_main) */
    if (atomic_load(&p->sleeping)) hvdl_wakefd_signal(p->wake_fd);
    return HVDL_OK;
}

/* Local checks of a send or recv: hvdl__check_common's (ops.c), then its peer's. Called
 * with e->mu held. */
static int check_p2p(engine_t *e, const hvdl_request *q, int64_t *nbytes) {
    const char *what = hvdl_op_name(q->op);
    int into = q->op == HVDL_OP_RECV && (q->flags & HVDL_RECV_INTO);
    /* a recv not into a buffer takes the message's dtype and shape, whatever they are */
    request_rules_t k = {what, q->op == HVDL_OP_SEND || into, P2P_MAX_BYTES,
                         into ? q->output : q->input, into ? "output" : "input"};
    int rc = hvdl__check_common(e, q, &k, nbytes);
    if (rc) return rc;
    int peer = q->root_rank;
    const char *role = q->op == HVDL_OP_SEND ? "destination" : "source";
    if (peer < 0 || peer >= e->size)
        return hvdl__err(HVDL_ERR_INVALID, "%s '%s': %s rank %d is not a rank of the job (size %d)",
                         what, q->name, role, peer, e->size);
    if (peer == e->rank)
        return hvdl__err(HVDL_ERR_INVALID, "%s '%s': rank %d cannot %s itself", what, q->name,
                         e->rank, q->op == HVDL_OP_SEND ? "send to" : "receive from");
    const group_t *g = e->sets[q->process_set];
    int member = 0;
    for (int i = 0; i < g->n; i++) member |= g->ranks[i] == peer;
    if (!member)
        return hvdl__err(HVDL_ERR_INVALID, "%s '%s': %s rank %d is not a member of process set %d",
                         what, q->name, role, peer, q->process_set);
    return HVDL_OK;
}

int hvdl__p2p_enqueue(engine_t *e, const hvdl_request *q, int64_t *handle) {
    if (!e || !e->thread_started || !e->p2p)
        return hvdl__err(HVDL_ERR_NOT_INITIALIZED,
                         "horovodlike has not been initialized; use hvd.init()");
    int64_t nbytes = 0;
    pthread_mutex_lock(&e->mu);
    int rc = check_p2p(e, q, &nbytes);
    pthread_mutex_unlock(&e->mu);
    if (rc) return rc;
    op_t *o = calloc(1, sizeof *o);
    if (!o || !(o->name = strdup(q->name))) {
        free(o);
        return hvdl__err(HVDL_ERR_SYSTEM, "out of memory");
    }
    int into = q->op == HVDL_OP_RECV && (q->flags & HVDL_RECV_INTO);
    int shaped = q->op == HVDL_OP_SEND || into;
    o->meta = (meta_t){q->op,
                       shaped ? q->dtype : 0,
                       0,
                       q->root_rank,
                       q->process_set,
                       shaped ? q->ndim : -1,
                       {0},
                       1.0,
                       1.0};
    if (shaped) memcpy(o->meta.shape, q->shape, sizeof(int64_t) * (size_t)q->ndim);
    o->input = q->op == HVDL_OP_SEND ? q->input : NULL;
    o->output = into ? q->output : NULL;
    o->nbytes = nbytes;
    o->enqueued_at = hvdl_now();
    /* Any rank's shutdown stops every rank's engine (as in Horovod), and a send is
     * refused after it; a recv is not, while this rank's own p2p thread runs (until its
     * own shutdown): the messages its peers sent before they shut down are delivered, and
     * a recv of one never sent fails once that peer's connection has closed, naming it. */
    pthread_mutex_lock(&e->mu);
    if (e->failed) rc = hvdl__err(e->fail_status, "%s", e->fail_msg);
    else if (q->op == HVDL_OP_SEND && (e->shutdown_requested || e->stopped))
        rc = hvdl__err(HVDL_ERR_SHUT_DOWN, "horovodlike has been shut down");
    else rc = hvdl__handle_new(e, o);
    pthread_mutex_unlock(&e->mu);
    if (rc) {
        free(o->name);
        free(o);
        return rc;
    }
    *handle = o->handle;
    if (q->op == HVDL_OP_SEND) return send_now(e, o);
    return post_now(e, o);
}
