/*
 * The point-to-point thread: one epoll set over the wake-up fd and every peer's
 * connection. It reads what no waiting caller reads, writes what a caller's send
 * left (the socket was full, or earlier sends were queued), fails what waits once
 * the job fails, and runs the stall inspector. Idle (no op pending), it sleeps
 * without a timeout; with ops pending, it looks at the failure flag ten times a
 * second. Also its start, stop and free, and the goodbye (F_BYE) that a rank
 * shutting down queues to each peer (hvdl__p2p_leave).
 *
 * Shutdown: a rank's shutdown is its own (control/shutdown.c). It queues F_BYE to each
 * peer behind what it sent (hvdl__p2p_leave), and this thread serves on until the job
 * ends, so what it sent or announced is still delivered; a peer's goodbye ends its ops
 * that can no longer complete (p2p_read.c, "Leaving"). When the job ends, a rank
 * half-closes its connections after its last byte; once the loop has ended, an op
 * waiting on a peer whose connection closed fails naming that peer (nothing else would
 * tell it: the loop thread, which turns a closed connection into a lost peer, is gone).
 */
#define _GNU_SOURCE
#include "p2p_internal.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define WAKE_EV UINT32_MAX                  /* the epoll set's tag for wake_fd */

/* With q->smu held: make the thread's epoll set watch q's connection for what it needs
 * now: input unless a waiting caller reads it (readers), output while something is
 * queued to write. A closed connection leaves the set. epoll_ctl changes what a thread
 * asleep in epoll_wait watches without waking it, and wakes it when the new events are
 * already there, so input left unread when the last reader stops is read at once. */
void hvdl__p2p_arm_locked(struct p2p *p, ppeer_t *q, int peer) {
    if (!q->in_ep) return;
    if (atomic_load(&q->closed)) {
        epoll_ctl(p->ep, EPOLL_CTL_DEL, q->fd, NULL);
        q->in_ep = 0;
        return;
    }
    uint32_t ev = (atomic_load(&q->readers) ? 0 : EPOLLIN) |
                  (q->cur || q->ctl.head || (q->sends.head && !q->blocked) ? EPOLLOUT : 0);
    struct epoll_event x = {.events = ev, .data.u32 = (uint32_t)peer};
    if (ev != q->armed && epoll_ctl(p->ep, EPOLL_CTL_MOD, q->fd, &x) == 0) q->armed = ev;
}

static void *p2p_main(void *arg) {
    engine_t *e = arg;
    struct p2p *p = e->p2p;
    int n = e->size;
    struct epoll_event *evs = calloc((size_t)n + 1, sizeof *evs);
    /* Without its table the thread fails every op and still sleeps (on one event at a
     * time, which is all wake_fd needs) rather than spinning. */
    struct epoll_event one, *ev = evs ? evs : &one;
    int max_ev = evs ? n + 1 : 1;
    int gave_up = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        int stop = p->stop;
        pthread_mutex_unlock(&p->mu);
        /* The job shut down (its loop ended without a failure): recvs still run here, so
         * that a message sent before a rank's shutdown is delivered (a send completes
         * eagerly, as MPI's and Horovod's users expect); see hvdl__p2p_enqueue. */
        pthread_mutex_lock(&e->mu);
        int failed = e->failed, status = e->fail_status;
        int over = e->shutdown_requested && !failed;
        char msg[HVDL_MSG_BYTES];
        if (failed) snprintf(msg, sizeof msg, "%s", e->fail_msg);
        pthread_mutex_unlock(&e->mu);
        if (!stop) hvdl__p2p_finish_closed_peers(e, over);
        if (failed || stop || !evs) {
            gave_up = 1;
            if (failed) hvdl__p2p_fail_all(e, status, msg);
            else if (stop)
                hvdl__p2p_fail_all(e, HVDL_ERR_SHUT_DOWN,
                                   "horovodlike was shut down before this "
                                   "point-to-point op finished");
            else
                hvdl__p2p_fail_all(e, HVDL_ERR_SYSTEM,
                                   "out of memory for the point-to-point thread");
            if (stop) break;
        }
        /* What each connection is watched for; after giving up, nothing but wake_fd. */
        for (int i = 0; i < n; i++) {
            ppeer_t *q = &p->peers[i];
            pthread_mutex_lock(&q->smu);
            if (gave_up && q->in_ep) {
                epoll_ctl(p->ep, EPOLL_CTL_DEL, q->fd, NULL);
                q->in_ep = 0;
            }
            hvdl__p2p_arm_locked(p, q, i);
            pthread_mutex_unlock(&q->smu);
        }
        /* Ops waiting: look at the engine's failure flag ten times a second. Idle, sleep
         * until a message, a new op or the stop arrives: an idle engine costs nothing. */
        int pending = atomic_load(&p->npending);
        if (!pending) {                             /* seq_cst: see hvdl__p2p_enqueue */
            atomic_store(&p->sleeping, 1);
            pending = atomic_load(&p->npending);
        }
        int rc = epoll_wait(p->ep, ev, max_ev, pending ? 100 : -1);
        atomic_store(&p->sleeping, 0);
        for (int j = 0; j < rc; j++) {
            uint32_t i = ev[j].data.u32, got = ev[j].events;
            if (i == WAKE_EV) {
                hvdl_wakefd_drain(p->wake_fd);
                continue;
            }
            if (i >= (uint32_t)n || gave_up) continue;
            ppeer_t *q = &p->peers[i];
            /* Input a waiting caller is reading (it came before the caller took the
             * reads over) is the caller's; a hang-up or error is read by either. What
             * was read may have queued control frames, or freed a slot of the ring. */
            if (!q->closed &&
                ((got & (EPOLLHUP | EPOLLERR)) || ((got & EPOLLIN) && !atomic_load(&q->readers)))) {
                pthread_mutex_lock(&q->rmu);
                hvdl__p2p_read_peer(e, (int)i);
                pthread_mutex_unlock(&q->rmu);
            }
            if (!q->closed) hvdl__p2p_write_peer(e, (int)i);
        }
        if (!gave_up) hvdl__p2p_stall_check(e, hvdl_now());
    }
    free(evs);
    return NULL;
}

int hvdl__p2p_start(engine_t *e) {
    /* connected by now: out of memory is told to every rank (fail.c) */
    struct p2p *p = HVDL_INJECT(e, INJ_START_ALLOC) ? NULL : calloc(1, sizeof *p);
    if (!p || !(p->peers = calloc((size_t)e->size, sizeof *p->peers))) {
        free(p);
        return hvdl__oom(e, "point-to-point state", (int64_t)sizeof *p->peers * e->size);
    }
    pthread_mutex_init(&p->mu, NULL);
    atomic_store(&p->lost_peer, -1);
    p->budget = hvdl__credit_budget(e->cfg.p2p_unexpected_bytes, e->cfg.p2p_announced_bytes,
                                    e->cfg.p2p_eager_bytes, HVDL_MAX_NAME);
    p->wake_fd = hvdl_wakefd_open();
    p->ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event w = {.events = EPOLLIN, .data.u32 = WAKE_EV};
    int bad = p->wake_fd < 0 || p->ep < 0 || epoll_ctl(p->ep, EPOLL_CTL_ADD, p->wake_fd, &w);
    for (int i = 0; i < e->size; i++) {
        ppeer_t *q = &p->peers[i];
        pthread_mutex_init(&q->smu, NULL);
        pthread_mutex_init(&q->rmu, NULL);
        q->mtx.fd = q->mrx.fd = -1;
        q->fd = e->peers[i].p2p_fd;
        e->peers[i].p2p_fd = -1;                    /* this file owns it now */
        q->tx.fd = q->rx.fd = -1;                   /* no rings yet */
        /* a pair with a mailbox (one node) is polled there; elsewhere the connection */
        q->own = !(e->cfg.p2p_mailbox && !strcmp(e->peers[i].host, e->host));
        struct epoll_event x = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        if (q->fd >= 0 && !bad) {
            bad = epoll_ctl(p->ep, EPOLL_CTL_ADD, q->fd, &x);
            q->in_ep = !bad;
            q->armed = EPOLLIN;
        }
    }
    e->p2p = p;
    if (bad || pthread_create(&p->thread, NULL, p2p_main, e)) return -1;
    p->started = 1;
    return 0;
}

/* From any thread, once the job has failed: the p2p thread looks at the failure flag now
 * and fails what it holds (it looks by itself only every 100 ms while ops wait). wake_fd
 * is set before any thread starts and closed only after every thread has ended. */
void hvdl__p2p_kick(engine_t *e) {
    if (e->p2p && e->p2p->wake_fd >= 0) hvdl_wakefd_signal(e->p2p->wake_fd);
}

/* This rank shuts down: F_BYE to every peer, behind what it sent (p2p_read.c, "Leaving"). */
void hvdl__p2p_leave(engine_t *e) {
    struct p2p *p = e->p2p;
    if (!p || !p->started) return;
    for (int i = 0; i < e->size; i++) {
        ppeer_t *q = &p->peers[i];
        pmsg_t *m = i == e->rank || q->fd < 0 ? NULL : calloc(1, sizeof *m);
        if (!m) continue;    /* no memory: the peer learns it when the connection ends */
        m->kind = K_BYE;
        m->peer = i;
        m->hdr.magic = F_BYE;
        m->started = hvdl_now();
        pthread_mutex_lock(&q->smu);
        push(&q->sends, m);
        if (!q->closed && q->sends.head == m) hvdl__p2p_write_locked(e, i);
        pthread_mutex_unlock(&q->smu);
    }
    hvdl_wakefd_signal(p->wake_fd);
}

/* After the loop thread has ended: every op still held fails as shut down. */
void hvdl__p2p_stop(engine_t *e) {
    struct p2p *p = e->p2p;
    if (!p || !p->started) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_mutex_unlock(&p->mu);
    hvdl_wakefd_signal(p->wake_fd);
    pthread_join(p->thread, NULL);
    p->started = 0;
    /* Every message this rank sent is in the kernel by now (what was not failed above):
     * end each connection after it, so that a peer's recv of a message never sent fails
     * at once, naming this rank, even while this process lives on. */
    for (int i = 0; i < e->size; i++)
        if (p->peers[i].fd >= 0) shutdown(p->peers[i].fd, SHUT_WR);
}

void hvdl__p2p_free(engine_t *e) {
    struct p2p *p = e->p2p;
    if (!p) return;
    hvdl__p2p_stop(e);
    for (int i = 0; i < e->size; i++) {
        ppeer_t *q = &p->peers[i];
        if (q->fd >= 0) close(q->fd);
        for (pmsg_t *m = q->unexpected.head, *nx; m; m = nx) {
            nx = m->next;
            free(m->name);
            free(m->data);
            free(m);
        }
        if (q->rx_into && !q->rx_into->op) {
            free(q->rx_into->name);
            free(q->rx_into->data);
            free(q->rx_into);
        }
        hvdl__p2p_fail_list(e, &q->ctl, HVDL_ERR_SHUT_DOWN, "");   /* control frames: freed */
        hvdl__p2p_fail_list(e, &q->awaiting, HVDL_ERR_SHUT_DOWN, "");
        hvdl__p2p_ring_close(&q->tx);
        hvdl__p2p_ring_close(&q->rx);
        hvdl__p2p_ring_close(&q->mtx);
        hvdl__p2p_ring_close(&q->mrx);
        pthread_mutex_destroy(&q->smu);
        pthread_mutex_destroy(&q->rmu);
    }
    if (p->wake_fd >= 0) close(p->wake_fd);
    if (p->ep >= 0) close(p->ep);
    pthread_mutex_destroy(&p->mu);
    free(p->peers);
    free(p);
    e->p2p = NULL;
}

/* In a child forked while the engine runs (api.c): close the child's copies of the p2p
 * sockets and wake-up fd, so that only the parent holds the connections; nothing else is
 * touched (the parent's threads, and their locks, do not exist in the child). */
void hvdl__p2p_close_in_child(engine_t *e) {
    struct p2p *p = e->p2p;
    if (!p) return;
    for (int i = 0; p->peers && i < e->size; i++) {
        if (p->peers[i].fd >= 0) close(p->peers[i].fd);
        if (p->peers[i].tx.fd >= 0) close(p->peers[i].tx.fd);
        if (p->peers[i].mtx.fd >= 0) close(p->peers[i].mtx.fd);
    }
    if (p->wake_fd >= 0) close(p->wake_fd);
    if (p->ep >= 0) close(p->ep);
}
