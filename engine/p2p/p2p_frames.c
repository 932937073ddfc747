/*
 * The point-to-point frames' checks (p2p_frames.h): every length and field a peer sends,
 * over its connection or in its mailbox, is checked here before anything is trusted.
 * Pure functions of the bytes; the readers (p2p_read.c, p2p_mailbox.c) report a peer
 * whose frame fails them as lost, with the reason.
 */
#include "p2p_frames.h"
#include <string.h>

/* Why this header cannot be a message, or NULL (tests/test_engine_hostile.py sends each
 * case over a real connection). */
int hvdl__p2p_named_frame(uint32_t magic) {
    return magic == P2P_MAGIC || magic == F_RTS || magic == F_CTS || magic == F_DATA ||
           magic == F_SDATA || magic == F_RTSA || magic == F_FIN;
}

const char *hvdl__p2p_header_problem(const void *hdr) {
    const p2p_hdr_t *h = hdr;
    if (!hvdl__p2p_named_frame(h->magic)) {
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
    if (h->name_len < 1 || h->name_len > HVDL_MAX_NAME) return "name length out of range";
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

const char *hvdl__p2p_name_problem(const char *name, uint32_t len) {
    return strlen(name) != len ? "a NUL byte in a name" : NULL;
}

/* A record's bytes in the mailbox: header, name, payload, then padding to 8 bytes. */
uint64_t hvdl__p2p_record_bytes(int64_t name_len, int64_t payload) {
    return ((uint64_t)sizeof(p2p_hdr_t) + (uint64_t)name_len + (uint64_t)payload + 7) & ~7ull;
}

/* What follows a record's name: an eager message's payload, an RTSA's address. */
int64_t hvdl__p2p_record_payload(const p2p_hdr_t *h) {
    return h->magic == P2P_MAGIC ? h->nbytes : h->magic == F_RTSA ? (int64_t)sizeof(uint64_t) : 0;
}

const char *hvdl__p2p_fill_problem(uint64_t avail, uint64_t cap) {
    return avail > cap || avail < sizeof(p2p_hdr_t) ? "a mailbox filled out of range" : NULL;
}

const char *hvdl__p2p_record_problem(const p2p_hdr_t *h, uint64_t avail) {
    const char *bad = hvdl__p2p_header_problem(h);
    if (!bad && h->magic != P2P_MAGIC && h->magic != F_RTS && h->magic != F_RTSA &&
        h->magic != F_FIN)
        bad = "a frame the mailbox does not carry";
    else if (!bad && hvdl__p2p_record_bytes(h->name_len, hvdl__p2p_record_payload(h)) > avail)
        bad = "a mailbox record longer than what was put";
    return bad;
}
