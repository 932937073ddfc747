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
 * connections), served by a thread of its own (this file). So a large send never waits
 * behind a collective on the data sockets or behind negotiation on the loop thread, and
 * a collective never waits behind it.
 *
 * Up to HOROVODLIKE_P2P_EAGER_BYTES the protocol is eager: a send writes its header and
 * payload at once, straight from the caller's buffer; it completes when the kernel has
 * taken the last byte. The caller
 * writes it itself when it is the only message queued for that peer (send_now); what
 * the socket does not take at once, and later sends, the p2p thread writes in order. The
 * receiving thread reads every connection that no waiting caller reads (below, "The
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
 * the length is the RTSA's checked nbytes (header_problem), and a read that fails or
 * stops short (EFAULT: an address it does not have; ESRCH: it exited) is that peer's
 * fault, named as lost. A stopped sender's memory is still read (the recv completes);
 * a receiver that dies leaves its sender waiting on the FIN, which the connection's
 * close (or the heartbeats) fails, as any rendezvous send.
 *
 * The waiting caller reads. Between ranks whose pair has no mailbox (other nodes, or
 * HOROVODLIKE_P2P_MAILBOX=0), the caller waiting on a send or recv with that peer reads
 * the pair's connection itself while it looks (hvdl__p2p_poll, from hvdl__engine_wait),
 * the way a recv's caller polls the mailbox on one node: a message goes from the socket
 * to the recv's buffer on the caller's thread, and a CTS it reads is answered by its
 * own write of the payload (caller_flush). Meanwhile the p2p thread does not watch that
 * connection for input: its epoll set (arm_locked) drops EPOLLIN while the connection
 * has readers and takes it back when the last one stops, which epoll_ctl does without
 * waking the thread, and which wakes it at once if input came meanwhile. So a message
 * wakes no thread where a caller waits for it, and is read by the thread where none
 * does (an op polled with hvd.poll, or one whose caller went to sleep). One reader at
 * a time (rmu: a second caller's look skips its turn); the same parser checks every
 * frame whoever reads it; a connection that closes or a malformed frame is reported by
 * whichever thread read it (report_lost).
 *
 * The receiving side of a peer (posted recvs, unexpected messages, the reader's state)
 * is under that peer's rmu, taken by the p2p thread, by a caller posting a recv (posted
 * on the caller's thread, without waking the p2p thread) and by a polling caller.
 *
 * Frame (p2p_hdr_t, 88 bytes, then the name, then nbytes of payload):
 *   magic, name_len (1..4096), dtype, ndim (0..8), shape[8], nbytes.
 * Every field is range-checked before anything is trusted (header_problem),
 * nbytes must equal the shape's size and is bounded by P2P_MAX_BYTES, and a peer that
 * breaks this is named by the loop thread as lost (hvdl__p2p_tend), which tells the job.
 *
 * Cost model, one message of n bytes between two ranks on one node, the mailbox live:
 *   eager      the sender's caller copies the record into the mailbox (one memcpy of
 *              n bytes, no system call) and completes; a receiver polling for it
 *              copies it out into the recv's buffer (recv_) or a new one (recv): no
 *              wake-up anywhere. Not polling: one sendmsg of an 88-byte bell (at most
 *              one unanswered per pair) and the two wake-ups below. Latency: the two
 *              memcpys + the Python calls (measured: docs/benchmarks.md, "Point-to-
 *              point messages", "The mailbox"); bandwidth up to the threshold: memcpy's,
 *              halved (two copies).
 *   memory     a mailbox per sending pair: one page + max(256 KiB, two of the largest
 *              eager records), made on the first send.
 *   rendezvous (CMA) one record each way (RTSA, FIN: no system call when each side's
 *              caller is polling) and one copy, process_vm_readv's, on the receiver,
 *              in the receiver's thread that matched it (no sender thread runs);
 *              one-way time: the copy (about memcpy's bandwidth, plus pinning the
 *              sender's pages) + the polls' latency. A caller that has stopped polling
 *              (past HOROVODLIKE_SPIN_US, or the FIN's wait: SPIN_US + 1 us per 4 KiB,
 *              capped at 4 ms) costs a bell and two wake-ups. Measured:
 *              docs/benchmarks.md, "One copy".
 *   rendezvous (no CMA) the RTS through the mailbox, the rest as below.
 * Between nodes (or HOROVODLIKE_P2P_MAILBOX=0), one message of n bytes:
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
 *   rendezvous one round trip (RTS, CTS) before the payload; on one node the payload
 *              then costs one memcpy on each side, overlapped piece by piece (the
 *              sender fills slot k+1 while the receiver empties slot k), and two small
 *              frames per piece (a slot is HOROVODLIKE_P2P_SHM_RING_BYTES / 8).
 *
 * Failure: a dead peer closes the connection; a stopped one is found by the engine's
 * heartbeats (liveness.c) within HOROVODLIKE_PEER_TIMEOUT_SECONDS. Either way the engine
 * fails with the peer's name, and this thread fails its waiting ops with that message.
 * Stall inspector: a send or recv waiting longer than HOROVOD_STALL_CHECK_TIME_SECONDS
 * is reported on its own rank with its name, its rank and the peer it waits for (and,
 * for a recv, the names that peer did send, which shows a name mismatch). One waiting
 * longer than HOROVOD_STALL_SHUTDOWN_TIME_SECONDS (if set) fails the job with that
 * report on every rank, as a stalled collective does.
 *
 * Shutdown: any rank's shutdown stops every rank's loop, but not this thread. A send is
 * eager, so its sender may shut down before the receiver posts the recv: recvs are still
 * taken until the rank's own shutdown, and what a peer sent is delivered. A rank that
 * shuts down half-closes its connections after its last byte; once the loop has ended,
 * an op waiting on a peer whose connection closed fails naming that peer (nothing else
 * would tell it: the loop thread, which turns a closed connection into a lost peer, is
 * gone).
 */
#define _GNU_SOURCE
#include "fail.h"
#include "net.h"
#include "p2p_credit.h"
#include "p2p_ring.h"
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

/* Frames, told apart by their magic. A message is EAGER (header, name, payload), or,
 * above the eager threshold, RTS (header, name) answered by CTS (the same) and then DATA
 * (header, name, payload) or, on one node, SDATA (header, name) and its PIECEs through
 * the pair's ring, each answered by an ACK. RING offers the ring, RING_OK / RING_NO
 * answer. The frames without a name carry no dtype or shape either. */
#define P2P_MAGIC 0x50327648u            /* "Hv2P": EAGER */
#define F_RTS 0x53545248u
#define F_CTS 0x53544348u
#define F_DATA 0x41544448u
#define F_SDATA 0x44535348u
#define F_PIECE 0x43455048u
#define F_ACK 0x4b434148u
#define F_RING 0x474e5248u
#define F_RING_OK 0x4b4f5248u
#define F_RING_NO 0x4f4e5248u
#define F_MBOX 0x58424d48u    /* the mailbox's offer (like RING), answered by MBOX_OK / _NO */
#define F_MBOX_OK 0x4b424d48u
#define F_MBOX_NO 0x4e424d48u
#define F_SWITCH 0x57534d48u  /* in send order: announcements come by the mailbox from here */
#define F_BELL 0x4c454248u    /* the mailbox has a record and nobody polls it */
#define F_ROOM 0x4d4f5248u    /* the mailbox has room again (the sender asked) */
#define F_RTSA 0x41535248u    /* mailbox only: RTS with the payload's address in the sender */
#define F_FIN 0x4e494648u     /* the receiver has read an RTSA's payload: the send is done */
#define F_CREDIT 0x44524348u  /* eager credit given back, nbytes of it (p2p_credit.c) */
#define F_BYE 0x45594248u     /* in send order: this rank has shut down (see "Leaving") */
#define P2P_MAX_NAME 4096
#define P2P_MAX_BYTES ((int64_t)1 << 40)  /* a longer message is malformed */
#define STAGE_BYTES (64 * 1024)
#define RING_SLOTS 8                     /* pieces in flight per pair */
#define RING_MIN_SLOT 4096
#define RING_MAX_SLOT ((int64_t)64 << 20)
#define MBOX_MIN ((int64_t)64 << 10)
#define MBOX_MAX ((int64_t)64 << 20)

typedef struct p2p_hdr {
    uint32_t magic, name_len;
    int32_t dtype, ndim;
    int64_t shape[HVDL_MAX_DIMS];
    int64_t nbytes;
} p2p_hdr_t;
_Static_assert(sizeof(p2p_hdr_t) == 88, "the p2p header is 88 bytes on the wire");

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
 * control frame to write. */
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
    double started, warned;
    struct pmsg *next;
} pmsg_t;

typedef struct plist { pmsg_t *head, *tail; } plist_t;

typedef struct ppeer {
    int fd;
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
    /* The peer's F_BYE has come (set under rmu, read by both sides): it has shut down and
     * posts nothing more; what it sent before has all been seen. */
    atomic_int left;
    /* Sends are written by the caller when its message is the only one queued (no
     * wake-up at all), else by the p2p thread; smu orders them and guards the queue. */
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
    int64_t tx_pieces, tx_acked;
    p2p_credit_t credit;     /* eager credit and announcements (p2p_credit.c): the sender's
                                fields under smu, the receiver's under rmu */
    atomic_llong acks_out;   /* ACKs begun to the peer (counted under smu, read under rmu) */
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
    char mb_name[P2P_MAX_NAME + 1];
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
    char rx_name[P2P_MAX_NAME + 1];
    pmsg_t *rx_into;         /* the recv or unexpected message the payload goes to */
    uint8_t *rx_dst;         /* where the payload goes (NULL: discarded) */
} ppeer_t;

/* Set up at start (thread, started, wake_fd, peers' fds), then owned as each field says:
 * mu for stop, each peer's smu for its send queue, each peer's rmu for its receiving
 * side, atomics for what the loop thread and callers read. */
struct p2p {
    pthread_t thread;
    int started;
    int wake_fd;
    int ep;                  /* the thread's epoll set: wake_fd and every connection */
    pthread_mutex_t mu;      /* guards stop */
    int stop;
    ppeer_t *peers;
    atomic_int npending;     /* ops not finished */
    p2p_budget_t budget;     /* what a peer may make this rank hold (p2p_credit.c) */
    /* The thread is about to sleep without a timeout (no op pending): a caller that
     * posts a recv wakes it (so that it watches the failure flag and stalls again). */
    atomic_int sleeping;
    double last_stall_check;
    /* A failure the loop thread must tell the job about (hvdl__p2p_tend). */
    atomic_int lost_peer;    /* -1: none */
    char lost_why[256];
    /* An op past HOROVOD_STALL_SHUTDOWN_TIME_SECONDS: the loop thread fails the job with
     * this message (hvdl__p2p_tend). 0 none, 1 being written, 2 published, 3 told. */
    atomic_int stall_state;
    char stall_msg[HVDL_MSG_BYTES];
};

static const char *const DTYPE_NAMES[] = {[HVDL_UINT8] = "uint8",       [HVDL_INT8] = "int8",
                                          [HVDL_INT16] = "int16",       [HVDL_INT32] = "int32",
                                          [HVDL_INT64] = "int64",       [HVDL_FLOAT16] = "float16",
                                          [HVDL_BFLOAT16] = "bfloat16", [HVDL_FLOAT32] = "float32",
                                          [HVDL_FLOAT64] = "float64",   [HVDL_BOOL] = "bool"};
_Static_assert(sizeof DTYPE_NAMES / sizeof DTYPE_NAMES[0] == HVDL_NUM_DTYPES,
               "a dtype without a name");
static const char *dtype_name(int d) {
    return d >= 0 && d < HVDL_NUM_DTYPES ? DTYPE_NAMES[d] : "?";
}

static void push(plist_t *l, pmsg_t *m) {
    m->next = NULL;
    if (l->tail) l->tail->next = m;
    else l->head = m;
    l->tail = m;
}
static void unlink_msg(plist_t *l, pmsg_t *m) {
    pmsg_t **pp = &l->head, *prev = NULL;
    for (; *pp && *pp != m; prev = *pp, pp = &(*pp)->next) {}
    if (!*pp) return;
    *pp = m->next;
    if (l->tail == m) l->tail = prev;
}

/* Why this header cannot be a message, or NULL (tests/test_engine_hostile.py sends each
 * case over a real connection). */
static int named_frame(uint32_t magic) {
    return magic == P2P_MAGIC || magic == F_RTS || magic == F_CTS || magic == F_DATA ||
           magic == F_SDATA || magic == F_RTSA || magic == F_FIN;
}
static const char *header_problem(const void *hdr) {
    const p2p_hdr_t *h = hdr;
    if (!named_frame(h->magic)) {
        if (h->magic != F_PIECE && h->magic != F_ACK && h->magic != F_RING &&
            h->magic != F_RING_OK && h->magic != F_RING_NO && h->magic != F_MBOX &&
            h->magic != F_MBOX_OK && h->magic != F_MBOX_NO && h->magic != F_SWITCH &&
            h->magic != F_BELL && h->magic != F_ROOM && h->magic != F_CREDIT && h->magic != F_BYE)
            return "bad magic";
        if (h->name_len || h->dtype || h->ndim) return "a control frame with a name or dtype";
        int offer = h->magic == F_RING || h->magic == F_MBOX;
        for (int d = offer ? 4 : 0; d < HVDL_MAX_DIMS; d++)
            if (h->shape[d]) return "a control frame with a shape";
        if (h->magic == F_MBOX)
            return h->nbytes >= MBOX_MIN && h->nbytes <= MBOX_MAX && h->shape[0] == 1
                       ? NULL
                       : "mailbox size out of range";
        if (h->magic == F_CREDIT) return h->nbytes >= 1 ? NULL : "credit of nothing";
        if (h->magic == F_PIECE || h->magic == F_ACK)
            return h->nbytes >= 1 && h->nbytes <= RING_MAX_SLOT ? NULL : "piece size out of range";
        if (h->magic == F_RING)
            return h->nbytes >= RING_MIN_SLOT && h->nbytes <= RING_MAX_SLOT && h->shape[0] >= 2 &&
                           h->shape[0] <= 64
                       ? NULL
                       : "ring size out of range";
        return h->nbytes ? "a ring answer with a size" : NULL;
    }
    if (h->name_len < 1 || h->name_len > P2P_MAX_NAME) return "name length out of range";
    if (!hvdl_dtype_size(h->dtype)) return "unknown dtype";
    if (h->ndim < 0 || h->ndim > HVDL_MAX_DIMS) return "dimensions out of range";
    int64_t n = hvdl_dtype_size(h->dtype);
    for (int d = 0; d < h->ndim; d++) {
        if (h->shape[d] < 0) return "negative dimension";
        if (h->shape[d] && n > P2P_MAX_BYTES / h->shape[d]) return "size out of range";
        n *= h->shape[d];
    }
    for (int d = h->ndim; d < HVDL_MAX_DIMS; d++)
        if (h->shape[d]) return "a dimension beyond ndim";
    if (h->nbytes != n) return "byte count does not match dtype and shape";
    return NULL;
}

static void shape_str(const p2p_hdr_t *h, char *out, size_t cap) {
    size_t k = (size_t)snprintf(out, cap, "[");
    for (int d = 0; d < h->ndim && k < cap; d++)
        k += (size_t)snprintf(out + k, cap - k, d ? ", %lld" : "%lld", (long long)h->shape[d]);
    if (k < cap) snprintf(out + k, cap - k, "]");
}

/* ---- completion ---- */

static void finish(engine_t *e, pmsg_t *m, int status, const char *msg) {
    op_t *o = m->op;
    struct p2p *p = e->p2p;
    double now = hvdl_now();
    if (TL_ON(e) && status == HVDL_OK) {
        char args[160];
        snprintf(args, sizeof args, "\"peer\": %d, \"bytes\": %lld", m->peer,
                 (long long)(o->meta.op == HVDL_OP_SEND ? o->nbytes : o->result.nbytes));
        buf_t b = {0};
        hvdl__json_str(&b, o->name);
        if (b.data) {
            char *full = malloc((size_t)b.len + sizeof args + 16);
            if (full) {
                snprintf(full, (size_t)b.len + sizeof args + 16, "\"name\": %.*s, %s", (int)b.len,
                         (const char *)b.data, args);
                hvdl__tl_span(e, TL_P2P, o->meta.op == HVDL_OP_SEND ? "SEND" : "RECV", m->started,
                              now, full);
                free(full);
            }
        }
        buf_free(&b);
    }
    pthread_mutex_lock(&e->mu);
    if (!atomic_load(&o->done)) {
        o->status = status;
        o->msg = msg ? strdup(msg) : NULL;
        atomic_store(&o->done, 1);
    }
    pthread_cond_broadcast(&e->done_cv);
    pthread_mutex_unlock(&e->mu);
    free(m);
    atomic_fetch_sub(&p->npending, 1);
}

/* Complete an op that has no pmsg (none could be allocated, or it was never queued). */
static void finish_bare(engine_t *e, op_t *o, int status, const char *msg) {
    pthread_mutex_lock(&e->mu);
    o->status = status;
    o->msg = strdup(msg);
    atomic_store(&o->done, 1);
    pthread_cond_broadcast(&e->done_cv);
    pthread_mutex_unlock(&e->mu);
}

/* An op whose peer closed its p2p connection: what it ends with. While the job runs the
 * peer was lost (the loop thread fails the job with that); after a shutdown the peer
 * simply left, without sending (or reading) this message. */
static void finish_closed(engine_t *e, pmsg_t *m, int over) {
    char why[HVDL_MSG_BYTES];
    const char *host = e->peers[m->peer].host;
    int send = m->op->meta.op == HVDL_OP_SEND;
    if (!over)
        snprintf(why, sizeof why,
                 "rank %d (host %s) was lost: its point-to-point connection closed", m->peer, host);
    else
        snprintf(why, sizeof why,
                 "%s '%.200s' on rank %d %s rank %d: rank %d (host %s) shut down or exited "
                 "without %s it",
                 send ? "send" : "recv", m->op->name, e->rank, send ? "to" : "from", m->peer,
                 m->peer, host, send ? "receiving" : "sending");
    finish(e, m, over ? HVDL_ERR_SHUT_DOWN : HVDL_ERR_PEER_LOST, why);
}

/* End a list's ops with (status, msg), or, msg NULL, each naming its peer, whose
 * connection closed after a shutdown (finish_closed). What has no op is freed. */
static void fail_list(engine_t *e, plist_t *l, int status, const char *msg) {
    while (l->head) {
        pmsg_t *m = l->head;
        l->head = m->next;
        if (m->op && msg) finish(e, m, status, msg);
        else if (m->op) finish_closed(e, m, 1);
        else {
            free(m->name);
            free(m->data);
            free(m);
        }
    }
    l->tail = NULL;
}

/* Every op waiting on peer q ends: with (status, msg), or, msg NULL, naming q. */
static void fail_peer(engine_t *e, ppeer_t *q, int status, const char *msg) {
    plist_t half = {0};                             /* a recv half read, or half moved */
    pthread_mutex_lock(&q->rmu);
    if (q->rx_into && q->rx_into->op) {
        push(&half, q->rx_into);
        q->rx_into = NULL;
        q->rx_dst = NULL;
    }
    if (q->rx_ring_msg) push(&half, q->rx_ring_msg);
    q->rx_ring_msg = NULL;
    fail_list(e, &half, status, msg);
    pthread_mutex_lock(&q->smu);
    q->cur = NULL;
    fail_list(e, &q->sends, status, msg);
    fail_list(e, &q->rts_wait, status, msg);
    fail_list(e, &q->ctl, status, msg);
    pthread_mutex_unlock(&q->smu);
    fail_list(e, &q->recvs, status, msg);
    fail_list(e, &q->awaiting, status, msg);
    pthread_mutex_unlock(&q->rmu);
}

/* Everything this thread holds fails with one message (the engine failed or stopped). */
static void fail_all(engine_t *e, int status, const char *msg) {
    for (int i = 0; i < e->size; i++) fail_peer(e, &e->p2p->peers[i], status, msg);
}

/* The job was shut down (the loop thread has ended, without a failure): nothing will
 * tell this thread that a peer is gone but its connection closing, so the ops waiting on
 * a peer whose connection closed end here, each naming that peer. What the peer sent
 * before it closed has been read and matched already (a connection closes after its
 * last byte). */
static void finish_closed_peers(engine_t *e, int over) {
    for (int i = 0; i < e->size; i++) {
        ppeer_t *q = &e->p2p->peers[i];
        if (q->closed && (over || q->left)) fail_peer(e, q, 0, NULL);
    }
}

/* Tell the loop thread (which owns the control connections) that a peer broke. */
static void report_lost(engine_t *e, int peer, const char *why) {
    struct p2p *p = e->p2p;
    int none = -1;
    p->peers[peer].closed = 1;
    /* The first report wins: claimed (-2), its reason written, then published. */
    if (!atomic_compare_exchange_strong(&p->lost_peer, &none, -2)) return;
    snprintf(p->lost_why, sizeof p->lost_why, "%s", why);
    atomic_store(&p->lost_peer, peer);
    hvdl__wake(e);
}

/* An op meets a connection that closed while nothing waited on it (read_peer reports a
 * close only then, as a peer may be leaving after a shutdown this rank has not heard
 * of yet). The op waits, and the loss goes to the loop thread like any other: it waits
 * for rank 0's verdict and fails the job (the p2p thread then fails the op with it), or
 * learns of the shutdown (and the op ends naming the peer that left). Failing the op
 * alone here would let its caller go on, even shut down, with the job not failed: the
 * goodbye would then turn the others' view of the loss into a plain shutdown. */
static void report_closed(engine_t *e, int peer) {
    report_lost(e, peer, "its point-to-point connection closed");
    hvdl_wakefd_signal(e->p2p->wake_fd);            /* it watches the op from now on */
}

int hvdl__p2p_tend(engine_t *e) {
    struct p2p *p = e->p2p;
    if (!p) return 0;
    int published = 2;
    if (atomic_compare_exchange_strong(&p->stall_state, &published, 3)) {
        /* every rank ends with this reason, as a collective's stall shutdown does */
        hvdl__fail_job(e, HVDL_ERR_STALLED, "%s", p->stall_msg);
        return -1;
    }
    int peer = atomic_load(&p->lost_peer);
    if (peer < 0) return 0;                         /* none, or its reason not written yet */
    hvdl__peer_lost(e, peer, p->lost_why);
    return e->failed || e->stopped ? -1 : 0;
}

/* ---- matching ---- */

/* The posted recv from q for this name, or NULL. */
static pmsg_t *posted_for(ppeer_t *q, const char *name) {
    for (pmsg_t *m = q->recvs.head; m; m = m->next)
        if (!strcmp(m->op->name, name)) return m;
    return NULL;
}

/* A recv meets a message described by h: prepare its output. 0, or -1 after completing
 * the recv with the mismatch (its payload is then discarded). */
static int accept_into(engine_t *e, pmsg_t *r, const p2p_hdr_t *h, uint8_t **dst) {
    op_t *o = r->op;
    char why[HVDL_MSG_BYTES];
    if (o->meta.ndim >= 0) {                        /* recv_: the caller's buffer */
        const char *field = NULL;
        char mine[200], theirs[200];
        if (h->dtype != o->meta.dtype) {
            field = "dtype";
            snprintf(theirs, sizeof theirs, "%s", dtype_name(h->dtype));
            snprintf(mine, sizeof mine, "%s", dtype_name(o->meta.dtype));
        } else if (h->nbytes != o->nbytes) {
            p2p_hdr_t b = {.ndim = o->meta.ndim};
            memcpy(b.shape, o->meta.shape, sizeof b.shape);
            char s1[160], s2[160];
            shape_str(h, s1, sizeof s1);
            shape_str(&b, s2, sizeof s2);
            field = "size";
            snprintf(theirs, sizeof theirs, "%lld bytes (shape %s)", (long long)h->nbytes, s1);
            snprintf(mine, sizeof mine, "%lld bytes (shape %s)", (long long)o->nbytes, s2);
        }
        if (field) {
            snprintf(why, sizeof why,
                     "recv_ '%s' on rank %d from rank %d: the message and the buffer "
                     "differ in %s: rank %d sent %s, rank %d's buffer has %s",
                     o->name, e->rank, r->peer, field, r->peer, theirs, e->rank, mine);
            *dst = NULL;
            finish(e, r, HVDL_ERR_MISMATCH, why);
            return -1;
        }
        *dst = o->output;
    } else {                                        /* recv: a new buffer, given away */
        if (h->nbytes && !(o->result.data = malloc((size_t)h->nbytes))) {
            snprintf(why, sizeof why,
                     "recv '%s' on rank %d from rank %d: out of memory for %lld bytes", o->name,
                     e->rank, r->peer, (long long)h->nbytes);
            *dst = NULL;
            finish(e, r, HVDL_ERR_SYSTEM, why);
            return -1;
        }
        *dst = o->result.data;
    }
    o->result.nbytes = h->nbytes;
    o->result.dtype = h->dtype;
    o->result.ndim = h->ndim;
    o->result.peer = r->peer;
    memcpy(o->result.shape, h->shape, sizeof o->result.shape);
    o->result.first_dim = h->ndim ? h->shape[0] : 0;
    return 0;
}

/* A control frame (CTS, ACK, RING*) to the peer, written before the next send's frame.
 * With q->smu held; 0, or -1 when out of memory (the job fails: a peer would wait). */
static int queue_ctl(engine_t *e, int peer, const p2p_hdr_t *h, const char *name) {
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

static int queue_ctl_locked(engine_t *e, int peer, const p2p_hdr_t *h, const char *name) {
    ppeer_t *q = &e->p2p->peers[peer];
    pthread_mutex_lock(&q->smu);
    int rc = queue_ctl(e, peer, h, name);
    pthread_mutex_unlock(&q->smu);
    return rc;
}

/* An eager message from peer (header h) met its recv: its charge goes back to the sender
 * once a quarter of the budget has (F_CREDIT, p2p_credit.c). 0, or -1 when out of memory. */
static int give_back(engine_t *e, int peer, const p2p_hdr_t *h) {
    ppeer_t *q = &e->p2p->peers[peer];
    int64_t n = hvdl__credit_matched(&q->credit, &e->p2p->budget,
                                     hvdl__credit_charge(h->name_len, h->nbytes));
    p2p_hdr_t c = {.magic = F_CREDIT, .nbytes = n};
    return n ? queue_ctl_locked(e, peer, &c, NULL) : 0;
}

/* What the receiver holds of an announced message without a recv op (an announcement
 * not asked for yet, or a cleared one to discard): NULL after failing the job. */
static pmsg_t *held_entry(engine_t *e, int peer, int kind, const p2p_hdr_t *h, const char *name) {
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

static int send_fin(engine_t *e, int peer, const p2p_hdr_t *h, const char *name);

/* With q->rmu held: copy n bytes at addr in peer's memory (an RTSA) into dst, straight
 * from the sender's buffer (process_vm_readv; the sender keeps it until the FIN). 0 done,
 * 1 not permitted (ptrace rules, seccomp: the ring is used from now on), -1 the peer is
 * reported (it died, or announced memory it does not have: a protocol error). */
static int cma_read(engine_t *e, int peer, uint8_t *dst, uint64_t addr, int64_t n, const char *name,
                    char *why, size_t cap) {
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
        report_lost(e, peer, why);
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

/* A recv r meets a message announced by h (RTS): prepare its buffer and clear the sender
 * to send (CTS). An RTSA's payload (addr) is read at once instead, and the sender told
 * it is done (FIN). A recv that fails here (a wrong recv_ buffer) still clears it, so the
 * sender completes, and its payload is discarded. Then r awaits the payload. */
static int clear_to_send(engine_t *e, pmsg_t *r, const p2p_hdr_t *h, const char *name,
                         uint64_t addr) {
    int peer = r->peer;
    ppeer_t *q = &e->p2p->peers[peer];
    uint8_t *dst = NULL;
    pmsg_t *a = r;
    int ok = accept_into(e, r, h, &dst) == 0;       /* (failed: r is finished and freed) */
    if (addr && e->cfg.p2p_cma && q->cma >= 0) {
        char why[256], msg[HVDL_MSG_BYTES];
        int rc = ok && h->nbytes ? cma_read(e, peer, dst, addr, h->nbytes, name, why, sizeof why)
                                 : 0;
        if (rc < 0) {                               /* the peer is reported */
            snprintf(msg, sizeof msg, "rank %d (host %s) was lost: %s", peer, e->peers[peer].host,
                     why);
            finish(e, r, HVDL_ERR_PEER_LOST, msg);
            return -1;
        }
        if (rc == 0) {                              /* read (or discarded): the send is done */
            if (ok) finish(e, r, HVDL_OK, NULL);
            return send_fin(e, peer, h, name);
        }
    }                                               /* no address, or refused: the CTS path */
    if (!ok && !(a = held_entry(e, peer, K_AWAIT, h, name))) return -1;
    a->kind = K_AWAIT;
    a->hdr = *h;
    a->data = dst;
    push(&q->awaiting, a);
    p2p_hdr_t c = *h;
    c.magic = F_CTS;
    return queue_ctl_locked(e, peer, &c, name);
}

/* The first recv cleared to come with this name (DATA and SDATA come in CTS order per
 * name), unlinked, or NULL. */
static pmsg_t *take_awaiting(ppeer_t *q, const char *name) {
    for (pmsg_t *a = q->awaiting.head; a; a = a->next)
        if (!strcmp(a->op ? a->op->name : a->name, name)) {
            unlink_msg(&q->awaiting, a);
            return a;
        }
    return NULL;
}

/* An awaiting recv's payload has all come (or it was discarded). */
static void end_awaiting(engine_t *e, pmsg_t *a) {
    if (a->op) {
        finish(e, a, HVDL_OK, NULL);
        return;
    }
    free(a->name);
    free(a);
}

/* An unexpected message m meets recv r: deliver it (or, announced, clear it) and free m. */
static void deliver(engine_t *e, pmsg_t *r, pmsg_t *m) {
    op_t *o = r->op;
    uint8_t *dst;
    int into = o->meta.ndim >= 0;
    if (m->kind == K_UNEXPECTED) give_back(e, r->peer, &m->hdr); /* (failing, it fails the job) */
    if (m->kind == K_UNEXPECTED_RTS) {
        clear_to_send(e, r, &m->hdr, m->name, m->addr);
    } else if (!into) {                             /* hand the buffer over, no copy */
        o->result.data = m->data;
        m->data = NULL;
        p2p_hdr_t h = m->hdr;
        h.nbytes = 0;                               /* nothing to allocate */
        accept_into(e, r, &h, &dst);
        o->result.nbytes = m->hdr.nbytes;
        finish(e, r, HVDL_OK, NULL);
    } else if (accept_into(e, r, &m->hdr, &dst) == 0) {
        if (m->hdr.nbytes) memcpy(dst, m->data, (size_t)m->hdr.nbytes);
        finish(e, r, HVDL_OK, NULL);
    }
    free(m->name);
    free(m->data);
    free(m);
}

/* A new recv: take an unexpected message of its name, or wait among the posted. A peer
 * whose connection closed sends nothing more: what it sent before is all there is. */
static void post_recv(engine_t *e, pmsg_t *r, int over) {
    ppeer_t *q = &e->p2p->peers[r->peer];
    r->kind = K_RECV;
    for (pmsg_t *m = q->unexpected.head; m; m = m->next)
        if (!strcmp(m->name, r->op->name)) {
            unlink_msg(&q->unexpected, m);
            if (m->kind == K_UNEXPECTED_RTS)
                hvdl__credit_unhold(&q->credit, hvdl__credit_charge(m->hdr.name_len, 0));
            if (m->kind == K_UNEXPECTED_RTS && q->closed) { /* announced, never to come */
                free(m->name);
                free(m);
                break;
            }
            deliver(e, r, m);
            return;
        }
    if ((q->closed && over) || atomic_load(&q->left)) {   /* nothing more will come */
        finish_closed(e, r, 1);
        return;
    }
    push(&q->recvs, r);
    if (q->closed) report_closed(e, r->peer);
}

/* ---- reading ---- */

static int violation(engine_t *e, int peer, const char *what) {
    char why[200];
    snprintf(why, sizeof why, "sent a malformed point-to-point frame (%s)", what);
    report_lost(e, peer, why);
    return -1;
}

/* An eager message h from peer arrives: within the credit this rank gave it, or the peer
 * broke the protocol (p2p_credit.c). 0, or -1 once reported. */
static int eager_arrived(engine_t *e, int peer, const p2p_hdr_t *h) {
    ppeer_t *q = &e->p2p->peers[peer];
    const char *bad = hvdl__credit_arrived(&q->credit, &e->p2p->budget,
                                           hvdl__credit_charge(h->name_len, h->nbytes));
    return bad ? violation(e, peer, bad) : 0;
}

/* RING: the peer offers its ring to this rank; map it and answer. */
static int ring_offered(engine_t *e, int peer) {
    ppeer_t *q = &e->p2p->peers[peer];
    p2p_hdr_t a = {.magic = F_RING_NO};
    const int64_t *f = q->rx_hdr.shape;             /* nslots, pid, fd, token */
    if (q->rx.base) return violation(e, peer, "a second ring");
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
    return queue_ctl_locked(e, peer, &a, NULL);
}

/* MBOX: the peer offers its mailbox to this rank; map it and answer. It is read once
 * the peer's F_SWITCH comes, in order after every announcement sent over the connection. */
static int mbox_offered(engine_t *e, int peer) {
    ppeer_t *q = &e->p2p->peers[peer];
    p2p_hdr_t a = {.magic = F_MBOX_NO};
    const int64_t *f = q->rx_hdr.shape;             /* 1, pid, fd, token */
    if (q->mrx.base) return violation(e, peer, "a second mailbox");
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
    return queue_ctl_locked(e, peer, &a, NULL);
}

/* An announcement (RTS) h of a large message: clear it if its recv is posted, else keep
 * it (no payload) until one is. */
static int announced(engine_t *e, int peer, const p2p_hdr_t *h, const char *name, uint64_t addr) {
    ppeer_t *q = &e->p2p->peers[peer];
    pmsg_t *r = posted_for(q, name);
    if (r) {
        unlink_msg(&q->recvs, r);
        return clear_to_send(e, r, h, name, addr);
    }
    const char *bad = hvdl__credit_hold(&q->credit, &e->p2p->budget,
                                        hvdl__credit_charge(h->name_len, 0));
    if (bad) return violation(e, peer, bad);
    pmsg_t *m = held_entry(e, peer, K_UNEXPECTED_RTS, h, name);
    if (!m) return -1;
    m->addr = addr;
    push(&q->unexpected, m);
    return 0;
}

/* A record's bytes in the mailbox: header, name, payload, then padding to 8 bytes. */
static uint64_t record_bytes(int64_t name_len, int64_t payload) {
    return ((uint64_t)sizeof(p2p_hdr_t) + (uint64_t)name_len + (uint64_t)payload + 7) & ~7ull;
}

/* What follows a record's name: an eager message's payload, an RTSA's address. */
static int64_t record_payload(const p2p_hdr_t *h) {
    return h->magic == P2P_MAGIC ? h->nbytes : h->magic == F_RTSA ? (int64_t)sizeof(uint64_t) : 0;
}

/* An eager message h whose payload lies in the peer's mailbox at pos: into its posted
 * recv (one copy), or buffered whole as unexpected. */
static int mb_eager(engine_t *e, int peer, const p2p_hdr_t *h, const char *name, uint64_t pos) {
    ppeer_t *q = &e->p2p->peers[peer];
    if (eager_arrived(e, peer, h)) return -1;
    pmsg_t *r = posted_for(q, name);
    if (r) {
        uint8_t *dst = NULL;
        unlink_msg(&q->recvs, r);
        if (give_back(e, peer, h)) return -1;
        if (accept_into(e, r, h, &dst)) return 0;   /* failed (mismatch): dropped */
        hvdl__p2p_mbox_get(&q->mrx, pos, dst, (size_t)h->nbytes);
        finish(e, r, HVDL_OK, NULL);
        return 0;
    }
    pmsg_t *m = held_entry(e, peer, K_UNEXPECTED, h, name);
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

/* With q->smu held: the receiver answered the first send announced with this name:
 * CTS (the payload goes now) or FIN (it read the payload itself: the send is done).
 * NULL, or what is wrong. */
static const char *rts_answered(engine_t *e, int peer, const p2p_hdr_t *h, const char *name) {
    ppeer_t *q = &e->p2p->peers[peer];
    pmsg_t *m = q->rts_wait.head;
    for (; m && strcmp(m->op->name, name); m = m->next) {}
    if (!m || m->hdr.nbytes != h->nbytes) return "a clear-to-send for nothing announced";
    unlink_msg(&q->rts_wait, m);
    hvdl__credit_answered(&q->credit, hvdl__credit_charge(m->hdr.name_len, 0));
    if (h->magic == F_FIN) {
        finish(e, m, HVDL_OK, NULL);
        return NULL;
    }
    m->kind = q->ring_state == 2 && m->hdr.nbytes ? K_SDATA : K_DATA; /* (SDATA has pieces) */
    m->framed = 0;
    m->off = 0;
    push(&q->sends, m);
    return NULL;
}

/* A FIN record in the peer's mailbox (taken with q->rmu held). */
static int fin_arrived(engine_t *e, int peer, const p2p_hdr_t *h, const char *name) {
    ppeer_t *q = &e->p2p->peers[peer];
    pthread_mutex_lock(&q->smu);
    const char *bad = rts_answered(e, peer, h, name);
    pthread_mutex_unlock(&q->smu);
    return bad ? violation(e, peer, bad) : 0;
}

/* With q->rmu held: take every record the peer has put in its mailbox, in order, as the
 * connection's reader takes frames. The peer is not trusted: the filled length, each
 * header and each record's length are checked before anything is read. 0, or -1 once
 * the peer is reported (its mailbox is then no longer read). The sender may wait for
 * room (MBOX_WANT_ROOM): it is told (F_ROOM) once records have been taken. */
static int mb_drain(engine_t *e, int peer) {
    ppeer_t *q = &e->p2p->peers[peer];
    if (!atomic_load(&q->mrx_live)) return 0;
    uint64_t cap = (uint64_t)q->mrx.slot_bytes;
    int took = 0;
    for (;;) {
        uint64_t tail = atomic_load_explicit(hvdl__p2p_mbox_word(&q->mrx, MBOX_TAIL),
                                             memory_order_acquire);
        uint64_t avail = tail - q->mrx_head;
        if (!avail) break;
        const char *bad = NULL;
        p2p_hdr_t h;
        if (avail > cap || avail < sizeof h) bad = "a mailbox filled out of range";
        else {
            hvdl__p2p_mbox_get(&q->mrx, q->mrx_head, &h, sizeof h);
            bad = header_problem(&h);
            if (!bad && h.magic != P2P_MAGIC && h.magic != F_RTS && h.magic != F_RTSA &&
                h.magic != F_FIN)
                bad = "a frame the mailbox does not carry";
            else if (!bad && record_bytes(h.name_len, record_payload(&h)) > avail)
                bad = "a mailbox record longer than what was put";
        }
        if (!bad) {
            hvdl__p2p_mbox_get(&q->mrx, q->mrx_head + sizeof h, q->mb_name, h.name_len);
            q->mb_name[h.name_len] = 0;
            if (strlen(q->mb_name) != h.name_len) bad = "a NUL byte in a name";
        }
        if (bad) {
            atomic_store(&q->mrx_live, 0);
            return violation(e, peer, bad);
        }
        uint64_t len = record_bytes(h.name_len, record_payload(&h)), addr = 0;
        if (h.magic == F_RTSA)
            hvdl__p2p_mbox_get(&q->mrx, q->mrx_head + sizeof h + h.name_len, &addr, sizeof addr);
        int rc = h.magic == F_FIN ? fin_arrived(e, peer, &h, q->mb_name)
                 : h.magic != P2P_MAGIC
                     ? announced(e, peer, &h, q->mb_name, addr)
                     : mb_eager(e, peer, &h, q->mb_name, q->mrx_head + sizeof h + h.name_len);
        if (rc) return -1;
        q->mrx_head += len;
        atomic_store(hvdl__p2p_mbox_word(&q->mrx, MBOX_HEAD), q->mrx_head);
        took = 1;
    }
    /* seq_cst: either the sender sees the new head, or this sees its request */
    if (took && atomic_exchange(hvdl__p2p_mbox_word(&q->mrx, MBOX_WANT_ROOM), 0)) {
        p2p_hdr_t room = {.magic = F_ROOM};
        return queue_ctl_locked(e, peer, &room, NULL);
    }
    return 0;
}

/* The sender's side of a frame without a payload: CTS, ACK, RING_OK, RING_NO, MBOX_OK,
 * MBOX_NO, ROOM. */
static int sender_frame(engine_t *e, int peer) {
    ppeer_t *q = &e->p2p->peers[peer];
    const p2p_hdr_t *h = &q->rx_hdr;
    const char *bad = NULL;
    pthread_mutex_lock(&q->smu);
    if (h->magic == F_CTS || h->magic == F_FIN) {
        bad = rts_answered(e, peer, h, q->rx_name);
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
    return bad ? violation(e, peer, bad) : 0;
}

/* PIECE: the next slot of the peer's ring holds the next piece of the SDATA message. */
static int piece_arrived(engine_t *e, int peer) {
    ppeer_t *q = &e->p2p->peers[peer];
    pmsg_t *a = q->rx_ring_msg;
    int64_t n = q->rx_hdr.nbytes;
    if (!a || !q->rx.base || n > q->rx.slot_bytes || n > a->hdr.nbytes - q->rx_ring_got)
        return violation(e, peer, "a piece that does not fit");
    /* a slot whose ACK has not begun to go out is not free: so at most nslots ACKs wait */
    if (q->rx_pieces - atomic_load(&q->acks_out) >= q->rx.nslots)
        return violation(e, peer, "a piece in a slot not freed yet");
    if (a->data)
        memcpy(a->data + q->rx_ring_got, hvdl__p2p_ring_slot(&q->rx, q->rx_pieces), (size_t)n);
    q->rx_pieces++;
    q->rx_ring_got += n;
    p2p_hdr_t ack = {.magic = F_ACK, .nbytes = n};
    if (queue_ctl_locked(e, peer, &ack, NULL)) return -1;
    if (q->rx_ring_got == a->hdr.nbytes) {
        q->rx_ring_msg = NULL;
        end_awaiting(e, a);
    }
    return 0;
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
    if (atomic_load(&q->left)) return violation(e, peer, "a second goodbye");
    if (mb_drain(e, peer)) return -1;
    atomic_store(&q->left, 1);
    fail_list(e, &q->recvs, 0, NULL);               /* each names the peer (finish_closed) */
    pthread_mutex_lock(&q->smu);
    fail_list(e, &q->rts_wait, 0, NULL);
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
    if (named_frame(magic)) {
        q->rx_name[q->rx_hdr.name_len] = 0;
        if (strlen(q->rx_name) != q->rx_hdr.name_len) {
            report_lost(e, peer,
                        "sent a malformed point-to-point message (a NUL byte in its name)");
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
    case F_RING: return ring_offered(e, peer);
    case F_PIECE: return piece_arrived(e, peer);
    case F_MBOX: return mbox_offered(e, peer);
    case F_SWITCH:
        if (!q->mrx.base || atomic_load(&q->mrx_live))
            return violation(e, peer, "a switch to no mailbox");
        atomic_store(&q->mrx_live, 1);
        return mb_drain(e, peer);
    case F_BELL:
        if (!atomic_load(&q->mrx_live)) return violation(e, peer, "a doorbell of no mailbox");
        atomic_store(hvdl__p2p_mbox_word(&q->mrx, MBOX_BELLED), 0); /* seq_cst: see mb_put */
        return mb_drain(e, peer);
    case F_RTS: return announced(e, peer, &q->rx_hdr, q->rx_name, 0);
    case F_RTSA: return violation(e, peer, "a mailbox record over the connection");
    case F_DATA:
    case F_SDATA: {
        pmsg_t *a = take_awaiting(q, q->rx_name);
        if (!a || a->hdr.nbytes != q->rx_hdr.nbytes)
            return violation(e, peer, "a payload it was not cleared to send");
        if (magic == F_SDATA) {
            if (!q->rx.base || q->rx_ring_msg)
                return violation(e, peer, "a ring message out of turn");
            q->rx_ring_msg = a;
            q->rx_ring_got = 0;
            return 0;
        }
        if (!a->op) {                               /* its recv failed: discard */
            end_awaiting(e, a);
            a = NULL;
        }
        q->rx_into = a;
        q->rx_dst = a ? a->data : NULL;
        q->rx_state = 2;
        return 0;
    }
    }
    /* EAGER */
    if (eager_arrived(e, peer, &q->rx_hdr)) return -1;
    pmsg_t *r = posted_for(q, q->rx_name);
    if (r) {
        unlink_msg(&q->recvs, r);
        if (give_back(e, peer, &q->rx_hdr)) return -1;
        if (accept_into(e, r, &q->rx_hdr, &q->rx_dst) == 0) q->rx_into = r;
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
        finish(e, m, HVDL_OK, NULL);
        return;
    }
    /* Unexpected: a recv may have been posted while it arrived. */
    pmsg_t *r = posted_for(q, m->name);
    if (r) {
        unlink_msg(&q->recvs, r);
        deliver(e, r, m);
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
                const char *why = header_problem(&q->rx_hdr);
                if (why) {
                    char msg[200];
                    snprintf(msg, sizeof msg, "sent a malformed point-to-point header (%s)", why);
                    report_lost(e, peer, msg);
                    return -1;
                }
                q->rx_state = 1;
                if (!named_frame(q->rx_hdr.magic) && begin_payload(e, peer)) return -1;
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
static void read_peer(engine_t *e, int peer) {
    ppeer_t *q = &e->p2p->peers[peer];
    for (;;) {
        q->stage_pos = q->stage_len = 0;
        int rc = parse(e, peer);
        if (rc < 0) return;
        ssize_t n = rc ? 0 : recv(q->fd, q->stage, STAGE_BYTES, MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
        if (n <= 0) {                               /* closed or broken */
            /* what the peer put in its mailbox before it closed is delivered too */
            if (mb_drain(e, peer)) return;
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
                report_lost(e, peer, why);
            }
            return;
        }
        q->stage_len = n;
        q->stage_pos = 0;
        if (parse(e, peer) < 0) return;
        if (n < STAGE_BYTES) return;                /* drained */
    }
}

/* ---- writing ---- */

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

/* With q->smu held: put record h (with its name, then plen bytes of payload) in the
 * mailbox. 0 done (*bell: nobody polls it, so the receiver's thread must be told), 1 no
 * room (the receiver is asked to say when there is), -1 the receiver broke the mailbox. */
static int mb_put_rec(ppeer_t *q, const p2p_hdr_t *h, const char *name, const void *payload,
                      uint64_t plen, int *bell) {
    uint64_t len = record_bytes(h->name_len, (int64_t)plen);
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

/* The receiver has read an RTSA's payload: FIN to its sender, through this rank's
 * mailbox to it when live (its waiting caller polls that: no wake-up), else (or full)
 * over the connection. 0, or -1 when out of memory (the job fails). */
static int send_fin(engine_t *e, int peer, const p2p_hdr_t *h, const char *name) {
    ppeer_t *q = &e->p2p->peers[peer];
    p2p_hdr_t f = *h, b = {.magic = F_BELL};
    f.magic = F_FIN;
    pthread_mutex_lock(&q->smu);
    int bell = 0, rc = q->mb_state == MB_LIVE ? mb_put_rec(q, &f, name, NULL, 0, &bell) : 1;
    rc = rc ? queue_ctl(e, peer, &f, name) : bell ? queue_ctl(e, peer, &b, NULL) : 0;
    pthread_mutex_unlock(&q->smu);
    return rc;
}

/* With q->smu held: put announcement m (EAGER with its payload, or RTS; with cma, RTSA
 * and its payload's address) in the mailbox, as mb_put_rec. */
static int mb_put(ppeer_t *q, pmsg_t *m, int cma, int *bell) {
    p2p_hdr_t h = m->hdr;
    h.magic = m->kind == K_EAGER ? P2P_MAGIC : cma ? F_RTSA : F_RTS;
    uint64_t addr = (uint64_t)(uintptr_t)m->op->input; /* the receiver reads it from here */
    const void *payload = h.magic == P2P_MAGIC ? m->op->input : &addr;
    return mb_put_rec(q, &h, m->op->name, payload, (uint64_t)record_payload(&h), bell);
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
    if (m->kind == K_BYE) {                         /* the peer knows now: see "Leaving" */
        unlink_msg(&q->sends, m);
        free(m);
        return 1;
    }
    if (m->kind == K_RTS) {                         /* it waits for the CTS, out of the way */
        unlink_msg(&q->sends, m);
        if (atomic_load(&q->left)) finish_closed(e, m, 1);   /* no CTS will come */
        else push(&q->rts_wait, m);
        return 1;
    }
    if (m->kind == K_SDATA) {
        if (m->piece > 0) m->moved += m->piece;
        m->piece = -1;
        if (m->moved < m->hdr.nbytes) return 0;
    }
    unlink_msg(&q->sends, m);                       /* its bytes are out: done */
    finish(e, m, HVDL_OK, NULL);
    return 1;
}

/* With q->smu held: write what the socket takes, frame by frame; a control frame goes
 * first whenever no frame is half written, so that acknowledgements and clear-to-sends
 * never wait behind a ring message waiting for them. */
static void write_locked(engine_t *e, int peer) {
    ppeer_t *q = &e->p2p->peers[peer];
    for (;;) {
        pmsg_t *m = q->cur;
        if (!m) {
            m = q->ctl.head ? q->ctl.head : q->sends.head;
            if (!m) return;
            if (!m->framed && q->mb_state == MB_LIVE && (m->kind == K_EAGER || m->kind == K_RTS)) {
                int bell = 0, rc = mb_put(q, m, e->cfg.p2p_cma, &bell);
                if (rc < 0) {
                    report_lost(e, peer,
                                "broke its point-to-point mailbox (its head moved "
                                "out of range)");
                    return;
                }
                if (rc > 0) {
                    q->blocked = 1;                 /* a ROOM resumes it */
                    return;
                }
                p2p_hdr_t b = {.magic = F_BELL};
                if (bell && queue_ctl(e, peer, &b, NULL)) return;
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
            report_lost(e, peer, why);
            return;
        }
        m->off += n;
        if (m->off < total) continue;
        q->cur = NULL;
        end_frame(e, q, m);
    }
}

static void write_peer(engine_t *e, int peer) {
    ppeer_t *q = &e->p2p->peers[peer];
    pthread_mutex_lock(&q->smu);
    write_locked(e, peer);
    pthread_mutex_unlock(&q->smu);
}

/* ---- the stall inspector ---- */

/* An op has waited past HOROVOD_STALL_SHUTDOWN_TIME_SECONDS: 1 once the job is being
 * failed with msg (the first such op wins; the loop thread tells every rank). */
static int past_shutdown(engine_t *e, pmsg_t *m, double now) {
    return e->cfg.stall_shutdown > 0 && now - m->started > e->cfg.stall_shutdown;
}
static int stall_shutdown(engine_t *e, pmsg_t *m, double now, const char *msg) {
    struct p2p *p = e->p2p;
    if (!past_shutdown(e, m, now)) return 0;
    int none = 0;
    if (atomic_compare_exchange_strong(&p->stall_state, &none, 1)) {
        snprintf(p->stall_msg, sizeof p->stall_msg,
                 "stalled: %s (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS)", msg);
        atomic_store(&p->stall_state, 2);
        hvdl__wake(e);
    }
    return 1;
}

static void stall_check(engine_t *e, double now) {
    struct p2p *p = e->p2p;
    if (!e->cfg.stall_check || now - p->last_stall_check < 1.0) return;
    p->last_stall_check = now;
    for (int i = 0; i < e->size; i++) {
        ppeer_t *q = &p->peers[i];
        pthread_mutex_lock(&q->rmu);
        for (pmsg_t *m = q->recvs.head; m; m = m->next) {
            if (now - m->started < e->cfg.stall_warning) continue;
            if (now - m->warned < e->cfg.stall_warning && !past_shutdown(e, m, now)) continue;
            m->warned = now;
            char sent[512] = "", what[HVDL_MSG_BYTES - 64];
            int k = 0;
            for (pmsg_t *u = q->unexpected.head; u && k < (int)sizeof sent - 80; u = u->next)
                k += snprintf(sent + k, sizeof sent - (size_t)k, "%s'%.64s'", k ? ", " : "",
                              u->name);
            snprintf(what, sizeof what,
                     "recv '%.200s' on rank %d from rank %d has waited %.0f s; rank %d "
                     "has not sent it%s%s%s",
                     m->op->name, e->rank, i, now - m->started, i,
                     k ? " (it sent, unmatched: " : "", sent, k ? "; do the names match?)" : "");
            if (stall_shutdown(e, m, now, what)) {
                pthread_mutex_unlock(&q->rmu);
                return;
            }
            hvdl__log(e, HVDL_LOG_WARNING, "stall: %s", what);
        }
        pthread_mutex_unlock(&q->rmu);
        pthread_mutex_lock(&q->smu);
        /* the send being written, or the oldest announced one the peer has not cleared */
        pmsg_t *m = q->sends.head, *a = q->rts_wait.head;
        if (m && !m->op) m = m->next;               /* a mailbox switch: no op */
        if (!m || (a && a->started < m->started)) m = a;
        char what[HVDL_MSG_BYTES - 64];
        int warn = m && now - m->started >= e->cfg.stall_warning &&
                   (now - m->warned >= e->cfg.stall_warning || past_shutdown(e, m, now));
        if (warn) {
            m->warned = now;
            char how[160];
            if (m == a)
                snprintf(how, sizeof how,
                         "it has not cleared this %lld-byte message (no recv of its name, "
                         "rendezvous)",
                         (long long)m->hdr.nbytes);
            else
                snprintf(how, sizeof how, "%lld of %lld bytes sent",
                         (long long)(m->kind == K_SDATA ? m->moved : m->off),
                         (long long)(m->hdr.nbytes + (int64_t)sizeof m->hdr + m->hdr.name_len));
            snprintf(what, sizeof what,
                     "send '%.200s' on rank %d to rank %d has waited %.0f s; rank %d is "
                     "not reading (%s)",
                     m->op->name, e->rank, i, now - m->started, i, how);
            warn = stall_shutdown(e, m, now, what) ? 2 : 1;
        }
        pthread_mutex_unlock(&q->smu);
        if (warn == 2) return;
        if (warn) hvdl__log(e, HVDL_LOG_WARNING, "stall: %s", what);
    }
}

/* ---- the thread ---- */

#define WAKE_EV UINT32_MAX                  /* the epoll set's tag for wake_fd */

/* With q->smu held: make the thread's epoll set watch q's connection for what it needs
 * now: input unless a waiting caller reads it (readers), output while something is
 * queued to write. A closed connection leaves the set. epoll_ctl changes what a thread
 * asleep in epoll_wait watches without waking it, and wakes it when the new events are
 * already there, so input left unread when the last reader stops is read at once. */
static void arm_locked(struct p2p *p, ppeer_t *q, int peer) {
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
        if (!stop) finish_closed_peers(e, over);
        if (failed || stop || !evs) {
            gave_up = 1;
            if (failed) fail_all(e, status, msg);
            else if (stop)
                fail_all(e, HVDL_ERR_SHUT_DOWN,
                         "horovodlike was shut down before this "
                         "point-to-point op finished");
            else fail_all(e, HVDL_ERR_SYSTEM, "out of memory for the point-to-point thread");
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
            arm_locked(p, q, i);
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
                read_peer(e, (int)i);
                pthread_mutex_unlock(&q->rmu);
            }
            if (!q->closed) write_peer(e, (int)i);
        }
        if (!gave_up) stall_check(e, hvdl_now());
    }
    free(evs);
    return NULL;
}

/* ---- the engine's side: start, stop, enqueue ---- */

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
                                    e->cfg.p2p_eager_bytes, P2P_MAX_NAME);
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

/* After the loop thread has ended: every op still held fails as shut down. */
/* This rank shuts down: F_BYE to every peer, behind what it sent (see "Leaving"). */
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
        if (!q->closed && q->sends.head == m) write_locked(e, i);
        pthread_mutex_unlock(&q->smu);
    }
    hvdl_wakefd_signal(p->wake_fd);
}

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
        fail_list(e, &q->ctl, HVDL_ERR_SHUT_DOWN, "");   /* control frames: freed */
        fail_list(e, &q->awaiting, HVDL_ERR_SHUT_DOWN, "");
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

/* With q->smu held, before the first rendezvous send to peer: a peer on this node is
 * offered a ring (the offer goes out before that send's RTS, so its answer comes back
 * before the CTS); elsewhere, or failing, payloads go over the connection. */
static void offer_ring(engine_t *e, int peer) {
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
    if (queue_ctl(e, peer, &h, NULL)) {
        hvdl__p2p_ring_close(&q->tx);
        return;
    }
    q->ring_state = 1;
}

/* With q->smu held, before the first send to peer: a peer on this node is offered a
 * mailbox, sized to hold at least two of the largest eager records; until it accepts
 * (and after a refusal) announcements go over the connection. */
static void offer_mbox(engine_t *e, int peer) {
    ppeer_t *q = &e->p2p->peers[peer];
    q->mb_state = MB_OFF;
    int64_t rec = (int64_t)record_bytes(P2P_MAX_NAME, e->cfg.p2p_eager_bytes);
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
    if (queue_ctl(e, peer, &h, NULL)) {
        hvdl__p2p_ring_close(&q->mtx);
        return;
    }
    q->mtx_tail = 0;
    q->mb_state = MB_OFFERED;
}

/* The record of a caller's send or recv op (its peer is the op's root rank), or NULL
 * with the op finished with out of memory. */
static pmsg_t *op_msg(engine_t *e, op_t *o) {
    pmsg_t *m = calloc(1, sizeof *m);
    if (!m) {
        finish_bare(e, o, HVDL_ERR_SYSTEM, "out of memory for a point-to-point message");
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
    finish(e, m, HVDL_ERR_INVALID, msg);
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
        finish_closed(e, m, 1);
        return HVDL_OK;
    }
    if (spend_credit(e, q, m)) {                    /* past what the receiver may hold */
        pthread_mutex_unlock(&q->smu);
        return HVDL_OK;
    }
    if (q->mb_state == MB_NONE) offer_mbox(e, m->peer);
    if (m->kind == K_RTS && q->ring_state == 0) offer_ring(e, m->peer);
    push(&q->sends, m);
    if (q->closed) {                                /* the p2p thread fails it (report_closed) */
        pthread_mutex_unlock(&q->smu);
        report_closed(e, m->peer);
        return HVDL_OK;
    }
    if (q->sends.head == m) write_locked(e, m->peer);
    /* the thread watches what is left: the socket (for room), and an announced send's
     * wait (for a failure or a stall: only a thread asleep without a timeout must be
     * woken for that; seq_cst with its sleeping flag, see p2p_main) */
    int queued = q->sends.head || q->ctl.head || q->cur ||
                 (q->rts_wait.head && atomic_load(&p->sleeping));
    pthread_mutex_unlock(&q->smu);
    if (queued) hvdl_wakefd_signal(p->wake_fd);
    return HVDL_OK;
}

/* On a caller's thread, after it took the peer's receiving side: control frames it
 * queued (a CTS, a ROOM), and sends the frames it read cleared (a CTS answered: DATA),
 * are written now, and what the socket does not take is left to the p2p thread, whose
 * epoll set then watches the connection for room (arm_locked). */
static void caller_flush(engine_t *e, int peer) {
    ppeer_t *q = &e->p2p->peers[peer];
    pthread_mutex_lock(&q->smu);
    if (q->ctl.head || q->cur || (q->sends.head && !q->blocked)) {
        if (!q->closed) write_locked(e, peer);
        arm_locked(e->p2p, q, peer);
    }
    pthread_mutex_unlock(&q->smu);
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
    if (stopped) finish(e, m, HVDL_ERR_SHUT_DOWN, "horovodlike has been shut down");
    else if (failed) finish(e, m, status, msg);
    else if (mb_drain(e, m->peer) == 0) post_recv(e, m, over);
    else push(&q->recvs, m);                        /* the peer broke: the thread fails it */
    pthread_mutex_unlock(&q->rmu);
    caller_flush(e, o->meta.root_rank);
    /* seq_cst, with the thread's sleeping flag: it watches this op (see p2p_main) */
    if (atomic_load(&p->sleeping)) hvdl_wakefd_signal(p->wake_fd);
    return HVDL_OK;
}

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
 * looks, the p2p thread does not watch the connection for input (readers; arm_locked
 * takes the connection out of the thread's epoll set for input without waking it), so
 * a message does not wake both. When the last reader stops (its op done, or going to
 * sleep on it) the thread watches again, and what came meanwhile wakes it at once: it
 * reads whatever no caller waits for, so no posting order deadlocks. Reading is under
 * rmu, as the thread's: one reader at a time (a second caller's look skips a turn),
 * and frames are parsed and checked by the same code (parse, header_problem). */
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
        arm_locked(p, q, o->meta.root_rank);
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
        if (!was) read_peer(e, peer);
        int closed = !was && atomic_load(&q->closed);
        if (!q->caller_read && atomic_load(&o->done) && o->status == HVDL_OK) {
            q->caller_read = 1;
            hvdl__log(e, HVDL_LOG_DEBUG,
                      "point-to-point messages with rank %d are read by the waiting caller", peer);
        }
        pthread_mutex_unlock(&q->rmu);
        caller_flush(e, peer);
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
    mb_drain(e, peer);
    pthread_mutex_unlock(&q->rmu);
    caller_flush(e, peer);
}

/* The caller stops polling (its op is done, or it goes to sleep). A record put while
 * it polled rang no bell: after the count drops (seq_cst, against the sender's store of
 * the tail and load of the count) one more look takes it, waiting for rmu if need be.
 * A connection's last reader gives its input back to the thread (arm_locked). */
void hvdl__p2p_poll_end(engine_t *e, const op_t *o) {
    int peer = o->meta.root_rank;
    ppeer_t *q = &e->p2p->peers[peer];
    if (owns_reads(e, o)) {
        pthread_mutex_lock(&q->smu);
        atomic_fetch_sub(&q->readers, 1);
        arm_locked(e->p2p, q, peer);
        pthread_mutex_unlock(&q->smu);
        return;
    }
    atomic_fetch_sub(hvdl__p2p_mbox_word(&q->mrx, MBOX_POLLING), 1);
    if (atomic_load(hvdl__p2p_mbox_word(&q->mrx, MBOX_TAIL)) ==
        atomic_load(hvdl__p2p_mbox_word(&q->mrx, MBOX_HEAD)))
        return;
    pthread_mutex_lock(&q->rmu);
    mb_drain(e, peer);
    pthread_mutex_unlock(&q->rmu);
    caller_flush(e, peer);
}

/* Local checks of a send or recv; called with e->mu held. */
static int check_p2p(engine_t *e, const hvdl_request *q, int64_t *nbytes) {
    const char *what = q->op == HVDL_OP_SEND ? "send" : "recv";
    if (!q->name || !*q->name) return hvdl__err(HVDL_ERR_INVALID, "every %s needs a name", what);
    if (strlen(q->name) > P2P_MAX_NAME)
        return hvdl__err(HVDL_ERR_INVALID, "%s: name longer than %d bytes: '%.64s...'", what,
                         P2P_MAX_NAME, q->name);
    if (q->name_len && (int64_t)strlen(q->name) != q->name_len)
        return hvdl__err(HVDL_ERR_INVALID, "%s: the name '%s...' contains a NUL byte", what,
                         q->name);
    int peer = q->root_rank;
    const char *role = q->op == HVDL_OP_SEND ? "destination" : "source";
    if (peer < 0 || peer >= e->size)
        return hvdl__err(HVDL_ERR_INVALID, "%s '%s': %s rank %d is not a rank of the job (size %d)",
                         what, q->name, role, peer, e->size);
    if (peer == e->rank)
        return hvdl__err(HVDL_ERR_INVALID, "%s '%s': rank %d cannot %s itself", what, q->name,
                         e->rank, q->op == HVDL_OP_SEND ? "send to" : "receive from");
    group_t *g = q->process_set >= 0 && q->process_set < HVDL_MAX_SETS ? e->sets[q->process_set]
                                                                       : NULL;
    if (!g || g->removed)
        return hvdl__err(HVDL_ERR_INVALID, "%s '%s': process set %d does not exist", what, q->name,
                         q->process_set);
    int member = 0;
    for (int i = 0; i < g->n; i++) member |= g->ranks[i] == peer;
    if (g->me < 0)
        return hvdl__err(HVDL_ERR_INVALID, "%s '%s': rank %d is not a member of process set %d",
                         what, q->name, e->rank, q->process_set);
    if (!member)
        return hvdl__err(HVDL_ERR_INVALID, "%s '%s': %s rank %d is not a member of process set %d",
                         what, q->name, role, peer, q->process_set);
    *nbytes = 0;
    int into = q->op == HVDL_OP_RECV && (q->flags & HVDL_RECV_INTO);
    if (q->op == HVDL_OP_RECV && !into) return HVDL_OK;
    if (!hvdl_dtype_size(q->dtype))
        return hvdl__err(HVDL_ERR_INVALID, "%s '%s': unknown dtype %d", what, q->name, q->dtype);
    if (q->ndim < 0 || q->ndim > HVDL_MAX_DIMS)
        return hvdl__err(HVDL_ERR_INVALID, "%s '%s': %d dimensions; at most %d are supported", what,
                         q->name, q->ndim, HVDL_MAX_DIMS);
    int64_t n = hvdl_dtype_size(q->dtype);
    for (int d = 0; d < q->ndim; d++) {
        if (q->shape[d] < 0)
            return hvdl__err(HVDL_ERR_INVALID, "%s '%s': negative dimension", what, q->name);
        if (q->shape[d] && n > P2P_MAX_BYTES / q->shape[d])
            return hvdl__err(HVDL_ERR_INVALID, "%s '%s': more than %lld bytes", what, q->name,
                             (long long)P2P_MAX_BYTES);
        n *= q->shape[d];
    }
    if (n && !(into ? q->output : q->input))
        return hvdl__err(HVDL_ERR_INVALID, "%s '%s': buffer is NULL", what, q->name);
    *nbytes = n;
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
