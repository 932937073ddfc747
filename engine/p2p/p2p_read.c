/*
 * Reading a peer's connection: the frames' state machine (header, name, payload),
 * run by whichever thread reads it (the p2p thread, or a waiting caller: p2p_poll.c)
 * under the peer's rmu. Every header is checked (p2p_frames.c) before anything in it
 * is trusted; a frame that fails, or one out of turn, reports the peer as lost.
 * Bytes come through a 64 KiB staging buffer; a large payload's rest goes straight
 * into its buffer. An eager message is held to the credit this rank gave its
 * sender (hvdl__p2p_eager_arrived, p2p_credit.c); a peer's goodbye (F_BYE) is taken here
 * ("Leaving", below).
 */
#define _GNU_SOURCE
#include "p2p_internal.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

int hvdl__p2p_violation(engine_t *e, int peer, const char *what) {
    char why[200];
    snprintf(why, sizeof why, "sent a malformed point-to-point frame (%s)", what);
    hvdl__p2p_report_lost(e, peer, why);
    return -1;
}

/* An eager message h from peer arrives: within the credit this rank gave it, or the peer
 * broke the protocol (p2p_credit.c). 0, or -1 once reported. */
int hvdl__p2p_eager_arrived(engine_t *e, int peer, const p2p_hdr_t *h) {
    ppeer_t *q = &e->p2p->peers[peer];
    const char *bad = hvdl__credit_arrived(&q->credit, &e->p2p->budget,
                                           hvdl__credit_charge(h->name_len, h->nbytes));
    return bad ? hvdl__p2p_violation(e, peer, bad) : 0;
}

/* The sender's side of a frame without a payload: CTS, ACK, RING_OK, RING_NO, MBOX_OK,
 * MBOX_NO, ROOM. */
static int sender_frame(engine_t *e, int peer) {
    ppeer_t *q = &e->p2p->peers[peer];
    const p2p_hdr_t *h = &q->rx_hdr;
    const char *bad = NULL;
    pthread_mutex_lock(&q->smu);
    if (h->magic == F_CTS || h->magic == F_FIN) {
        bad = hvdl__p2p_rts_answered(e, peer, h, q->rx_name);
    } else if (h->magic == F_ACK) {
        if (q->tx_acked >= q->tx_pieces) bad = "an acknowledgement of nothing";
        else q->tx_acked++;
        q->blocked = 0;
    } else if (h->magic == F_CREDIT) {
        bad = hvdl__credit_returned(&q->credit, h->nbytes);
    } else if (h->magic == F_ROOM) {
        if (q->mb_state != MB_LIVE && q->mb_state != MB_SWITCHING) bad = "room in no mailbox";
        q->blocked = 0;
    } else if (h->magic == F_MBOX_OK || h->magic == F_MBOX_NO) {
        pmsg_t *sw = h->magic == F_MBOX_OK ? calloc(1, sizeof *sw) : NULL;
        if (q->mb_state != MB_OFFERED) bad = "a mailbox answer to no offer";
        else if (sw) { /* in send order: what follows uses it */ sw->kind = K_SWITCH;
            sw->peer = peer;
            sw->hdr.magic = F_SWITCH;
            sw->started = hvdl_now();
            push(&q->sends, sw);
            q->mb_state = MB_SWITCHING;
            sw = NULL;
        } else {                                    /* refused (or no memory): the connection */
            q->mb_state = MB_OFF;
            hvdl__p2p_ring_close(&q->mtx);
        }
        free(sw);
    } else if (q->ring_state != 1) {
        bad = "a ring answer to no offer";
    } else if (h->magic == F_RING_OK) {
        q->ring_state = 2;
    } else {
        q->ring_state = 3;
        hvdl__p2p_ring_close(&q->tx);
    }
    pthread_mutex_unlock(&q->smu);
    return bad ? hvdl__p2p_violation(e, peer, bad) : 0;
}

/* ---- Leaving ----
 * A rank that shuts down (hvdl__p2p_leave) queues F_BYE behind its sends, so it reaches
 * each peer after every message and announcement it sent (those in its mailbox too: the
 * receiver drains the mailbox first). Its engine serves on until the job ends
 * (shutdown.c), so what it announced still moves; but it posts nothing more. From the
 * F_BYE on, the peer knows that:
 *   - a recv of a message the leaver never sent fails at once, naming it (none can come);
 *   - a send to it, or one announced and waiting for its CTS, fails at once (no recv will
 *     be posted for it);
 *   - its connection closing later is no loss: what still waits on it ends naming it.
 * Cost: one frame per pair per shutdown. Under rmu (the p2p thread's or a caller's read). */
static int peer_left(engine_t *e, int peer) {
    ppeer_t *q = &e->p2p->peers[peer];
    if (atomic_load(&q->left)) return hvdl__p2p_violation(e, peer, "a second goodbye");
    if (hvdl__p2p_mb_drain(e, peer)) return -1;
    atomic_store(&q->left, 1);
    hvdl__p2p_fail_list(e, &q->recvs, 0, NULL);        /* each names the peer (p2p_complete.c) */
    pthread_mutex_lock(&q->smu);
    hvdl__p2p_fail_list(e, &q->rts_wait, 0, NULL);
    pthread_mutex_unlock(&q->smu);
    return 0;
}

/* A whole header (and name, if it has one) is here: act on it. Only EAGER and DATA go
 * on to a payload (rx_state 2); 0, or -1 once the peer is reported. */
static int begin_payload(engine_t *e, int peer) {
    ppeer_t *q = &e->p2p->peers[peer];
    uint32_t magic = q->rx_hdr.magic;
    q->rx_state = 0;
    q->rx_got = 0;
    if (hvdl__p2p_named_frame(magic)) {
        q->rx_name[q->rx_hdr.name_len] = 0;
        if (hvdl__p2p_name_problem(q->rx_name, q->rx_hdr.name_len)) {
            hvdl__p2p_report_lost(
                e, peer, "sent a malformed point-to-point message (a NUL byte in its name)");
            return -1;
        }
    }
    switch (magic) {
    case F_CTS:
    case F_FIN:
    case F_ACK:
    case F_RING_OK:
    case F_RING_NO:
    case F_MBOX_OK:
    case F_MBOX_NO:
    case F_ROOM:
    case F_CREDIT: return sender_frame(e, peer);
    case F_BYE: return peer_left(e, peer);
    case F_RING: return hvdl__p2p_ring_offered(e, peer);
    case F_PIECE: return hvdl__p2p_piece_arrived(e, peer);
    case F_MBOX: return hvdl__p2p_mbox_offered(e, peer);
    case F_SWITCH:
        if (!q->mrx.base || atomic_load(&q->mrx_live))
            return hvdl__p2p_violation(e, peer, "a switch to no mailbox");
        atomic_store(&q->mrx_live, 1);
        return hvdl__p2p_mb_drain(e, peer);
    case F_BELL:
        if (!atomic_load(&q->mrx_live))
            return hvdl__p2p_violation(e, peer, "a doorbell of no mailbox");
        atomic_store(hvdl__p2p_mbox_word(&q->mrx, MBOX_BELLED),
                     0); /* seq_cst: see hvdl__p2p_mb_put */
        return hvdl__p2p_mb_drain(e, peer);
    case F_RTS: return hvdl__p2p_announced(e, peer, &q->rx_hdr, q->rx_name, 0);
    case F_RTSA: return hvdl__p2p_violation(e, peer, "a mailbox record over the connection");
    case F_DATA:
    case F_SDATA: {
        pmsg_t *a = hvdl__p2p_take_awaiting(q, q->rx_name);
        if (!a || a->hdr.nbytes != q->rx_hdr.nbytes)
            return hvdl__p2p_violation(e, peer, "a payload it was not cleared to send");
        if (magic == F_SDATA) {
            if (!q->rx.base || q->rx_ring_msg)
                return hvdl__p2p_violation(e, peer, "a ring message out of turn");
            q->rx_ring_msg = a;
            q->rx_ring_got = 0;
            return 0;
        }
        if (!a->op) {                               /* its recv failed: discard */
            hvdl__p2p_end_awaiting(e, a);
            a = NULL;
        }
        q->rx_into = a;
        q->rx_dst = a ? a->data : NULL;
        q->rx_state = 2;
        return 0;
    }
    }
    /* EAGER */
    if (hvdl__p2p_eager_arrived(e, peer, &q->rx_hdr)) return -1;
    pmsg_t *r = hvdl__p2p_posted_for(q, q->rx_name);
    if (r) {
        unlink_msg(&q->recvs, r);
        if (hvdl__p2p_give_back(e, peer, &q->rx_hdr)) return -1;
        if (hvdl__p2p_accept_into(e, r, &q->rx_hdr, &q->rx_dst) == 0) q->rx_into = r;
        else q->rx_into = NULL;                     /* failed (mismatch): discard */
    } else {                                        /* unexpected: buffer it whole */
        pmsg_t *m = calloc(1, sizeof *m);
        char *name = strdup(q->rx_name);
        uint8_t *data = q->rx_hdr.nbytes ? malloc((size_t)q->rx_hdr.nbytes) : NULL;
        if (!m || !name || (q->rx_hdr.nbytes && !data)) {
            free(m);
            free(name);
            free(data);
            char why[200];
            snprintf(why, sizeof why,
                     "out of memory for a %lld-byte point-to-point message '%.64s' from rank %d",
                     (long long)q->rx_hdr.nbytes, q->rx_name, peer);
            hvdl__fail(e, HVDL_ERR_SYSTEM, "rank %d (host %s) failed: %s", e->rank, e->host, why);
            return -1;
        }
        m->kind = K_UNEXPECTED;
        m->peer = peer;
        m->hdr = q->rx_hdr;
        m->name = name;
        m->data = data;
        m->started = hvdl_now();
        q->rx_into = m;
        q->rx_dst = data;
    }
    q->rx_state = 2;
    return 0;
}

/* The payload is complete. */
static void end_payload(engine_t *e, int peer) {
    ppeer_t *q = &e->p2p->peers[peer];
    pmsg_t *m = q->rx_into;
    q->rx_into = NULL;
    q->rx_dst = NULL;
    q->rx_state = 0;
    q->rx_got = 0;
    if (!m) return;                                 /* discarded */
    if (m->op) {
        hvdl__p2p_finish(e, m, HVDL_OK, NULL);
        return;
    }
    /* Unexpected: a recv may have been posted while it arrived. */
    pmsg_t *r = hvdl__p2p_posted_for(q, m->name);
    if (r) {
        unlink_msg(&q->recvs, r);
        hvdl__p2p_deliver(e, r, m);
    } else push(&q->unexpected, m);
}

/* Consume staged bytes; may read large payloads straight into their destination. */
static int parse(engine_t *e, int peer) {
    ppeer_t *q = &e->p2p->peers[peer];
    for (;;) {
        int64_t have = q->stage_len - q->stage_pos;
        if (q->rx_state == 0 || q->rx_state == 1) {
            uint8_t *dst = q->rx_state == 0 ? (uint8_t *)&q->rx_hdr : (uint8_t *)q->rx_name;
            int64_t want = q->rx_state == 0 ? (int64_t)sizeof q->rx_hdr
                                            : (int64_t)q->rx_hdr.name_len;
            int64_t k = want - q->rx_got < have ? want - q->rx_got : have;
            memcpy(dst + q->rx_got, q->stage + q->stage_pos, (size_t)k);
            q->stage_pos += k;
            q->rx_got += k;
            if (q->rx_got < want) return 0;
            q->rx_got = 0;
            if (q->rx_state == 0) {
                const char *why = hvdl__p2p_header_problem(&q->rx_hdr);
                if (why) {
                    char msg[200];
                    snprintf(msg, sizeof msg, "sent a malformed point-to-point header (%s)", why);
                    hvdl__p2p_report_lost(e, peer, msg);
                    return -1;
                }
                q->rx_state = 1;
                if (!hvdl__p2p_named_frame(q->rx_hdr.magic) && begin_payload(e, peer)) return -1;
            } else if (begin_payload(e, peer)) {
                return -1;
            }
        }
        if (q->rx_state == 2) {
            int64_t left = q->rx_hdr.nbytes - q->rx_got;
            have = q->stage_len - q->stage_pos;       /* the header may have used some */
            int64_t k = left < have ? left : have;
            if (k > 0) {
                if (q->rx_dst) memcpy(q->rx_dst + q->rx_got, q->stage + q->stage_pos, (size_t)k);
                q->stage_pos += k;
                q->rx_got += k;
            }
            if (q->rx_got == q->rx_hdr.nbytes) {
                end_payload(e, peer);
                continue;
            }
            /* The staging buffer is empty. A large rest goes straight to its buffer. */
            left = q->rx_hdr.nbytes - q->rx_got;
            if (q->rx_dst && left >= STAGE_BYTES / 4) {
                ssize_t n = recv(q->fd, q->rx_dst + q->rx_got, (size_t)left, MSG_DONTWAIT);
                if (n > 0) {
                    q->rx_got += n;
                    continue;
                }
                if (n == 0) return 1;
                return errno == EAGAIN || errno == EINTR ? 0 : 1;
            }
        }
        if (q->stage_pos < q->stage_len) continue;
        return 0;
    }
}

/* Read what peer has sent: 0, or -1 once its connection closed or broke (handled). */
void hvdl__p2p_read_peer(engine_t *e, int peer) {
    ppeer_t *q = &e->p2p->peers[peer];
    for (;;) {
        q->stage_pos = q->stage_len = 0;
        int rc = parse(e, peer);
        if (rc < 0) return;
        ssize_t n = rc ? 0 : recv(q->fd, q->stage, STAGE_BYTES, MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
        if (n <= 0) {                               /* closed or broken */
            /* what the peer put in its mailbox before it closed is delivered too */
            if (hvdl__p2p_mb_drain(e, peer)) return;
            q->closed = 1;
            pthread_mutex_lock(&q->smu);            /* callers queue sends under it */
            int waiting = q->recvs.head || q->sends.head || q->rx_into || q->rts_wait.head ||
                          q->awaiting.head || q->rx_ring_msg;
            pthread_mutex_unlock(&q->smu);
            if (waiting && atomic_load(&q->left)) {
                hvdl_wakefd_signal(e->p2p->wake_fd);  /* it left: its ops end, naming it */
            } else if (waiting) {
                char why[200];
                snprintf(why, sizeof why, "its point-to-point connection closed%s%s",
                         n < 0 ? ": " : "", n < 0 ? strerror(errno) : "");
                hvdl__p2p_report_lost(e, peer, why);
            }
            return;
        }
        q->stage_len = n;
        q->stage_pos = 0;
        if (parse(e, peer) < 0) return;
        if (n < STAGE_BYTES) return;                /* drained */
    }
}
