/*
 * The point-to-point frames (engine/p2p/p2p_frames.c): every frame a peer may send over
 * its p2p connection or put in its mailbox is accepted as the engine writes it, and each
 * hostile variant is refused with its reason: bad magic, a name length out of range, a
 * bad dtype or shape, a byte count that does not match, an offer or piece out of range, a
 * credit of nothing, a goodbye with a size, a control frame carrying a name or a shape, a
 * NUL byte in a name, and in the mailbox a
 * fill out of range, a record the mailbox does not carry, and a record cut short of what
 * was put. These are the bytes a peer controls: a check that trusted one field too far
 * fails here (tests/test_engine_hostile.py sends the same cases over real connections).
 */
#include "harness.h"
#include "p2p_frames.h"
#include <stdio.h>
#include <string.h>

/* A header as the bytes a peer sends (little-endian, the layout of p2p_hdr_t), so that
 * the checks are run on bytes laid out by hand, not on a struct this file filled in. */
typedef union {
    uint8_t b[sizeof(p2p_hdr_t)];
    p2p_hdr_t h;
} wire_t;

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* magic, name_len, dtype, ndim, shape[8], nbytes: offsets 0, 4, 8, 12, 16, 80. */
static wire_t frame(uint32_t magic, uint32_t name_len, int32_t dtype, int32_t ndim,
                    const int64_t *shape, int64_t nbytes) {
    wire_t w;
    memset(&w, 0, sizeof w);
    put32(w.b, magic);
    put32(w.b + 4, name_len);
    put32(w.b + 8, (uint32_t)dtype);
    put32(w.b + 12, (uint32_t)ndim);
    for (int d = 0; shape && d < HVDL_MAX_DIMS; d++) put64(w.b + 16 + 8 * d, (uint64_t)shape[d]);
    put64(w.b + 80, (uint64_t)nbytes);
    return w;
}

#define ACCEPTS(w, what)                                                              \
    do {                                                                              \
        const char *why_ = hvdl__p2p_header_problem((w).b);                           \
        CHECK(!why_, "%s: a well-formed frame refused (%s)", what, why_ ? why_ : ""); \
    } while (0)
#define REFUSES(w, reason, what)                                              \
    do {                                                                      \
        const char *why_ = hvdl__p2p_header_problem((w).b);                   \
        CHECK(why_ && !strcmp(why_, reason), "%s: got '%s', want '%s'", what, \
              why_ ? why_ : "(accepted)", reason);                            \
    } while (0)

static const uint32_t NAMED[] = {P2P_MAGIC, F_RTS, F_CTS, F_DATA, F_SDATA, F_RTSA, F_FIN};
/* The answers and signals, F_BYE among them: nothing but their magic. */
static const uint32_t ANSWERS[] = {F_RING_OK, F_RING_NO, F_MBOX_OK, F_MBOX_NO,
                                   F_SWITCH,  F_BELL,    F_ROOM,    F_BYE};

/* The frames with a name: EAGER, RTS, CTS, DATA, SDATA, RTSA, FIN. */
static void test_named(void) {
    const int64_t s34[HVDL_MAX_DIMS] = {3, 4};
    char what[64];
    for (size_t i = 0; i < sizeof NAMED / sizeof *NAMED; i++) {
        uint32_t m = NAMED[i];
        snprintf(what, sizeof what, "named frame %08x", m);
        CHECK(hvdl__p2p_named_frame(m), "%s is a frame with a name", what);
        ACCEPTS(frame(m, 5, HVDL_FLOAT32, 2, s34, 48), what);
        ACCEPTS(frame(m, 1, HVDL_UINT8, 0, NULL, 1), what);           /* a scalar */
        ACCEPTS(frame(m, HVDL_MAX_NAME, HVDL_INT64, 1, (int64_t[8]){0}, 0), what); /* empty */
        REFUSES(frame(m, 0, HVDL_FLOAT32, 2, s34, 48), "name length out of range", what);
        REFUSES(frame(m, HVDL_MAX_NAME + 1, HVDL_FLOAT32, 2, s34, 48), "name length out of range",
                what);
        REFUSES(frame(m, UINT32_MAX, HVDL_FLOAT32, 2, s34, 48), "name length out of range", what);
        REFUSES(frame(m, 5, -1, 2, s34, 48), "unknown dtype", what);
        REFUSES(frame(m, 5, HVDL_NUM_DTYPES, 2, s34, 48), "unknown dtype", what);
        REFUSES(frame(m, 5, HVDL_FLOAT32, -1, s34, 48), "dimensions out of range", what);
        REFUSES(frame(m, 5, HVDL_FLOAT32, HVDL_MAX_DIMS + 1, s34, 48), "dimensions out of range",
                what);
        REFUSES(frame(m, 5, HVDL_FLOAT32, 2, (int64_t[8]){3, -4}, 48), "negative dimension", what);
        REFUSES(frame(m, 5, HVDL_FLOAT32, 1, s34, 12), "a dimension beyond ndim", what);
        REFUSES(frame(m, 5, HVDL_FLOAT32, 2, s34, 47), "byte count does not match dtype and shape",
                what);
        REFUSES(frame(m, 5, HVDL_FLOAT32, 2, s34, -48), "byte count does not match dtype and shape",
                what);
        /* Sizes: exactly P2P_MAX_BYTES is a message, one element more is not, and a shape
         * whose product overflows int64 is refused before it is multiplied. */
        ACCEPTS(frame(m, 5, HVDL_UINT8, 1, (int64_t[8]){P2P_MAX_BYTES}, P2P_MAX_BYTES), what);
        REFUSES(frame(m, 5, HVDL_UINT8, 1, (int64_t[8]){P2P_MAX_BYTES + 1}, P2P_MAX_BYTES + 1),
                "size out of range", what);
        REFUSES(frame(m, 5, HVDL_FLOAT64, 3, (int64_t[8]){1 << 30, 1 << 30, 1 << 30}, 0),
                "size out of range", what);
        REFUSES(frame(m, 5, HVDL_UINT8, 2, (int64_t[8]){INT64_MAX, INT64_MAX}, 0),
                "size out of range", what);
    }
}

/* The frames without a name: PIECE, ACK, RING, MBOX, CREDIT and the answers. */
static void test_control(void) {
    char what[64];
    /* PIECE and ACK: 1 .. RING_MAX_SLOT bytes */
    for (uint32_t m = F_PIECE, k = 0; k < 2; k++, m = F_ACK) {
        snprintf(what, sizeof what, "frame %08x", m);
        CHECK(!hvdl__p2p_named_frame(m), "%s has no name", what);
        ACCEPTS(frame(m, 0, 0, 0, NULL, 1), what);
        ACCEPTS(frame(m, 0, 0, 0, NULL, RING_MAX_SLOT), what);
        REFUSES(frame(m, 0, 0, 0, NULL, 0), "piece size out of range", what);
        REFUSES(frame(m, 0, 0, 0, NULL, RING_MAX_SLOT + 1), "piece size out of range", what);
        REFUSES(frame(m, 0, 0, 0, NULL, -1), "piece size out of range", what);
        REFUSES(frame(m, 1, 0, 0, NULL, 1), "a control frame with a name or dtype", what);
        REFUSES(frame(m, 0, HVDL_FLOAT32, 0, NULL, 1), "a control frame with a name or dtype",
                what);
        REFUSES(frame(m, 0, 0, 1, NULL, 1), "a control frame with a name or dtype", what);
        REFUSES(frame(m, 0, 0, 0, (int64_t[8]){[7] = 1}, 1), "a control frame with a shape", what);
    }
    /* RING: slot bytes, then (nslots, pid, fd, token) in the shape; nothing after them */
    const int64_t ring[HVDL_MAX_DIMS] = {8, 4242, 17, (int64_t)0x8877665544332211ull};
    ACCEPTS(frame(F_RING, 0, 0, 0, ring, RING_MIN_SLOT), "a ring offer");
    ACCEPTS(frame(F_RING, 0, 0, 0, (int64_t[8]){2}, RING_MAX_SLOT), "a ring offer, 2 slots");
    ACCEPTS(frame(F_RING, 0, 0, 0, (int64_t[8]){64}, RING_MIN_SLOT), "a ring offer, 64 slots");
    REFUSES(frame(F_RING, 0, 0, 0, ring, RING_MIN_SLOT - 1), "ring size out of range", "ring");
    REFUSES(frame(F_RING, 0, 0, 0, ring, RING_MAX_SLOT + 1), "ring size out of range", "ring");
    REFUSES(frame(F_RING, 0, 0, 0, (int64_t[8]){1}, RING_MIN_SLOT), "ring size out of range",
            "a ring of one slot");
    REFUSES(frame(F_RING, 0, 0, 0, (int64_t[8]){65}, RING_MIN_SLOT), "ring size out of range",
            "a ring of 65 slots");
    REFUSES(frame(F_RING, 0, 0, 0, (int64_t[8]){8, 1, 2, 3, 4}, RING_MIN_SLOT),
            "a control frame with a shape", "a ring offer with a fifth field");
    REFUSES(frame(F_RING, 3, 0, 0, ring, RING_MIN_SLOT), "a control frame with a name or dtype",
            "a ring offer with a name");
    /* MBOX: its bytes, then (1, pid, fd, token) */
    const int64_t mbox[HVDL_MAX_DIMS] = {1, 4242, 18, 99};
    ACCEPTS(frame(F_MBOX, 0, 0, 0, mbox, MBOX_MIN), "a mailbox offer");
    ACCEPTS(frame(F_MBOX, 0, 0, 0, mbox, MBOX_MAX), "the largest mailbox offer");
    REFUSES(frame(F_MBOX, 0, 0, 0, mbox, MBOX_MIN - 1), "mailbox size out of range", "mbox");
    REFUSES(frame(F_MBOX, 0, 0, 0, mbox, MBOX_MAX + 1), "mailbox size out of range", "mbox");
    REFUSES(frame(F_MBOX, 0, 0, 0, (int64_t[8]){2, 4242, 18, 99}, MBOX_MIN),
            "mailbox size out of range", "a mailbox of two slots");
    REFUSES(frame(F_MBOX, 0, 0, 0, (int64_t[8]){1, 2, 3, 4, 5}, MBOX_MIN),
            "a control frame with a shape", "a mailbox offer with a fifth field");
    /* CREDIT: a positive number of bytes given back (whether the peer was given that
     * much is the credit's own check, p2p_credit.c), nothing else */
    CHECK(!hvdl__p2p_named_frame(F_CREDIT), "a credit has no name");
    ACCEPTS(frame(F_CREDIT, 0, 0, 0, NULL, 1), "a credit of one byte");
    ACCEPTS(frame(F_CREDIT, 0, 0, 0, NULL, INT64_MAX), "the largest credit");
    REFUSES(frame(F_CREDIT, 0, 0, 0, NULL, 0), "credit of nothing", "a credit of 0");
    REFUSES(frame(F_CREDIT, 0, 0, 0, NULL, -1), "credit of nothing", "a negative credit");
    REFUSES(frame(F_CREDIT, 0, 0, 0, NULL, INT64_MIN), "credit of nothing", "credit INT64_MIN");
    REFUSES(frame(F_CREDIT, 0, 0, 0, (int64_t[8]){1}, 64), "a control frame with a shape",
            "a credit with a shape");
    REFUSES(frame(F_CREDIT, 0, 0, 0, (int64_t[8]){[7] = 1}, 64), "a control frame with a shape",
            "a credit with a shape");
    REFUSES(frame(F_CREDIT, 4, 0, 0, NULL, 64), "a control frame with a name or dtype",
            "a credit with a name");
    REFUSES(frame(F_CREDIT, 0, HVDL_FLOAT32, 0, NULL, 64), "a control frame with a name or dtype",
            "a credit with a dtype");
    REFUSES(frame(F_CREDIT, 0, 0, 1, NULL, 64), "a control frame with a name or dtype",
            "a credit with ndim");
    /* the answers and signals (a goodbye too): nothing but their magic */
    for (size_t i = 0; i < sizeof ANSWERS / sizeof *ANSWERS; i++) {
        uint32_t m = ANSWERS[i];
        snprintf(what, sizeof what, "answer %08x", m);
        CHECK(!hvdl__p2p_named_frame(m), "%s has no name", what);
        ACCEPTS(frame(m, 0, 0, 0, NULL, 0), what);
        REFUSES(frame(m, 0, 0, 0, NULL, 1), "a ring answer with a size", what);
        REFUSES(frame(m, 0, 0, 0, (int64_t[8]){1}, 0), "a control frame with a shape", what);
        REFUSES(frame(m, 4, 0, 0, NULL, 0), "a control frame with a name or dtype", what);
        REFUSES(frame(m, 0, 0, 0, NULL, -1), "a ring answer with a size", what);
    }
}

/* Any magic but the 20 is refused, whatever follows it: each magic with one bit flipped
 * (none of them is another's), zero, all ones, and the control plane's. */
static void test_magic(void) {
    uint32_t all[32];
    int n = 0;
    for (size_t i = 0; i < sizeof NAMED / sizeof *NAMED; i++) all[n++] = NAMED[i];
    for (size_t i = 0; i < sizeof ANSWERS / sizeof *ANSWERS; i++) all[n++] = ANSWERS[i];
    all[n++] = F_PIECE, all[n++] = F_ACK, all[n++] = F_RING, all[n++] = F_MBOX;
    all[n++] = F_CREDIT;
    CHECK(n == 20, "%d frame magics, want 20", n);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++) CHECK(all[i] != all[j], "two frames share magic %08x", all[i]);
    const int64_t s34[HVDL_MAX_DIMS] = {3, 4};
    for (int i = 0; i < n; i++)
        for (int bit = 0; bit < 32; bit++) {
            uint32_t m = all[i] ^ (1u << bit);
            int other = 0;
            for (int j = 0; j < n; j++) other |= m == all[j];
            if (other) continue;
            REFUSES(frame(m, 5, HVDL_FLOAT32, 2, s34, 48), "bad magic", "a flipped magic");
            REFUSES(frame(m, 0, 0, 0, NULL, 0), "bad magic", "a flipped magic");
        }
    REFUSES(frame(0, 0, 0, 0, NULL, 0), "bad magic", "magic 0");
    REFUSES(frame(UINT32_MAX, 5, HVDL_FLOAT32, 2, s34, 48), "bad magic", "magic ~0");
    wire_t w = frame(P2P_MAGIC, 5, HVDL_FLOAT32, 2, s34, 48);
    uint8_t swapped[4] = {w.b[3], w.b[2], w.b[1], w.b[0]};
    memcpy(w.b, swapped, 4);                                         /* the wrong byte order */
    REFUSES(w, "bad magic", "a big-endian magic");
}

/* Names and the mailbox's records. */
static void test_names_and_records(void) {
    CHECK(!hvdl__p2p_name_problem("grad.0", 6), "a name refused");
    const char nul[] = "grad\0x";
    const char *why = hvdl__p2p_name_problem(nul, 6);
    CHECK(why && !strcmp(why, "a NUL byte in a name"), "a name with a NUL byte: %s",
          why ? why : "(accepted)");
    CHECK(hvdl__p2p_name_problem("", 1), "a name shorter than its length");

    /* A record: header, name, payload, padded to 8 bytes. */
    CHECK(hvdl__p2p_record_bytes(5, 48) == 144, "record bytes %llu",
          (unsigned long long)hvdl__p2p_record_bytes(5, 48));
    CHECK(hvdl__p2p_record_bytes(8, 0) == 96 && hvdl__p2p_record_bytes(1, 0) == 96,
          "a record without payload");
    CHECK(hvdl__p2p_record_bytes(HVDL_MAX_NAME, 0) % 8 == 0, "records are padded to 8 bytes");
    const int64_t s34[HVDL_MAX_DIMS] = {3, 4};
    wire_t eager = frame(P2P_MAGIC, 5, HVDL_FLOAT32, 2, s34, 48);
    wire_t rtsa = frame(F_RTSA, 5, HVDL_FLOAT32, 2, s34, 48);
    wire_t rts = frame(F_RTS, 5, HVDL_FLOAT32, 2, s34, 48);
    wire_t fin = frame(F_FIN, 5, HVDL_FLOAT32, 2, s34, 48);
    CHECK(hvdl__p2p_record_payload(&eager.h) == 48 && hvdl__p2p_record_payload(&rtsa.h) == 8 &&
              hvdl__p2p_record_payload(&rts.h) == 0 && hvdl__p2p_record_payload(&fin.h) == 0,
          "what follows a record's name");

    /* The fill: at least a header, at most the mailbox (a head the peer moved past the
     * tail reads as a huge fill). */
    const uint64_t cap = MBOX_MIN;
    CHECK(!hvdl__p2p_fill_problem(sizeof(p2p_hdr_t), cap) && !hvdl__p2p_fill_problem(cap, cap),
          "a fill refused");
    CHECK(hvdl__p2p_fill_problem(sizeof(p2p_hdr_t) - 1, cap), "a fill shorter than a header");
    CHECK(hvdl__p2p_fill_problem(cap + 1, cap), "a fill beyond the mailbox");
    CHECK(hvdl__p2p_fill_problem(UINT64_MAX, cap), "a head past the tail");

    /* A record: only what the mailbox carries, and never longer than what was put. */
    struct {
        wire_t w;
        const char *what;
    } carried[] = {{eager, "eager"}, {rtsa, "RTSA"}, {rts, "RTS"}, {fin, "FIN"}};
    for (size_t i = 0; i < sizeof carried / sizeof *carried; i++) {
        const p2p_hdr_t *h = &carried[i].w.h;
        uint64_t len = hvdl__p2p_record_bytes(h->name_len, hvdl__p2p_record_payload(h));
        why = hvdl__p2p_record_problem(h, len);
        CHECK(!why, "a whole %s record refused (%s)", carried[i].what, why ? why : "");
        why = hvdl__p2p_record_problem(h, len - 1);
        CHECK(why && !strcmp(why, "a mailbox record longer than what was put"),
              "a %s record cut short: %s", carried[i].what, why ? why : "(accepted)");
    }
    /* (a credit and a goodbye go over the connection only: F_BYE follows the mailbox's
     * records in order because the reader drains the mailbox before it takes the goodbye) */
    const uint32_t not_carried[] = {F_CTS,  F_DATA, F_SDATA,  F_BELL, F_SWITCH,
                                    F_ROOM, F_ACK,  F_CREDIT, F_BYE};
    for (size_t i = 0; i < sizeof not_carried / sizeof *not_carried; i++) {
        int named = hvdl__p2p_named_frame(not_carried[i]);
        int sized = not_carried[i] == F_ACK || not_carried[i] == F_CREDIT;
        wire_t w = named ? frame(not_carried[i], 5, HVDL_FLOAT32, 2, s34, 48)
                         : frame(not_carried[i], 0, 0, 0, NULL, sized);
        why = hvdl__p2p_record_problem(&w.h, cap);
        CHECK(why && !strcmp(why, "a frame the mailbox does not carry"),
              "frame %08x in the mailbox: %s", not_carried[i], why ? why : "(accepted)");
    }
    wire_t bad = frame(P2P_MAGIC, 5, HVDL_FLOAT32, 2, s34, 49);     /* the header's own check */
    why = hvdl__p2p_record_problem(&bad.h, cap);
    CHECK(why && !strcmp(why, "byte count does not match dtype and shape"), "a bad record: %s",
          why ? why : "(accepted)");
    wire_t huge = frame(P2P_MAGIC, 5, HVDL_UINT8, 1, (int64_t[8]){P2P_MAX_BYTES}, P2P_MAX_BYTES);
    why = hvdl__p2p_record_problem(&huge.h, cap);       /* a payload larger than the mailbox */
    CHECK(why && !strcmp(why, "a mailbox record longer than what was put"), "a huge record: %s",
          why ? why : "(accepted)");
}

void test_p2p_frames(void) {
    int before = atomic_load(&g_failures);
    CHECK(offsetof(p2p_hdr_t, name_len) == 4 && offsetof(p2p_hdr_t, dtype) == 8 &&
              offsetof(p2p_hdr_t, ndim) == 12 && offsetof(p2p_hdr_t, shape) == 16 &&
              offsetof(p2p_hdr_t, nbytes) == 80,
          "the p2p header's layout (tests/test_engine_hostile.py packs it as <IIii8qq)");
    test_named();
    test_control();
    test_magic();
    test_names_and_records();
    printf("%-40s %s\n", "point-to-point frames",
           atomic_load(&g_failures) > before ? "FAILED" : "ok");
}
