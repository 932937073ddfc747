/* The shared-memory mailbox of one (src, dst) pair on one node (p2p_ring.c). */
#ifndef HVDL_P2P_RING_H
#define HVDL_P2P_RING_H
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct p2p_ring {
    uint8_t *base; /* NULL: not mapped */
    size_t bytes;
    int64_t slot_bytes;
    int nslots;
    int fd;         /* the creator's memfd (-1 at the reader) */
    uint64_t token; /* the creator's proof, in the first page */
} p2p_ring_t;

/* 0, or an errno. */
int hvdl__p2p_ring_create(p2p_ring_t *r, int64_t slot_bytes, int nslots);
/* The ring the creator (pid) offered as fd with token: 0, or an errno. */
int hvdl__p2p_ring_attach(p2p_ring_t *r, int64_t pid, int64_t fd, uint64_t token,
                          int64_t slot_bytes, int nslots);
void hvdl__p2p_ring_close(p2p_ring_t *r); /* unmaps and closes; a closed ring is a no-op */
uint8_t *hvdl__p2p_ring_slot(const p2p_ring_t *r, int64_t piece);

/* The same segment as a mailbox (one slot of slot_bytes, a byte ring of records): its
 * control words live in the token's page, each on a cache line of its own. */
enum { MBOX_TAIL, MBOX_HEAD, MBOX_POLLING, MBOX_WANT_ROOM, MBOX_BELLED };
_Atomic uint64_t *hvdl__p2p_mbox_word(const p2p_ring_t *r, int which);
/* Copy n bytes in at / out from byte position pos (modulo the ring; out to NULL drops). */
void hvdl__p2p_mbox_put(const p2p_ring_t *r, uint64_t pos, const void *src, size_t n);
void hvdl__p2p_mbox_get(const p2p_ring_t *r, uint64_t pos, void *dst, size_t n);

#endif
