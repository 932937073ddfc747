/*
 * The peers and the connections to them: the address blob, the authenticated handshake,
 * sockets, and the control frames that travel over them (net.c). The data plane's
 * transport (tcp.c) is what the algorithms see of it (transport.h).
 */
#ifndef HVDL_NET_H
#define HVDL_NET_H
#include "engine.h"

/* Per-peer connection state (net.c). Control frames arrive on ctrl; data on data.
 * Owners: what the blob says (host .. agreed) is written at start and read-only after;
 * data_fd and ctrl belong to whoever holds the engine's drive lock (the loop thread, or
 * a caller running its work: engine.h), which reads, sends and executes; p2p_fd is the
 * p2p thread's and its callers' (p2p.c). */
typedef struct conn {
    int fd;
    buf_t rx;                /* bytes read but not yet parsed into frames */
    int eof;                 /* closed after a goodbye: frames in rx still count */
    double last_rx, last_tx; /* when bytes last arrived / a frame was last sent (liveness) */
} conn_t;

typedef struct peer {
    char host[128];
    char ip[64];
    int port;
    uint64_t nonce;          /* proves a connection was meant for this job and rank */
    agreed_t agreed;         /* its settings that must equal everyone's (config.h) */
    int data_fd;             /* full mesh, -1 for self */
    conn_t ctrl;             /* control plane is a star: workers <-> rank 0 */
    int p2p_fd;              /* full mesh for point-to-point messages (p2p.c owns it) */
} peer_t;

/* The wire's magic number and version: the blob, the hello and every control frame. */
#define WIRE_MAGIC 0x4876444cu   /* "HvDL" */
#define WIRE_VERSION 3u
#define HVDL_MAX_FRAME (256ll << 20)   /* a longer control frame is malformed */
typedef struct frame_hdr {
    uint32_t magic, type;
    int64_t len;
} frame_hdr_t;

/* Frame types on the control plane. */
enum {
    MSG_REQUESTS = 1,        /* worker -> rank 0: bits of cached requests + full ones */
    MSG_RESPONSES = 2,       /* rank 0 -> workers: the ordered list of responses */
    MSG_BYE = 3,             /* worker -> rank 0: this rank called shutdown */
    MSG_ABORT = 4,           /* any -> any: the job failed; payload is the message */
    MSG_PING = 5,            /* start-up clock sync: worker -> rank 0 */
    MSG_PONG = 6,            /* rank 0 -> worker: rank 0's wall clock */
    MSG_HEARTBEAT = 7,       /* either way, when nothing else was sent for a while */
    MSG_NODE_DONE = 8,       /* worker -> rank 0: its node's ranks all posted these cache ids */
    MSG_NODE_POSTED = 9,     /* node leader -> rank 0: the bits it took out of a word */
    MSG_NODE_CLOSE = 10,     /* rank 0 -> node leader: take a word over for a round */
    MSG_NODE_REOPEN = 11,    /* rank 0 -> node leader: a join ended; each word's round */
    MSG_WAITS = 12           /* worker -> rank 0: it is blocked, on these ops (deadlock.c) */
};

/* net.c: control frames over the control star, and waiting on control traffic */
int hvdl__ctrl_read(engine_t *e, int peer); /* buffer what arrived; -1 once the peer has closed */
int hvdl__send_frame(engine_t *e, int peer, int type, const void *p, int64_t n);
/* The next complete frame buffered from peer: 1 (payload malloc'd), 0 (none), -1 (failed) */
int hvdl__frame_take(engine_t *e, int peer, int *type, uint8_t **payload, int64_t *len);
/* The loop's one blocking point; returns a peer whose connection closed, or -1 */
int hvdl__wait_control(engine_t *e, int timeout_ms, int wake_fd);
int hvdl__control_fds(engine_t *e, int *fds, int *ranks, int cap);
int hvdl__control_readable(engine_t *e, int peer);
const char *hvdl__closed_why(engine_t *e, int peer); /* its connection closed: mid-frame or not */
int hvdl__buffered_abort(engine_t *e); /* -1: an ABORT was buffered, now failed */
int hvdl__watch_control(engine_t *e, int timeout_ms);
int hvdl__startup_abort(engine_t *e, int timeout_ms); /* -1: an ABORT arrived, now failed */

/* sockets.c: listening, socket options, blocking I/O with a deadline, closing */
int hvdl__listen(engine_t *e);
void hvdl__tune_socket(engine_t *e, int fd);
int hvdl__set_nonblocking(int fd);
int hvdl__io_full(int fd, void *p, size_t n, int writing, double deadline);
void hvdl__close_all(engine_t *e);

/* handshake.c: connecting every pair, authenticated by the job key */
int hvdl__connect_all(engine_t *e);

/* blob.c: the address blob every rank publishes */
void hvdl__blob_write(engine_t *e, int port, const char *ip, char *out);
int hvdl__blob_read(const char *in, peer_t *p);

transport_t *hvdl__tcp_transport(engine_t *e);

#endif
