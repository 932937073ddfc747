/*
 * Above the threshold, rendezvous: the send announces itself (RTS: header and name) and
 * waits aside (rts_wait), not blocking later sends; the receiver keeps the announcement
 * (no payload) until a recv of that name is posted, prepares its buffer and answers
 * (CTS); then the payload moves straight into that buffer (DATA), or, between ranks on
 * one node, through the pair's shared-memory ring (SDATA, then a PIECE frame per slot
 * filled, each answered by an ACK that frees the slot; p2p_ring.c). Control frames
 * (CTS, ACK, the ring's offer and answer) are written before the next frame of any
 * send, so a ring message waiting for a free slot never holds up the acknowledgements
 * the other direction waits for. Posting still never blocks, so no posting order
 * deadlocks; a blocking send above the threshold waits for its recv, as MPI_Send does.
 *
 * Cost: one round trip (RTS, CTS) before the payload; on one node the payload then costs
 * one memcpy on each side, overlapped piece by piece (the sender fills slot k+1 while the
 * receiver empties slot k), and two small frames per piece (a slot is
 * HOROVODLIKE_P2P_SHM_RING_BYTES / 8). Between nodes the payload is one sendmsg (DATA).
 */
#define _GNU_SOURCE
#include "p2p_internal.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* What the receiver holds of an announced message without a recv op (an announcement
 * not asked for yet, or a cleared one to discard): NULL after failing the job. */
pmsg_t *hvdl__p2p_held_entry(engine_t *e, int peer, int kind, const p2p_hdr_t *h,
                             const char *name) {
    pmsg_t *m = calloc(1, sizeof *m);
    if (!m || !(m->name = strdup(name))) {
        free(m);
        hvdl__fail(e, HVDL_ERR_SYSTEM, "rank %d (host %s) failed: out of memory", e->rank, e->host);
        return NULL;
    }
    m->kind = kind;
    m->peer = peer;
    m->hdr = *h;
    m->started = hvdl_now();
    return m;
}

/* A recv r meets a message announced by h (RTS): prepare its buffer and clear the sender
 * to send (CTS). An RTSA's payload (addr) is read at once instead, and the sender told
 * it is done (FIN). A recv that fails here (a wrong recv_ buffer) still clears it, so the
 * sender completes, and its payload is discarded. Then r awaits the payload. */
int hvdl__p2p_clear_to_send(engine_t *e, pmsg_t *r, const p2p_hdr_t *h, const char *name,
                            uint64_t addr) {
    int peer = r->peer;
    ppeer_t *q = &e->p2p->peers[peer];
    uint8_t *dst = NULL;
    pmsg_t *a = r;
    int ok = hvdl__p2p_accept_into(e, r, h, &dst) == 0;   /* (failed: r is finished and freed) */
    if (addr && e->cfg.p2p_cma && q->cma >= 0) {
        char why[256], msg[HVDL_MSG_BYTES];
        int rc = ok && h->nbytes
                     ? hvdl__p2p_cma_read(e, peer, dst, addr, h->nbytes, name, why, sizeof why)
                     : 0;
        if (rc < 0) {                               /* the peer is reported */
            snprintf(msg, sizeof msg, "rank %d (host %s) was lost: %s", peer, e->peers[peer].host,
                     why);
            hvdl__p2p_finish(e, r, HVDL_ERR_PEER_LOST, msg);
            return -1;
        }
        if (rc == 0) {                              /* read (or discarded): the send is done */
            if (ok) hvdl__p2p_finish(e, r, HVDL_OK, NULL);
            return hvdl__p2p_send_fin(e, peer, h, name);
        }
    }                                               /* no address, or refused: the CTS path */
    if (!ok && !(a = hvdl__p2p_held_entry(e, peer, K_AWAIT, h, name))) return -1;
    a->kind = K_AWAIT;
    a->hdr = *h;
    a->data = dst;
    push(&q->awaiting, a);
    p2p_hdr_t c = *h;
    c.magic = F_CTS;
    return hvdl__p2p_queue_ctl_locked(e, peer, &c, name);
}

/* The first recv cleared to come with this name (DATA and SDATA come in CTS order per
 * name), unlinked, or NULL. */
pmsg_t *hvdl__p2p_take_awaiting(ppeer_t *q, const char *name) {
    for (pmsg_t *a = q->awaiting.head; a; a = a->next)
        if (!strcmp(a->op ? a->op->name : a->name, name)) {
            unlink_msg(&q->awaiting, a);
            return a;
        }
    return NULL;
}

/* An awaiting recv's payload has all come (or it was discarded). */
void hvdl__p2p_end_awaiting(engine_t *e, pmsg_t *a) {
    if (a->op) {
        hvdl__p2p_finish(e, a, HVDL_OK, NULL);
        return;
    }
    free(a->name);
    free(a);
}

/* RING: the peer offers its ring to this rank; map it and answer. */
int hvdl__p2p_ring_offered(engine_t *e, int peer) {
    ppeer_t *q = &e->p2p->peers[peer];
    p2p_hdr_t a = {.magic = F_RING_NO};
    const int64_t *f = q->rx_hdr.shape;             /* nslots, pid, fd, token */
    if (q->rx.base) return hvdl__p2p_violation(e, peer, "a second ring");
    int err = !e->cfg.shm || e->cfg.p2p_ring_bytes <= 0 ? EPERM
              : f[1] <= 0 || f[2] < 0 ? EINVAL
                                      : hvdl__p2p_ring_attach(&q->rx, f[1], f[2], (uint64_t)f[3],
                                                              q->rx_hdr.nbytes, (int)f[0]);
    if (!err) a.magic = F_RING_OK;
    else
        hvdl__log(e, HVDL_LOG_WARNING,
                  "point-to-point messages from rank %d go over its connection, not shared "
                  "memory: cannot attach its ring (%s)",
                  peer, strerror(err));
    return hvdl__p2p_queue_ctl_locked(e, peer, &a, NULL);
}

/* An announcement (RTS) h of a large message: clear it if its recv is posted, else keep
 * it (no payload) until one is. */
int hvdl__p2p_announced(engine_t *e, int peer, const p2p_hdr_t *h, const char *name,
                        uint64_t addr) {
    ppeer_t *q = &e->p2p->peers[peer];
    pmsg_t *r = hvdl__p2p_posted_for(q, name);
    if (r) {
        unlink_msg(&q->recvs, r);
        return hvdl__p2p_clear_to_send(e, r, h, name, addr);
    }
    const char *bad = hvdl__credit_hold(&q->credit, &e->p2p->budget,
                                        hvdl__credit_charge(h->name_len, 0));
    if (bad) return hvdl__p2p_violation(e, peer, bad);
    pmsg_t *m = hvdl__p2p_held_entry(e, peer, K_UNEXPECTED_RTS, h, name);
    if (!m) return -1;
    m->addr = addr;
    push(&q->unexpected, m);
    return 0;
}

/* With q->smu held: the receiver answered the first send announced with this name:
 * CTS (the payload goes now) or FIN (it read the payload itself: the send is done).
 * NULL, or what is wrong. */
const char *hvdl__p2p_rts_answered(engine_t *e, int peer, const p2p_hdr_t *h, const char *name) {
    ppeer_t *q = &e->p2p->peers[peer];
    pmsg_t *m = q->rts_wait.head;
    for (; m && strcmp(m->op->name, name); m = m->next) {}
    if (!m || m->hdr.nbytes != h->nbytes) return "a clear-to-send for nothing announced";
    unlink_msg(&q->rts_wait, m);
    hvdl__credit_answered(&q->credit, hvdl__credit_charge(m->hdr.name_len, 0));
    if (h->magic == F_FIN) {
        hvdl__p2p_finish(e, m, HVDL_OK, NULL);
        return NULL;
    }
    m->kind = q->ring_state == 2 && m->hdr.nbytes ? K_SDATA : K_DATA; /* (SDATA has pieces) */
    m->framed = 0;
    m->off = 0;
    push(&q->sends, m);
    return NULL;
}

/* PIECE: the next slot of the peer's ring holds the next piece of the SDATA message. */
int hvdl__p2p_piece_arrived(engine_t *e, int peer) {
    ppeer_t *q = &e->p2p->peers[peer];
    pmsg_t *a = q->rx_ring_msg;
    int64_t n = q->rx_hdr.nbytes;
    if (!a || !q->rx.base || n > q->rx.slot_bytes || n > a->hdr.nbytes - q->rx_ring_got)
        return hvdl__p2p_violation(e, peer, "a piece that does not fit");
    /* a slot whose ACK has not begun to go out is not free: so at most nslots ACKs wait */
    if (q->rx_pieces - atomic_load(&q->acks_out) >= q->rx.nslots)
        return hvdl__p2p_violation(e, peer, "a piece in a slot not freed yet");
    if (a->data)
        memcpy(a->data + q->rx_ring_got, hvdl__p2p_ring_slot(&q->rx, q->rx_pieces), (size_t)n);
    q->rx_pieces++;
    q->rx_ring_got += n;
    p2p_hdr_t ack = {.magic = F_ACK, .nbytes = n};
    if (hvdl__p2p_queue_ctl_locked(e, peer, &ack, NULL)) return -1;
    if (q->rx_ring_got == a->hdr.nbytes) {
        q->rx_ring_msg = NULL;
        hvdl__p2p_end_awaiting(e, a);
    }
    return 0;
}

/* With q->smu held, before the first rendezvous send to peer: a peer on this node is
 * offered a ring (the offer goes out before that send's RTS, so its answer comes back
 * before the CTS); elsewhere, or failing, payloads go over the connection. */
void hvdl__p2p_offer_ring(engine_t *e, int peer) {
    ppeer_t *q = &e->p2p->peers[peer];
    q->ring_state = 3;
    if (!e->cfg.shm || e->cfg.p2p_ring_bytes <= 0 || strcmp(e->peers[peer].host, e->host)) return;
    int64_t slot = e->cfg.p2p_ring_bytes / RING_SLOTS & ~(int64_t)(RING_MIN_SLOT - 1);
    slot = slot < RING_MIN_SLOT ? RING_MIN_SLOT : slot > RING_MAX_SLOT ? RING_MAX_SLOT : slot;
    int err = hvdl__p2p_ring_create(&q->tx, slot, RING_SLOTS);
    if (err) {
        hvdl__log(e, HVDL_LOG_WARNING,
                  "point-to-point messages to rank %d go over its connection, not shared "
                  "memory: cannot create a ring (%s)",
                  peer, strerror(err));
        return;
    }
    p2p_hdr_t h = {.magic = F_RING,
                   .nbytes = slot,
                   .shape = {RING_SLOTS, (int64_t)getpid(), q->tx.fd, (int64_t)q->tx.token}};
    if (hvdl__p2p_queue_ctl(e, peer, &h, NULL)) {
        hvdl__p2p_ring_close(&q->tx);
        return;
    }
    q->ring_state = 1;
}
