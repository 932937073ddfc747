/*
 * The mailbox. Between two ranks on one node, a send's announcement (an eager message
 * whole, or a large one's RTS) goes through the pair's shared-memory mailbox instead of
 * the connection: a byte ring of records (header, name, payload, padded to 8 bytes)
 * written by the sender, with the positions as atomic words beside it (p2p_ring.c). The
 * receiving rank's caller that waits on a recv from that peer polls the mailbox itself
 * (hvdl__engine_wait, hvdl__p2p_poll) and matches what it finds, so a small message
 * moves with no thread woken and no system call on either side. The sender rings
 * (F_BELL over the connection, waking the p2p thread, which then drains the mailbox as
 * it reads frames) only when nobody polls: the receiver counts its pollers in the
 * mailbox (POLLING), the sender stores the new tail and then loads the count, the
 * receiver drops the count and then looks once more (both seq_cst), so either the
 * sender sees a poller that will take the record or the receiver's thread is rung;
 * a bell not yet answered (BELLED) is not rung again. A full mailbox holds the sender's
 * queue (in order) until the receiver, asked by WANT_ROOM with the same fence
 * protocol, answers F_ROOM; the receiver's thread always drains, so a mailbox never
 * stays full while the receiver lives.
 * Ordering: a rank offers its mailbox (F_MBOX, like the ring, after the authenticated
 * handshake: memfd + token) on its first send to a peer on its node; until the peer
 * accepts, announcements go over the connection. On F_MBOX_OK it queues F_SWITCH in
 * the send queue, and announcements queued after it go through the mailbox; the
 * receiver reads the mailbox only once F_SWITCH has come, i.e. after every
 * announcement sent over the connection. Payloads after a CTS (DATA, SDATA, PIECE)
 * still go as before, so one name's small and large messages keep their order. The
 * receiver trusts nothing in the mailbox: the filled length is bounded by its size,
 * each header is checked as a frame's, each record must lie within what was filled.
 *
 * Cost model, one message of n bytes between two ranks on one node, the mailbox live:
 *   eager      the sender's caller copies the record into the mailbox (one memcpy of
 *              n bytes, no system call) and completes; a receiver polling for it
 *              copies it out into the recv's buffer (recv_) or a new one (recv): no
 *              wake-up anywhere. Not polling: one sendmsg of an 88-byte bell (at most
 *              one unanswered per pair) and the receiver's two wake-ups (p2p.c, the
 *              cost model). Latency: the two memcpys + the Python calls (measured:
 *              docs/benchmarks.md, "Point-to-point messages", "The mailbox");
 *              bandwidth up to the threshold: memcpy's, halved (two copies).
 *   memory     a mailbox per sending pair: one page + max(256 KiB, two of the largest
 *              eager records), made on the first send.
 *   rendezvous (no CMA) the RTS through the mailbox, the rest as between nodes
 *              (p2p.c, p2p_rendezvous.c).
 */
#define _GNU_SOURCE
#include "p2p_internal.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* MBOX: the peer offers its mailbox to this rank; map it and answer. It is read once
 * the peer's F_SWITCH comes, in order after every announcement sent over the connection. */
int hvdl__p2p_mbox_offered(engine_t *e, int peer) {
    ppeer_t *q = &e->p2p->peers[peer];
    p2p_hdr_t a = {.magic = F_MBOX_NO};
    const int64_t *f = q->rx_hdr.shape;             /* 1, pid, fd, token */
    if (q->mrx.base) return hvdl__p2p_violation(e, peer, "a second mailbox");
    int err = !e->cfg.p2p_mailbox ? EPERM
              : f[1] <= 0 || f[2] < 0
                  ? EINVAL
                  : hvdl__p2p_ring_attach(&q->mrx, f[1], f[2], (uint64_t)f[3], q->rx_hdr.nbytes, 1);
    if (!err) {
        a.magic = F_MBOX_OK;
        q->mrx_pid = f[1];
    } else
        hvdl__log(e, HVDL_LOG_WARNING,
                  "point-to-point messages from rank %d go over its connection, not shared "
                  "memory: cannot attach its mailbox (%s)",
                  peer, strerror(err));
    q->mrx_head = 0;
    return hvdl__p2p_queue_ctl_locked(e, peer, &a, NULL);
}

/* An eager message h whose payload lies in the peer's mailbox at pos: into its posted
 * recv (one copy), or buffered whole as unexpected. */
static int mb_eager(engine_t *e, int peer, const p2p_hdr_t *h, const char *name, uint64_t pos) {
    ppeer_t *q = &e->p2p->peers[peer];
    if (hvdl__p2p_eager_arrived(e, peer, h)) return -1;
    pmsg_t *r = hvdl__p2p_posted_for(q, name);
    if (r) {
        uint8_t *dst = NULL;
        unlink_msg(&q->recvs, r);
        if (hvdl__p2p_give_back(e, peer, h)) return -1;
        if (hvdl__p2p_accept_into(e, r, h, &dst)) return 0;   /* failed (mismatch): dropped */
        hvdl__p2p_mbox_get(&q->mrx, pos, dst, (size_t)h->nbytes);
        hvdl__p2p_finish(e, r, HVDL_OK, NULL);
        return 0;
    }
    pmsg_t *m = hvdl__p2p_held_entry(e, peer, K_UNEXPECTED, h, name);
    if (!m) return -1;
    if (h->nbytes && !(m->data = malloc((size_t)h->nbytes))) {
        free(m->name);
        free(m);
        hvdl__fail(e, HVDL_ERR_SYSTEM,
                   "rank %d (host %s) failed: out of memory for a %lld-byte point-to-point "
                   "message '%.64s' from rank %d",
                   e->rank, e->host, (long long)h->nbytes, name, peer);
        return -1;
    }
    hvdl__p2p_mbox_get(&q->mrx, pos, m->data, (size_t)h->nbytes);
    push(&q->unexpected, m);
    return 0;
}

/* With q->rmu held: take every record the peer has put in its mailbox, in order, as the
 * connection's reader takes frames. The peer is not trusted: the filled length, each
 * header and each record's length are checked before anything is read. 0, or -1 once
 * the peer is reported (its mailbox is then no longer read). The sender may wait for
 * room (MBOX_WANT_ROOM): it is told (F_ROOM) once records have been taken. */
int hvdl__p2p_mb_drain(engine_t *e, int peer) {
    ppeer_t *q = &e->p2p->peers[peer];
    if (!atomic_load(&q->mrx_live)) return 0;
    uint64_t cap = (uint64_t)q->mrx.slot_bytes;
    int took = 0;
    for (;;) {
        uint64_t tail = atomic_load_explicit(hvdl__p2p_mbox_word(&q->mrx, MBOX_TAIL),
                                             memory_order_acquire);
        uint64_t avail = tail - q->mrx_head;
        if (!avail) break;
        p2p_hdr_t h;
        const char *bad = hvdl__p2p_fill_problem(avail, cap);
        if (!bad) {
            hvdl__p2p_mbox_get(&q->mrx, q->mrx_head, &h, sizeof h);
            bad = hvdl__p2p_record_problem(&h, avail);
        }
        if (!bad) {
            hvdl__p2p_mbox_get(&q->mrx, q->mrx_head + sizeof h, q->mb_name, h.name_len);
            q->mb_name[h.name_len] = 0;
            bad = hvdl__p2p_name_problem(q->mb_name, h.name_len);
        }
        if (bad) {
            atomic_store(&q->mrx_live, 0);
            return hvdl__p2p_violation(e, peer, bad);
        }
        uint64_t len = hvdl__p2p_record_bytes(h.name_len, hvdl__p2p_record_payload(&h)), addr = 0;
        if (h.magic == F_RTSA)
            hvdl__p2p_mbox_get(&q->mrx, q->mrx_head + sizeof h + h.name_len, &addr, sizeof addr);
        int rc = h.magic == F_FIN ? hvdl__p2p_fin_arrived(e, peer, &h, q->mb_name)
                 : h.magic != P2P_MAGIC
                     ? hvdl__p2p_announced(e, peer, &h, q->mb_name, addr)
                     : mb_eager(e, peer, &h, q->mb_name, q->mrx_head + sizeof h + h.name_len);
        if (rc) return -1;
        q->mrx_head += len;
        atomic_store(hvdl__p2p_mbox_word(&q->mrx, MBOX_HEAD), q->mrx_head);
        took = 1;
    }
    /* seq_cst: either the sender sees the new head, or this sees its request */
    if (took && atomic_exchange(hvdl__p2p_mbox_word(&q->mrx, MBOX_WANT_ROOM), 0)) {
        p2p_hdr_t room = {.magic = F_ROOM};
        return hvdl__p2p_queue_ctl_locked(e, peer, &room, NULL);
    }
    return 0;
}

/* With q->smu held: put record h (with its name, then plen bytes of payload) in the
 * mailbox. 0 done (*bell: nobody polls it, so the receiver's thread must be told), 1 no
 * room (the receiver is asked to say when there is), -1 the receiver broke the mailbox. */
int hvdl__p2p_mb_put_rec(ppeer_t *q, const p2p_hdr_t *h, const char *name, const void *payload,
                         uint64_t plen, int *bell) {
    uint64_t len = hvdl__p2p_record_bytes(h->name_len, (int64_t)plen);
    uint64_t cap = (uint64_t)q->mtx.slot_bytes;
    _Atomic uint64_t *headp = hvdl__p2p_mbox_word(&q->mtx, MBOX_HEAD);
    uint64_t used = q->mtx_tail - atomic_load_explicit(headp, memory_order_acquire);
    if (used > cap) return -1;
    if (len > cap - used) {
        /* seq_cst: either the receiver sees the request, or this sees its new head */
        atomic_store(hvdl__p2p_mbox_word(&q->mtx, MBOX_WANT_ROOM), 1);
        used = q->mtx_tail - atomic_load(headp);
        if (used > cap) return -1;
        if (len > cap - used) return 1;
    }
    hvdl__p2p_mbox_put(&q->mtx, q->mtx_tail, h, sizeof *h);
    hvdl__p2p_mbox_put(&q->mtx, q->mtx_tail + sizeof *h, name, h->name_len);
    if (plen) hvdl__p2p_mbox_put(&q->mtx, q->mtx_tail + sizeof *h + h->name_len, payload, plen);
    q->mtx_tail += len;
    /* seq_cst, the store then the loads: either a polling receiver sees the record (it
     * looks again after it stops polling), or this sees it not polling and rings; and a
     * bell still unanswered (BELLED) is not rung again: its answer clears BELLED before
     * it drains, so it sees this record. */
    atomic_store(hvdl__p2p_mbox_word(&q->mtx, MBOX_TAIL), q->mtx_tail);
    *bell = atomic_load(hvdl__p2p_mbox_word(&q->mtx, MBOX_POLLING)) == 0 &&
            atomic_exchange(hvdl__p2p_mbox_word(&q->mtx, MBOX_BELLED), 1) == 0;
    return 0;
}

/* With q->smu held: put announcement m (EAGER with its payload, or RTS; with cma, RTSA
 * and its payload's address) in the mailbox, as hvdl__p2p_mb_put_rec. */
int hvdl__p2p_mb_put(ppeer_t *q, pmsg_t *m, int cma, int *bell) {
    p2p_hdr_t h = m->hdr;
    h.magic = m->kind == K_EAGER ? P2P_MAGIC : cma ? F_RTSA : F_RTS;
    uint64_t addr = (uint64_t)(uintptr_t)m->op->input; /* the receiver reads it from here */
    const void *payload = h.magic == P2P_MAGIC ? m->op->input : &addr;
    return hvdl__p2p_mb_put_rec(q, &h, m->op->name, payload, (uint64_t)hvdl__p2p_record_payload(&h),
                                bell);
}

/* With q->smu held, before the first send to peer: a peer on this node is offered a
 * mailbox, sized to hold at least two of the largest eager records; until it accepts
 * (and after a refusal) announcements go over the connection. */
void hvdl__p2p_offer_mbox(engine_t *e, int peer) {
    ppeer_t *q = &e->p2p->peers[peer];
    q->mb_state = MB_OFF;
    int64_t rec = (int64_t)hvdl__p2p_record_bytes(HVDL_MAX_NAME, e->cfg.p2p_eager_bytes);
    int64_t cap = (2 * rec + 4095) & ~(int64_t)4095;
    cap = cap < 4 * MBOX_MIN ? 4 * MBOX_MIN : cap;
    if (!e->cfg.p2p_mailbox || cap > MBOX_MAX || strcmp(e->peers[peer].host, e->host)) return;
    int err = hvdl__p2p_ring_create(&q->mtx, cap, 1);
    if (err) {
        hvdl__log(e, HVDL_LOG_WARNING,
                  "point-to-point messages to rank %d go over its connection, not shared "
                  "memory: cannot create a mailbox (%s)",
                  peer, strerror(err));
        return;
    }
    p2p_hdr_t h = {.magic = F_MBOX,
                   .nbytes = cap,
                   .shape = {1, (int64_t)getpid(), q->mtx.fd, (int64_t)q->mtx.token}};
    if (hvdl__p2p_queue_ctl(e, peer, &h, NULL)) {
        hvdl__p2p_ring_close(&q->mtx);
        return;
    }
    q->mtx_tail = 0;
    q->mb_state = MB_OFFERED;
}
