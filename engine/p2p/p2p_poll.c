/*
 * The waiting caller reads. Between ranks whose pair has no mailbox (other nodes, or
 * HOROVODLIKE_P2P_MAILBOX=0), the caller waiting on a send or recv with that peer reads
 * the pair's connection itself while it looks (hvdl__p2p_poll, from hvdl__engine_wait),
 * the way a recv's caller polls the mailbox on one node: a message goes from the socket
 * to the recv's buffer on the caller's thread, and a CTS it reads is answered by its
 * own write of the payload (hvdl__p2p_caller_flush). Meanwhile the p2p thread does not watch that
 * connection for input: its epoll set (hvdl__p2p_arm_locked) drops EPOLLIN while the connection
 * has readers and takes it back when the last one stops, which epoll_ctl does without
 * waking the thread, and which wakes it at once if input came meanwhile. So a message
 * wakes no thread where a caller waits for it, and is read by the thread where none
 * does (an op polled with hvd.poll, or one whose caller went to sleep). One reader at
 * a time (rmu: a second caller's look skips its turn); the same parser checks every
 * frame whoever reads it; a connection that closes or a malformed frame is reported by
 * whichever thread read it (hvdl__p2p_report_lost).
 */
#define _GNU_SOURCE
#include "p2p_internal.h"

/* A send whose receiver may read it from this process's memory (an RTSA): its FIN comes
 * through the receiver's mailbox to this rank, which its waiting caller polls. */
static int cma_send(engine_t *e, const op_t *o) {
    return o->meta.op == HVDL_OP_SEND && e->cfg.p2p_cma && o->nbytes > e->cfg.p2p_eager_bytes;
}

/* How much longer than a small message's the waiting caller of o looks: a send read by
 * its receiver waits at least for that copy (about 4 GB/s, capped at 4 ms), and a sleep
 * and wake-up would cost it as much again as the copy of a 1 MiB message. A caller that
 * reads its peer's connection itself (owns_reads) looks for about the time TCP takes to
 * move the message through the kernel (1 us per 2 KiB, about 2 GB/s), but at most 1 ms:
 * past that one wake-up is a small part of the wait, and a spinning caller holds a core
 * that the kernel's own work for the connection may need (measured: docs/benchmarks.md,
 * "The waiting caller reads the connection"). */
int hvdl__p2p_look_us(engine_t *e, const op_t *o) {
    if (!e->p2p) return 0;
    int own = (o->meta.op == HVDL_OP_SEND || o->meta.op == HVDL_OP_RECV) &&
              e->p2p->peers[o->meta.root_rank].own;
    if (!own && !cma_send(e, o)) return 0;
    int64_t us = own ? o->nbytes >> 11 : o->nbytes >> 12, cap = own ? 1000 : 4000;
    return us > cap ? (int)cap : (int)us;
}

/* The waiting caller reads (between nodes, or wherever the pair has no mailbox). The
 * waiting caller of a send or recv with a peer whose connection it owns reads that
 * connection itself while it looks (hvdl__engine_wait): a message then goes from the
 * socket into the recv's buffer on the caller's thread, with no thread woken and no
 * hand-off; a CTS it reads is answered by its own write of the payload. While it
 * looks, the p2p thread does not watch the connection for input (readers; hvdl__p2p_arm_locked
 * takes the connection out of the thread's epoll set for input without waking it), so
 * a message does not wake both. When the last reader stops (its op done, or going to
 * sleep on it) the thread watches again, and what came meanwhile wakes it at once: it
 * reads whatever no caller waits for, so no posting order deadlocks. Reading is under
 * rmu, as the thread's: one reader at a time (a second caller's look skips a turn),
 * and frames are parsed and checked by the same code (parse, hvdl__p2p_header_problem). */
static int owns_reads(engine_t *e, const op_t *o) {
    return (o->meta.op == HVDL_OP_SEND || o->meta.op == HVDL_OP_RECV) &&
           e->p2p->peers[o->meta.root_rank].own;
}

/* The waiting caller of a recv from a peer on this node polls the peer's mailbox itself
 * (hvdl__engine_wait): a message then moves with no wake-up and no system call. While
 * it polls, the mailbox's POLLING count says so, and the sender rings (F_BELL over the
 * connection, which wakes the p2p thread) only when nobody polls. Between nodes, the
 * caller reads the connection (owns_reads). */
int hvdl__p2p_poll_begin(engine_t *e, const op_t *o) {
    struct p2p *p = e->p2p;
    if (!p || atomic_load(&o->done)) return 0;
    if (owns_reads(e, o)) {
        ppeer_t *q = &p->peers[o->meta.root_rank];
        pthread_mutex_lock(&q->smu);
        atomic_fetch_add(&q->readers, 1);
        hvdl__p2p_arm_locked(p, q, o->meta.root_rank);
        pthread_mutex_unlock(&q->smu);
        return 1;
    }
    if (!(o->meta.op == HVDL_OP_RECV || cma_send(e, o))) return 0;
    ppeer_t *q = &p->peers[o->meta.root_rank];
    if (!atomic_load(&q->mrx_live)) return 0;
    atomic_fetch_add(hvdl__p2p_mbox_word(&q->mrx, MBOX_POLLING), 1);
    return 1;
}

/* One look: takes what the mailbox (or the connection) holds, unless another thread is
 * at it. */
void hvdl__p2p_poll(engine_t *e, const op_t *o) {
    int peer = o->meta.root_rank;
    ppeer_t *q = &e->p2p->peers[peer];
    if (owns_reads(e, o)) {
        if (pthread_mutex_trylock(&q->rmu)) return;
        int was = atomic_load(&q->closed);
        if (!was) hvdl__p2p_read_peer(e, peer);
        int closed = !was && atomic_load(&q->closed);
        if (!q->caller_read && atomic_load(&o->done) && o->status == HVDL_OK) {
            q->caller_read = 1;
            hvdl__log(e, HVDL_LOG_DEBUG,
                      "point-to-point messages with rank %d are read by the waiting caller", peer);
        }
        pthread_mutex_unlock(&q->rmu);
        hvdl__p2p_caller_flush(e, peer);
        /* the thread ends what waits on a closed connection (after a shutdown) */
        if (closed) hvdl_wakefd_signal(e->p2p->wake_fd);
        return;
    }
    if (!atomic_load(&q->mrx_live)) return;
    /* a hint only (the peer could write the head word): the drain checks for itself */
    if (atomic_load_explicit(hvdl__p2p_mbox_word(&q->mrx, MBOX_TAIL), memory_order_acquire) ==
        atomic_load_explicit(hvdl__p2p_mbox_word(&q->mrx, MBOX_HEAD), memory_order_relaxed))
        return;
    if (pthread_mutex_trylock(&q->rmu)) return;
    hvdl__p2p_mb_drain(e, peer);
    pthread_mutex_unlock(&q->rmu);
    hvdl__p2p_caller_flush(e, peer);
}

/* The caller stops polling (its op is done, or it goes to sleep). A record put while
 * it polled rang no bell: after the count drops (seq_cst, against the sender's store of
 * the tail and load of the count) one more look takes it, waiting for rmu if need be.
 * A connection's last reader gives its input back to the thread (hvdl__p2p_arm_locked). */
void hvdl__p2p_poll_end(engine_t *e, const op_t *o) {
    int peer = o->meta.root_rank;
    ppeer_t *q = &e->p2p->peers[peer];
    if (owns_reads(e, o)) {
        pthread_mutex_lock(&q->smu);
        atomic_fetch_sub(&q->readers, 1);
        hvdl__p2p_arm_locked(e->p2p, q, peer);
        pthread_mutex_unlock(&q->smu);
        return;
    }
    atomic_fetch_sub(hvdl__p2p_mbox_word(&q->mrx, MBOX_POLLING), 1);
    if (atomic_load(hvdl__p2p_mbox_word(&q->mrx, MBOX_TAIL)) ==
        atomic_load(hvdl__p2p_mbox_word(&q->mrx, MBOX_HEAD)))
        return;
    pthread_mutex_lock(&q->rmu);
    hvdl__p2p_mb_drain(e, peer);
    pthread_mutex_unlock(&q->rmu);
    hvdl__p2p_caller_flush(e, peer);
}
