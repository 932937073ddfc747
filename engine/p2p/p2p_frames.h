/*
 * The point-to-point frames (p2p_frames.c): what goes over a pair's p2p connection and,
 * as records, through its mailbox. Pure: a header's bytes in, a reason out; nothing here
 * knows the engine, so tests/c/test_p2p_frames.c checks every frame and its hostile
 * variants, as tests/c/test_frames.c does for the control frames (wire.c).
 *
 * Frame (p2p_hdr_t, 88 bytes, then the name, then nbytes of payload):
 *   magic, name_len (1..HVDL_MAX_NAME), dtype, ndim (0..8), shape[8], nbytes.
 * Every field is range-checked before anything is trusted (hvdl__p2p_header_problem),
 * nbytes must equal the shape's size and is bounded by P2P_MAX_BYTES, and a peer that
 * breaks this is named by the loop thread as lost (hvdl__p2p_tend), which tells the job.
 *
 * The same header starts each record of the mailbox (p2p_mailbox.c): header, name,
 * payload (an eager message's; an RTSA's is the sender's address), padded to 8 bytes.
 */
#ifndef HVDL_P2P_FRAMES_H
#define HVDL_P2P_FRAMES_H
#include "horovodlike.h"
#include <stdint.h>

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
#define F_BYE 0x45594248u     /* in send order: this rank has shut down (p2p_read.c, "Leaving") */
#define P2P_MAX_BYTES ((int64_t)1 << 40)  /* a longer message is malformed */
/* The offers' sizes: a ring's slot, a mailbox's bytes. */
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

/* Why this header cannot be a frame, or NULL: bad magic, a control frame with a name,
 * dtype or shape, a size out of range, a credit of nothing, a name length out of range,
 * an unknown dtype, dimensions out of range or beyond ndim, or a byte count that does not
 * match dtype and shape (tests/test_engine_hostile.py sends each case over a real
 * connection). */
const char *hvdl__p2p_header_problem(const void *hdr);
int hvdl__p2p_named_frame(uint32_t magic); /* a frame with a name (and dtype, shape) */
/* A name of len bytes, NUL-terminated after them: NULL, or what is wrong with it. */
const char *hvdl__p2p_name_problem(const char *name, uint32_t len);

/* The mailbox's records. */
uint64_t hvdl__p2p_record_bytes(int64_t name_len, int64_t payload);
int64_t hvdl__p2p_record_payload(const p2p_hdr_t *h);
/* avail bytes put past the reader's position in a mailbox of cap bytes: NULL when a
 * header may be read there, else what is wrong. */
const char *hvdl__p2p_fill_problem(uint64_t avail, uint64_t cap);
/* Why the record whose header is h, with avail bytes put, cannot be taken, or NULL:
 * the header's own checks, a frame the mailbox does not carry (only EAGER, RTS, RTSA and
 * FIN), or a record longer than what was put. */
const char *hvdl__p2p_record_problem(const p2p_hdr_t *h, uint64_t avail);

#endif
