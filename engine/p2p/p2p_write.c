/*
 * Writing a peer's connection, under its smu, by the caller sending (when its message
 * is the only one queued) or by the p2p thread: each send frame by frame, in order,
 * with a control frame first whenever no frame is half written (p2p_rendezvous.c says
 * why); an announcement through the mailbox when it is live (p2p_mailbox.c). One
 * sendmsg per frame (header, name and payload in one call), straight from the
 * caller's buffer.
 */
#define _GNU_SOURCE
#include "p2p_internal.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

/* A control frame (CTS, ACK, RING*) to the peer, written before the next send's frame.
 * With q->smu held; 0, or -1 when out of memory (the job fails: a peer would wait). */
int hvdl__p2p_queue_ctl(engine_t *e, int peer, const p2p_hdr_t *h, const char *name) {
    ppeer_t *q = &e->p2p->peers[peer];
    pmsg_t *c = calloc(1, sizeof *c);
    char *nm = name ? strdup(name) : NULL;
    if (!c || (name && !nm)) {
        free(c);
        free(nm);
        hvdl__fail(e, HVDL_ERR_SYSTEM,
                   "rank %d (host %s) failed: out of memory for a point-to-point control frame",
                   e->rank, e->host);
        return -1;
    }
    c->kind = K_CTL;
    c->peer = peer;
    c->fhdr = *h;
    c->name = nm;
    push(&q->ctl, c);
    return 0;
}

int hvdl__p2p_queue_ctl_locked(engine_t *e, int peer, const p2p_hdr_t *h, const char *name) {
    ppeer_t *q = &e->p2p->peers[peer];
    pthread_mutex_lock(&q->smu);
    int rc = hvdl__p2p_queue_ctl(e, peer, h, name);
    pthread_mutex_unlock(&q->smu);
    return rc;
}

/* With q->smu held: set up m's next frame (fhdr, and for a PIECE its copy into the ring).
 * 0, or 1 when it must wait for a free slot. */
static int begin_frame(ppeer_t *q, pmsg_t *m) {
    m->off = 0;
    m->framed = 1;
    if (m->kind != K_CTL) m->fhdr = m->hdr;         /* a control frame's is set up already */
    if (m->kind == K_CTL && m->fhdr.magic == F_ACK) atomic_fetch_add(&q->acks_out, 1);
    switch (m->kind) {
    case K_RTS: m->fhdr.magic = F_RTS; return 0;
    case K_DATA: m->fhdr.magic = F_DATA; return 0;
    case K_SDATA:
        if (m->moved == 0 && m->piece == 0) {       /* first its header */
            m->fhdr.magic = F_SDATA;
            m->piece = -1;
            return 0;
        }
        if (q->tx_pieces - q->tx_acked >= q->tx.nslots) {
            m->framed = 0;
            return 1;
        }
        int64_t n = m->hdr.nbytes - m->moved;
        if (n > q->tx.slot_bytes) n = q->tx.slot_bytes;
        memcpy(hvdl__p2p_ring_slot(&q->tx, q->tx_pieces), (const uint8_t *)m->op->input + m->moved,
               (size_t)n);
        q->tx_pieces++;
        m->piece = n;
        m->fhdr = (p2p_hdr_t){.magic = F_PIECE, .nbytes = n};
        return 0;
    }
    return 0;                                       /* K_EAGER: the header as it is */
}

/* The frame m was writing has gone out: 1 when m is done with (off its list). */
static int end_frame(engine_t *e, ppeer_t *q, pmsg_t *m) {
    m->framed = 0;
    if (m->kind == K_SWITCH) {                      /* what follows goes by the mailbox */
        unlink_msg(&q->sends, m);
        free(m);
        q->mb_state = MB_LIVE;
        return 1;
    }
    if (m->kind == K_CTL) {
        unlink_msg(&q->ctl, m);
        free(m->name);
        free(m);
        return 1;
    }
    if (m->kind == K_BYE) {                   /* the peer knows now: see p2p_read.c, "Leaving" */
        unlink_msg(&q->sends, m);
        free(m);
        return 1;
    }
    if (m->kind == K_RTS) {                         /* it waits for the CTS, out of the way */
        unlink_msg(&q->sends, m);
        if (atomic_load(&q->left)) hvdl__p2p_finish_closed(e, m, 1);   /* no CTS will come */
        else push(&q->rts_wait, m);
        return 1;
    }
    if (m->kind == K_SDATA) {
        if (m->piece > 0) m->moved += m->piece;
        m->piece = -1;
        if (m->moved < m->hdr.nbytes) return 0;
    }
    unlink_msg(&q->sends, m);                       /* its bytes are out: done */
    hvdl__p2p_finish(e, m, HVDL_OK, NULL);
    return 1;
}

/* With q->smu held: write what the socket takes, frame by frame; a control frame goes
 * first whenever no frame is half written, so that acknowledgements and clear-to-sends
 * never wait behind a ring message waiting for them. */
void hvdl__p2p_write_locked(engine_t *e, int peer) {
    ppeer_t *q = &e->p2p->peers[peer];
    for (;;) {
        pmsg_t *m = q->cur;
        if (!m) {
            m = q->ctl.head ? q->ctl.head : q->sends.head;
            if (!m) return;
            if (!m->framed && q->mb_state == MB_LIVE && (m->kind == K_EAGER || m->kind == K_RTS)) {
                int bell = 0, rc = hvdl__p2p_mb_put(q, m, e->cfg.p2p_cma, &bell);
                if (rc < 0) {
                    hvdl__p2p_report_lost(e, peer,
                                          "broke its point-to-point mailbox (its head moved "
                                          "out of range)");
                    return;
                }
                if (rc > 0) {
                    q->blocked = 1;                 /* a ROOM resumes it */
                    return;
                }
                p2p_hdr_t b = {.magic = F_BELL};
                if (bell && hvdl__p2p_queue_ctl(e, peer, &b, NULL)) return;
                m->framed = 1;                      /* its announcement is out */
                end_frame(e, q, m);
                continue;
            }
            if (!m->framed && begin_frame(q, m)) {
                q->blocked = 1;                     /* an ACK resumes it */
                return;
            }
            q->cur = m;
        }
        int64_t hl = (int64_t)sizeof m->fhdr, nl = m->fhdr.name_len;
        int64_t pl = m->fhdr.magic == P2P_MAGIC || m->fhdr.magic == F_DATA ? m->hdr.nbytes : 0;
        const char *name = m->op ? m->op->name : m->name;
        int64_t total = hl + nl + pl, off = m->off;
        struct iovec iov[3];
        int k = 0;
        if (off < hl) iov[k++] = (struct iovec){(uint8_t *)&m->fhdr + off, (size_t)(hl - off)};
        if (nl && off < hl + nl) {
            int64_t o2 = off > hl ? off - hl : 0;
            iov[k++] = (struct iovec){(char *)name + o2, (size_t)(nl - o2)};
        }
        if (pl) {
            int64_t o3 = off > hl + nl ? off - hl - nl : 0;
            iov[k++] = (struct iovec){(uint8_t *)m->op->input + o3, (size_t)(pl - o3)};
        }
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)k};
        ssize_t n = sendmsg(q->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR) return;
            char why[200];
            snprintf(why, sizeof why, "its point-to-point connection broke: %s", strerror(errno));
            hvdl__p2p_report_lost(e, peer, why);
            return;
        }
        m->off += n;
        if (m->off < total) continue;
        q->cur = NULL;
        end_frame(e, q, m);
    }
}

void hvdl__p2p_write_peer(engine_t *e, int peer) {
    ppeer_t *q = &e->p2p->peers[peer];
    pthread_mutex_lock(&q->smu);
    hvdl__p2p_write_locked(e, peer);
    pthread_mutex_unlock(&q->smu);
}

/* On a caller's thread, after it took the peer's receiving side: control frames it
 * queued (a CTS, a ROOM), and sends the frames it read cleared (a CTS answered: DATA),
 * are written now, and what the socket does not take is left to the p2p thread, whose
 * epoll set then watches the connection for room (hvdl__p2p_arm_locked). */
void hvdl__p2p_caller_flush(engine_t *e, int peer) {
    ppeer_t *q = &e->p2p->peers[peer];
    pthread_mutex_lock(&q->smu);
    if (q->ctl.head || q->cur || (q->sends.head && !q->blocked)) {
        if (!q->closed) hvdl__p2p_write_locked(e, peer);
        hvdl__p2p_arm_locked(e->p2p, q, peer);
    }
    pthread_mutex_unlock(&q->smu);
}
