/*
 * One copy (CMA). Between two ranks on one node whose mailbox is live, a large send's
 * record is an RTSA: the RTS and the address of the sender's buffer (kept alive until
 * the send completes). The receiver, when a recv meets it, copies the payload straight
 * from the sender's memory into the recv's buffer with process_vm_readv (the sender's
 * pid is the one the mailbox was attached through, /proc/<pid>/fd), on whichever thread
 * matched it (the waiting caller polling the mailbox, the caller posting the recv, or
 * the p2p thread, under the peer's rmu), then answers FIN: a record in its own mailbox
 * to the sender when that one is live (the sender's waiting caller polls it, as a
 * recv's caller does, for longer: the copy's time), else a frame. No CTS, no ring, no
 * frame per piece. A read the kernel refuses (ptrace rules: Yama's ptrace_scope,
 * another uid, a seccomp filter) before any byte moved turns CMA off for that peer
 * (a warning) and answers CTS: the ring path below. HOROVODLIKE_P2P_CMA=0 sends RTS,
 * not RTSA. The address is the peer's word, and only that peer's own memory is read:
 * the length is the RTSA's checked nbytes (hvdl__p2p_header_problem), and a read that fails or
 * stops short (EFAULT: an address it does not have; ESRCH: it exited) is that peer's
 * fault, named as lost. A stopped sender's memory is still read (the recv completes);
 * a receiver that dies leaves its sender waiting on the FIN, which the connection's
 * close (or the heartbeats) fails, as any rendezvous send.
 *
 * Cost model, one message of n bytes between two ranks on one node, the mailbox live:
 *   rendezvous (CMA) one record each way (RTSA, FIN: no system call when each side's
 *              caller is polling) and one copy, process_vm_readv's, on the receiver,
 *              in the receiver's thread that matched it (no sender thread runs);
 *              one-way time: the copy (about memcpy's bandwidth, plus pinning the
 *              sender's pages) + the polls' latency. A caller that has stopped polling
 *              (past HOROVODLIKE_SPIN_US, or the FIN's wait: SPIN_US + 1 us per 4 KiB,
 *              capped at 4 ms) costs a bell and two wake-ups. Measured:
 *              docs/benchmarks.md, "One copy".
 */
#define _GNU_SOURCE
#include "p2p_internal.h"
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>

/* With q->rmu held: copy n bytes at addr in peer's memory (an RTSA) into dst, straight
 * from the sender's buffer (process_vm_readv; the sender keeps it until the FIN). 0 done,
 * 1 not permitted (ptrace rules, seccomp: the ring is used from now on), -1 the peer is
 * reported (it died, or announced memory it does not have: a protocol error). */
int hvdl__p2p_cma_read(engine_t *e, int peer, uint8_t *dst, uint64_t addr, int64_t n,
                       const char *name, char *why, size_t cap) {
    ppeer_t *q = &e->p2p->peers[peer];
    int64_t got = 0;
    while (got < n) {
        struct iovec l = {dst + got, (size_t)(n - got)};
        struct iovec rv = {(void *)(uintptr_t)(addr + (uint64_t)got), (size_t)(n - got)};
        /* a peer whose connection closed has exited, or soon will: its pid may be
         * another process's by now, and its buffer is no longer kept for this read */
        ssize_t k = atomic_load(&q->closed) ? (errno = ESRCH, -1)
                    : q->mrx_pid > 0        ? process_vm_readv((pid_t)q->mrx_pid, &l, 1, &rv, 1, 0)
                                            : (errno = EPERM, -1);
        if (k > 0) {
            got += k;
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        int err = k < 0 ? errno : EFAULT;           /* 0 bytes: nothing more to read there */
        if (got == 0 && q->cma == 0 && (err == EPERM || err == EACCES || err == ENOSYS)) {
            q->cma = -1;
            hvdl__log(e, HVDL_LOG_WARNING,
                      "large point-to-point messages from rank %d go through the shared-memory "
                      "ring: cannot read its memory (%s)",
                      peer, strerror(err));
            return 1;
        }
        if (err == ESRCH)
            snprintf(why, cap, "exited while rank %d read its message '%.64s'", e->rank, name);
        else
            snprintf(why, cap,
                     "announced a point-to-point message '%.64s' of %lld bytes that rank %d "
                     "cannot read from its memory (%s after %lld bytes)",
                     name, (long long)n, e->rank, strerror(err), (long long)got);
        atomic_store(&q->mrx_live, 0);              /* nothing more is taken from it */
        hvdl__p2p_report_lost(e, peer, why);
        return -1;
    }
    if (!q->cma)
        hvdl__log(e, HVDL_LOG_DEBUG,
                  "large point-to-point messages from rank %d are read straight from its "
                  "memory",
                  peer);
    q->cma = 1;
    return 0;
}

/* A FIN record in the peer's mailbox (taken with q->rmu held). */
int hvdl__p2p_fin_arrived(engine_t *e, int peer, const p2p_hdr_t *h, const char *name) {
    ppeer_t *q = &e->p2p->peers[peer];
    pthread_mutex_lock(&q->smu);
    const char *bad = hvdl__p2p_rts_answered(e, peer, h, name);
    pthread_mutex_unlock(&q->smu);
    return bad ? hvdl__p2p_violation(e, peer, bad) : 0;
}

/* The receiver has read an RTSA's payload: FIN to its sender, through this rank's
 * mailbox to it when live (its waiting caller polls that: no wake-up), else (or full)
 * over the connection. 0, or -1 when out of memory (the job fails). */
int hvdl__p2p_send_fin(engine_t *e, int peer, const p2p_hdr_t *h, const char *name) {
    ppeer_t *q = &e->p2p->peers[peer];
    p2p_hdr_t f = *h, b = {.magic = F_BELL};
    f.magic = F_FIN;
    pthread_mutex_lock(&q->smu);
    int bell = 0,
        rc = q->mb_state == MB_LIVE ? hvdl__p2p_mb_put_rec(q, &f, name, NULL, 0, &bell) : 1;
    rc = rc     ? hvdl__p2p_queue_ctl(e, peer, &f, name)
         : bell ? hvdl__p2p_queue_ctl(e, peer, &b, NULL)
                : 0;
    pthread_mutex_unlock(&q->smu);
    return rc;
}
