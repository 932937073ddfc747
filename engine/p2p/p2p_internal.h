/*
 * The point-to-point channel's state (engine/p2p/), shared by its files, one job each:
 *   p2p.c             the API: a send or a recv posted on the caller's thread, its checks
 *   p2p_frames.c      the frames and the mailbox's records: pure checks (p2p_frames.h)
 *   p2p_complete.c    completion and failure: an op ends, a peer is reported lost
 *   p2p_match.c       a recv meets what came: delivered, or waiting among the posted
 *   p2p_rendezvous.c  large messages: RTS, CTS, DATA, and the ring's pieces
 *   p2p_cma.c         one copy: a large message read from the sender's memory (RTSA, FIN)
 *   p2p_mailbox.c     the mailbox: announcements and small messages in shared memory
 *   p2p_read.c        reading a connection: the frames' state machine
 *   p2p_write.c       writing a connection: frames in order, control frames first
 *   p2p_poll.c        the waiting caller: polls the mailbox, or reads the connection
 *   p2p_stall.c       the stall inspector
 *   p2p_thread.c      the p2p thread (one epoll set), its start and stop
 *   p2p_ring.c        the shared-memory segment under a ring or a mailbox
 *   p2p_credit.c      what a peer may make this rank hold: eager credit, announcements
 * The engine sees p2p.h only; functions that one file here calls in another are
 * hvdl__p2p_x, declared below by the file that defines them.
 *
 * Threads and who owns what. Three kinds of thread touch this state: callers (posting a
 * send or a recv, and polling while they wait for one), the p2p thread, and the thread
 * that starts and stops the engine. Each field below says which lock or thread owns it:
 *   - set up at start (hvdl__p2p_start), before the p2p thread runs, and read-only
 *     afterwards: any thread reads them without a lock; closed by hvdl__p2p_free once
 *     every thread has ended;
 *   - a peer's smu: its sending side (the queues, the frame half written, the ring and the
 *     mailbox it writes), taken by a caller sending and by the p2p thread writing;
 *   - a peer's rmu: its receiving side (posted recvs, unexpected messages, the reader's
 *     state), taken by the p2p thread, by a caller posting a recv (on the caller's
 *     thread, without waking the p2p thread) and by a polling caller;
 *   - struct p2p's mu: the stop flag;
 *   - atomics: flags and counts read across threads without a lock (seq_cst unless the
 *     access says why it is weaker).
 * A pmsg is on one list at a time and belongs to that list's lock (sends, ctl, rts_wait
 * and cur: smu; recvs, unexpected, awaiting, rx_into and rx_ring_msg: rmu); it moves
 * from one list to another only under the locks of both (the same lock, in practice),
 * and hvdl__p2p_finish frees it once it is off every list.
 * Lock order: rmu, then smu, then the engine's mu (engine.h).
 * The tests/c run under TSan checks these rules (tests/test_c_engine.py).
 */
#ifndef HVDL_P2P_INTERNAL_H
#define HVDL_P2P_INTERNAL_H
#include "fail.h"
#include "net.h"
#include "p2p.h"
#include "p2p_credit.h"
#include "p2p_frames.h"
#include "p2p_ring.h"

#define STAGE_BYTES (64 * 1024)
#define RING_SLOTS 8                     /* pieces in flight per pair */

/* What a pmsg is: a send (by the frames it goes out as), a control frame, or what the
 * receiver holds. */
enum {
    K_EAGER,
    K_RTS,
    K_DATA,
    K_SDATA,
    K_CTL,
    K_SWITCH, /* F_SWITCH, in the send queue (no op) */
    K_BYE,    /* F_BYE, in the send queue (no op) */
    K_RECV,
    K_UNEXPECTED,
    K_UNEXPECTED_RTS,
    K_AWAIT
};
/* The sender's mailbox to a peer (under smu): none yet, offered, accepted (F_SWITCH
 * queued), live (F_SWITCH written: announcements go through it), refused or failed. */
enum { MB_NONE, MB_OFFERED, MB_SWITCHING, MB_LIVE, MB_OFF };

/* A message in flight: a send being written, a recv waiting, an unexpected message (or
 * the announcement of one, RTS), a recv cleared to come (awaiting its payload), or a
 * control frame to write. Owned by the list that holds it (above). */
typedef struct pmsg {
    op_t *op;                /* NULL: unexpected, control frame, or a payload to discard */
    int peer;
    int kind;                /* K_* */
    p2p_hdr_t hdr;           /* sends: what goes out; received: what came in */
    char *name;              /* owned when op is NULL (ops use op->name) */
    uint8_t *data;           /* unexpected: the buffered payload (owned); K_AWAIT: where
                                the payload goes (the recv's, NULL: discarded) */
    int64_t off;             /* sends: bytes written of the current frame */
    p2p_hdr_t fhdr;          /* sends: the current frame's header */
    int framed;              /* sends: fhdr is set up (the frame has begun) */
    int64_t moved;           /* SDATA: payload bytes put into the ring */
    int64_t piece;           /* SDATA: bytes in the current PIECE frame (0: the header) */
    uint64_t addr;           /* K_UNEXPECTED_RTS from an RTSA: the payload in the sender */
    double started, warned;  /* set when made; warned: the stall inspector's, under the
                                list's lock */
    struct pmsg *next;
} pmsg_t;

typedef struct plist { pmsg_t *head, *tail; } plist_t;

typedef struct ppeer {
    int fd;                  /* set at start (taken from the engine's peer), closed at free */
    /* Between nodes (no mailbox for the pair) the caller waiting on an op with this peer
     * reads the connection itself while it looks ("The waiting caller reads"): own is
     * set at start; readers counts those callers (changed under smu, read lock-free),
     * and while it is not 0 the p2p thread does not watch the connection for input.
     * armed: the events the thread's epoll set watches for this connection, under smu
     * (in_ep 0: not in the set: closed, or the thread gave up). */
    int own;
    int caller_read;         /* a caller's read has completed its op (logged once), rmu */
    atomic_int readers;
    uint32_t armed;
    int in_ep;
    /* Set by the p2p thread (its reads) and by a caller whose send breaks (under smu),
     * read by both: atomic (seq_cst: set once, and a load costs a plain load). */
    atomic_int closed;
    /* The peer's F_BYE has come (p2p_read.c, "Leaving"): set under rmu, read by both
     * sides lock-free; it posts nothing more, and what it sent before has all been seen. */
    atomic_int left;
    /* Sends are written by the caller when its message is the only one queued (no
     * wake-up at all), else by the p2p thread; smu orders them and guards the queue
     * (the fields from here to rmu). */
    pthread_mutex_t smu;
    plist_t sends;           /* FIFO: the head is being written */
    plist_t ctl;             /* control frames: written before the next send's frame */
    plist_t rts_wait;        /* sends announced (RTS), waiting for the peer's CTS */
    pmsg_t *cur;             /* the send or control frame half written, or NULL */
    int blocked;             /* the head send waits for a free slot of the ring */
    /* The ring this rank writes to the peer (same node): 0 none, 1 offered, 2 ready,
     * 3 refused or failed (the payload then goes over the connection). Under smu. */
    int ring_state;
    p2p_ring_t tx;
    int64_t tx_pieces, tx_acked;   /* pieces put in tx, and acknowledged, under smu */
    p2p_credit_t credit;     /* eager credit and announcements (p2p_credit.c): the sender's
                                fields under smu, the receiver's under rmu */
    atomic_llong acks_out;   /* ACKs begun to the peer: counted under smu (p2p_write.c),
                                read under rmu (p2p_rendezvous.c) */
    int mb_state;            /* MB_*, under smu */
    p2p_ring_t mtx;          /* the mailbox this rank writes to the peer, under smu */
    uint64_t mtx_tail;
    /* The receiving side (what follows, to the end): under rmu, taken by the p2p thread
     * when it reads the connection and by a caller that posts a recv or polls the
     * mailbox while it waits. Lock order: rmu, then smu, then the engine's mu. */
    pthread_mutex_t rmu;
    p2p_ring_t mrx;          /* the mailbox the peer writes to this rank */
    uint64_t mrx_head;
    int64_t mrx_pid;         /* the peer's process (checked by the mailbox's attach) */
    int cma;                 /* reading the peer's memory: 0 untried, 1 works, -1 refused */
    /* mrx is mapped and the peer's F_SWITCH has come: callers may poll it (set under
     * rmu once mrx is mapped, cleared when the peer broke its protocol; read lock-free) */
    atomic_int mrx_live;
    char mb_name[HVDL_MAX_NAME + 1];
    plist_t recvs;           /* posted, not matched yet */
    plist_t unexpected;      /* arrived whole (or announced, RTS), no recv yet */
    plist_t awaiting;        /* recvs cleared to come (CTS sent), FIFO per name */
    /* The ring the peer writes to this rank, and the message it is filling */
    p2p_ring_t rx;
    pmsg_t *rx_ring_msg;
    int64_t rx_ring_got, rx_pieces;
    /* The incoming message being read */
    uint8_t stage[STAGE_BYTES];
    int64_t stage_pos, stage_len;
    int rx_state;            /* 0 header, 1 name, 2 payload */
    int64_t rx_got;
    p2p_hdr_t rx_hdr;
    char rx_name[HVDL_MAX_NAME + 1];
    pmsg_t *rx_into;         /* the recv or unexpected message the payload goes to */
    uint8_t *rx_dst;         /* where the payload goes (NULL: discarded) */
} ppeer_t;

/* Set up at start (thread, started, wake_fd, ep, peers), then owned as each field says:
 * mu for stop, each peer's smu for its send queue, each peer's rmu for its receiving
 * side, atomics for what the loop thread and callers read. */
struct p2p {
    pthread_t thread;        /* the starting thread's: set at start, joined at stop */
    int started;
    int wake_fd;
    int ep;                  /* the thread's epoll set: wake_fd and every connection; what
                                it watches for a connection changes under that peer's smu */
    pthread_mutex_t mu;      /* guards stop */
    int stop;
    ppeer_t *peers;
    atomic_int npending;     /* ops not finished */
    p2p_budget_t budget;     /* what a peer may make this rank hold (p2p_credit.c): set at
                                start */
    /* The thread is about to sleep without a timeout (no op pending): a caller that
     * posts a recv wakes it (so that it watches the failure flag and stalls again). */
    atomic_int sleeping;
    double last_stall_check; /* the p2p thread's */
    /* A failure the loop thread must tell the job about (hvdl__p2p_tend): lost_why is
     * written by the one thread that claimed lost_peer (-2), before it publishes the
     * peer, and read by the loop thread after it sees it. */
    atomic_int lost_peer;    /* -1: none */
    char lost_why[256];
    /* An op past HOROVOD_STALL_SHUTDOWN_TIME_SECONDS: the loop thread fails the job with
     * this message (hvdl__p2p_tend). 0 none, 1 being written, 2 published, 3 told. */
    atomic_int stall_state;
    char stall_msg[HVDL_MSG_BYTES];
};

/* The lists (a FIFO, unlinked from anywhere): under the lock of the list. */
static inline void push(plist_t *l, pmsg_t *m) {
    m->next = NULL;
    if (l->tail) l->tail->next = m;
    else l->head = m;
    l->tail = m;
}
static inline void unlink_msg(plist_t *l, pmsg_t *m) {
    pmsg_t **pp = &l->head, *prev = NULL;
    for (; *pp && *pp != m; prev = *pp, pp = &(*pp)->next) {}
    if (!*pp) return;
    *pp = m->next;
    if (l->tail == m) l->tail = prev;
}

/* p2p_complete.c: an op ends; a peer is reported lost */
void hvdl__p2p_finish(engine_t *e, pmsg_t *m, int status, const char *msg); /* frees m */
void hvdl__p2p_finish_bare(engine_t *e, op_t *o, int status, const char *msg);
void hvdl__p2p_finish_closed(engine_t *e, pmsg_t *m, int over);
void hvdl__p2p_fail_list(engine_t *e, plist_t *l, int status, const char *msg);
void hvdl__p2p_fail_all(engine_t *e, int status, const char *msg);
void hvdl__p2p_finish_closed_peers(engine_t *e, int over);
void hvdl__p2p_report_lost(engine_t *e, int peer, const char *why);
void hvdl__p2p_report_closed(engine_t *e, int peer);
/* p2p_match.c, under the peer's rmu */
pmsg_t *hvdl__p2p_posted_for(ppeer_t *q, const char *name);
int hvdl__p2p_accept_into(engine_t *e, pmsg_t *r, const p2p_hdr_t *h, uint8_t **dst);
int hvdl__p2p_give_back(engine_t *e, int peer, const p2p_hdr_t *h);
void hvdl__p2p_deliver(engine_t *e, pmsg_t *r, pmsg_t *m);
void hvdl__p2p_post_recv(engine_t *e, pmsg_t *r, int over);
/* p2p_rendezvous.c */
pmsg_t *hvdl__p2p_held_entry(engine_t *e, int peer, int kind, const p2p_hdr_t *h, const char *name);
int hvdl__p2p_clear_to_send(engine_t *e, pmsg_t *r, const p2p_hdr_t *h, const char *name,
                            uint64_t addr);
pmsg_t *hvdl__p2p_take_awaiting(ppeer_t *q, const char *name);
void hvdl__p2p_end_awaiting(engine_t *e, pmsg_t *a);
int hvdl__p2p_announced(engine_t *e, int peer, const p2p_hdr_t *h, const char *name, uint64_t addr);
const char *hvdl__p2p_rts_answered(engine_t *e, int peer, const p2p_hdr_t *h, const char *name);
int hvdl__p2p_ring_offered(engine_t *e, int peer);
int hvdl__p2p_piece_arrived(engine_t *e, int peer);
void hvdl__p2p_offer_ring(engine_t *e, int peer);
/* p2p_cma.c */
int hvdl__p2p_cma_read(engine_t *e, int peer, uint8_t *dst, uint64_t addr, int64_t n,
                       const char *name, char *why, size_t cap);
int hvdl__p2p_fin_arrived(engine_t *e, int peer, const p2p_hdr_t *h, const char *name);
int hvdl__p2p_send_fin(engine_t *e, int peer, const p2p_hdr_t *h, const char *name);
/* p2p_mailbox.c */
int hvdl__p2p_mbox_offered(engine_t *e, int peer);
int hvdl__p2p_mb_drain(engine_t *e, int peer);
int hvdl__p2p_mb_put_rec(ppeer_t *q, const p2p_hdr_t *h, const char *name, const void *payload,
                         uint64_t plen, int *bell);
int hvdl__p2p_mb_put(ppeer_t *q, pmsg_t *m, int cma, int *bell);
void hvdl__p2p_offer_mbox(engine_t *e, int peer);
/* p2p_read.c */
int hvdl__p2p_violation(engine_t *e, int peer, const char *what);
int hvdl__p2p_eager_arrived(engine_t *e, int peer, const p2p_hdr_t *h);
void hvdl__p2p_read_peer(engine_t *e, int peer); /* under the peer's rmu */
/* p2p_write.c */
int hvdl__p2p_queue_ctl(engine_t *e, int peer, const p2p_hdr_t *h, const char *name);
int hvdl__p2p_queue_ctl_locked(engine_t *e, int peer, const p2p_hdr_t *h, const char *name);
void hvdl__p2p_write_locked(engine_t *e, int peer);
void hvdl__p2p_write_peer(engine_t *e, int peer);
void hvdl__p2p_caller_flush(engine_t *e, int peer);
/* p2p_stall.c, p2p_thread.c */
void hvdl__p2p_stall_check(engine_t *e, double now);
void hvdl__p2p_arm_locked(struct p2p *p, ppeer_t *q, int peer);

#endif
