/*
 * The small control frames, encoded and decoded in wire.c like the negotiation messages
 * (internal.h: MSG_REQUESTS, MSG_RESPONSES). Every layout has a fixed size or a bounded
 * count, and a decoder refuses a frame that is shorter or longer than its fields with a
 * reason (reader_t.why), which the receiver reports naming the peer.
 *
 *   MSG_BYE          i32 who [, u64 log position, at most HVDL_BYE_TEXT bytes of text]:
 *                    a worker's is its rank alone; rank 0's names who asked, how far
 *                    rank 0 executed the segment's log (negotiate_shm.c) and the ops
 *                    others submitted and `who` never did
 *   MSG_PING         empty (start-up clock sync, clock.c)
 *   MSG_PONG         f64 rank 0's wall clock in microseconds
 *   MSG_NODE_DONE    n x i32 cache ids, n <= HVDL_NEG_IDS (negotiate_nodes.c)
 *   MSG_NODE_POSTED  i32 cache id, 4 zero bytes, u64 local-rank mask, f64 seconds waited
 *   MSG_NODE_CLOSE   i32 cache id (HVDL_CLOSE_ALL: every id, for a join), u32 round
 *   MSG_NODE_REOPEN  n x u32 rounds, n <= HVDL_NEG_IDS
 *   MSG_WAITS        u64 posts, f64 seconds blocked (< 0: not), u8 partial, u32 n,
 *                    n x {i32 op, i32 process set, i32 peer (-1: a collective), u8
 *                    waited, str name}, n <= HVDL_WAITS_MAX (deadlock.c)
 * Integers are in host order, as everywhere on the control plane.
 */
#ifndef HVDL_FRAMES_H
#define HVDL_FRAMES_H
#include <stdint.h>
#include "util.h"

/* Cache ids a node's segment negotiates (both negotiators); higher ones go through rank 0.
 * It also bounds the node frames' counts. */
#define HVDL_NEG_IDS 4096

#define HVDL_BYE_TEXT 512
#define HVDL_BYE_MAX (12 + HVDL_BYE_TEXT)
typedef struct bye {
    int32_t who;             /* the rank that called shutdown */
    int has_pos;             /* rank 0's goodbye: the fields below are there */
    uint64_t pos;            /* entries of the segment's log rank 0 executed */
    const char *text;        /* ops `who` never submitted: not NUL-terminated */
    int ntext;
} bye_t;
/* The frame's bytes into out (HVDL_BYE_MAX); returns its length. Text past
 * HVDL_BYE_TEXT is cut. */
int64_t hvdl__put_bye(uint8_t *out, const bye_t *b);
int hvdl__read_bye(reader_t *r, bye_t *out);         /* text points into the frame */

#define HVDL_PONG_BYTES 8
int hvdl__read_ping(reader_t *r);
void hvdl__put_pong(uint8_t *out, double wall_us);   /* HVDL_PONG_BYTES */
int hvdl__read_pong(reader_t *r, double *wall_us);

/* MSG_NODE_DONE and MSG_NODE_REOPEN: up to HVDL_NEG_IDS 4-byte values. out holds
 * 4 * HVDL_NEG_IDS bytes; the read fills at most HVDL_NEG_IDS values and their count. */
int64_t hvdl__put_words(uint8_t *out, const void *values, int n);
int hvdl__read_words(reader_t *r, uint32_t *out, int *n);

#define HVDL_NODE_POSTED_BYTES 24
typedef struct node_posted {
    int32_t id;
    uint64_t mask;           /* the node's local ranks whose bits were taken */
    double waited;           /* seconds the word had stayed partly set (0: not a stall) */
} node_posted_t;
void hvdl__put_node_posted(uint8_t *out, const node_posted_t *m);
int hvdl__read_node_posted(reader_t *r, node_posted_t *out);

#define HVDL_NODE_CLOSE_BYTES 8
#define HVDL_CLOSE_ALL (-1)
typedef struct node_close {
    int32_t id;
    uint32_t round;
} node_close_t;
void hvdl__put_node_close(uint8_t *out, const node_close_t *m);
int hvdl__read_node_close(reader_t *r, node_close_t *out);
#endif
