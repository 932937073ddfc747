/*
 * The small control frames (engine/frames.h) through wire.c: each encodes and decodes to
 * what was sent, and each decoder refuses a frame one byte short, one byte long, and a
 * count beyond what the frame may carry, with a reason. These are the bytes a peer
 * controls: a decoder that read one field too far, or trusted a length, fails here.
 */
#include "harness.h"
#include "wire.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static reader_t rd(const uint8_t *p, int64_t n) { return (reader_t){p, n, 0, NULL}; }

/* The decoder `dec` refuses n bytes of p, with a reason. */
#define REFUSES(dec, p, n, ...)                                                        \
    do {                                                                               \
        reader_t r_ = rd(p, n);                                                        \
        CHECK(dec(&r_, ##__VA_ARGS__) == -1 && r_.why, "%s accepted %lld bytes", #dec, \
              (long long)(n));                                                         \
    } while (0)

static void test_bye(void) {
    static uint8_t buf[HVDL_BYE_MAX + 8];
    bye_t got, worker = {.who = 3};
    int64_t n = hvdl__put_bye(buf, &worker);
    reader_t r = rd(buf, n);
    CHECK(n == 4 && !hvdl__read_bye(&r, &got) && got.who == 3 && !got.has_pos,
          "a worker's goodbye");
    char text[HVDL_BYE_TEXT + 40];
    memset(text, 'x', sizeof text);
    bye_t root = {.who = 1, .has_pos = 1, .pos = 77, .text = text, .ntext = (int)sizeof text};
    n = hvdl__put_bye(buf, &root);         /* the text is cut to what the frame may carry */
    r = rd(buf, n);
    CHECK(n == HVDL_BYE_MAX && !hvdl__read_bye(&r, &got) && got.who == 1 && got.has_pos &&
              got.pos == 77 && got.ntext == HVDL_BYE_TEXT && !memcmp(got.text, text, HVDL_BYE_TEXT),
          "rank 0's goodbye");
    root.ntext = 0;
    n = hvdl__put_bye(buf, &root);
    r = rd(buf, n);
    CHECK(n == 12 && !hvdl__read_bye(&r, &got) && got.has_pos && got.ntext == 0,
          "rank 0's goodbye, no text");
    REFUSES(hvdl__read_bye, buf, 0, &got);
    REFUSES(hvdl__read_bye, buf, 3, &got);
    for (int k = 5; k < 12; k++) REFUSES(hvdl__read_bye, buf, k, &got); /* a position cut short */
    REFUSES(hvdl__read_bye, buf, HVDL_BYE_MAX + 1, &got);
}

static void test_clock(void) {
    uint8_t buf[16] = {0};
    double got = 0;
    reader_t r = rd(buf, 0);
    CHECK(!hvdl__read_ping(&r), "an empty ping");
    REFUSES(hvdl__read_ping, buf, 1);
    hvdl__put_pong(buf, 1234.5);
    r = rd(buf, HVDL_PONG_BYTES);
    CHECK(!hvdl__read_pong(&r, &got) && got == 1234.5, "a pong");
    REFUSES(hvdl__read_pong, buf, HVDL_PONG_BYTES - 1, &got);
    REFUSES(hvdl__read_pong, buf, HVDL_PONG_BYTES + 1, &got);
}

static void test_node_frames(void) {
    static uint8_t buf[4 * HVDL_NEG_IDS + 8];
    static uint32_t vals[HVDL_NEG_IDS + 2], got[HVDL_NEG_IDS];
    for (int i = 0; i < HVDL_NEG_IDS + 2; i++) vals[i] = (uint32_t)(i * 7 + 1);
    int count = -1;
    int64_t n = hvdl__put_words(buf, vals, HVDL_NEG_IDS);
    reader_t r = rd(buf, n);
    CHECK(n == 4 * HVDL_NEG_IDS && !hvdl__read_words(&r, got, &count) && count == HVDL_NEG_IDS &&
              !memcmp(got, vals, sizeof got),
          "a full word list");
    r = rd(buf, 0);
    CHECK(!hvdl__read_words(&r, got, &count) && count == 0, "an empty word list");
    for (int k = 1; k < 4; k++)
        REFUSES(hvdl__read_words, buf, 4 + k, got, &count); /* not whole values */
    REFUSES(hvdl__read_words, buf, 4 * (HVDL_NEG_IDS + 1), got,
            &count); /* more than there are ids */

    node_posted_t p = {.id = 9, .mask = 0x5, .waited = 2.5}, pg;
    hvdl__put_node_posted(buf, &p);
    r = rd(buf, HVDL_NODE_POSTED_BYTES);
    CHECK(!hvdl__read_node_posted(&r, &pg) && pg.id == 9 && pg.mask == 0x5 && pg.waited == 2.5,
          "a word report");
    REFUSES(hvdl__read_node_posted, buf, HVDL_NODE_POSTED_BYTES - 1, &pg);
    REFUSES(hvdl__read_node_posted, buf, HVDL_NODE_POSTED_BYTES + 1, &pg);

    node_close_t c = {.id = HVDL_CLOSE_ALL, .round = 5}, cg;
    hvdl__put_node_close(buf, &c);
    r = rd(buf, HVDL_NODE_CLOSE_BYTES);
    CHECK(!hvdl__read_node_close(&r, &cg) && cg.id == HVDL_CLOSE_ALL && cg.round == 5,
          "a word closing");
    REFUSES(hvdl__read_node_close, buf, HVDL_NODE_CLOSE_BYTES - 1, &cg);
    REFUSES(hvdl__read_node_close, buf, HVDL_NODE_CLOSE_BYTES + 1, &cg);
}

static int read_waits(reader_t *r, int from, wait_report_t *w) {
    return hvdl__read_waits(NULL, r, from, w);
}

/* MSG_WAITS: a report with a collective and a recv; each field a peer controls out of
 * range is refused, and so is every frame cut short or one byte long. */
static void test_waits(void) {
    wait_entry_t ops[2] = {{"allreduce.a", HVDL_OP_ALLREDUCE, 1, -1, 1},
                           {"p2p.x", HVDL_OP_RECV, 0, 3, 0}};
    wait_report_t w = {.posts = 42, .blocked_for = 2.5, .n = 2, .ops = ops}, got;
    buf_t b = {0};
    CHECK(!hvdl__put_waits(&b, &w), "a wait report encodes");
    uint8_t *p = b.data;
    int64_t n = b.len;
    reader_t r = rd(p, n);
    CHECK(!read_waits(&r, 1, &got) && got.posts == 42 && got.blocked_for == 2.5 && !got.partial &&
              got.n == 2 && !strcmp(got.ops[0].name, "allreduce.a") && got.ops[0].set == 1 &&
              got.ops[0].peer == -1 && got.ops[0].waited == 1 && got.ops[1].op == HVDL_OP_RECV &&
              got.ops[1].peer == 3 && !strcmp(got.ops[1].name, "p2p.x"),
          "a wait report");
    hvdl__waits_clear(&got);
    for (int64_t k = 0; k < n; k++) REFUSES(read_waits, p, k, 1, &got); /* cut short */
    uint8_t *q = malloc((size_t)n + 1);
    memcpy(q, p, (size_t)n);
    q[n] = 0;
    REFUSES(read_waits, q, n + 1, 1, &got);                /* one byte long */
    REFUSES(read_waits, p, n, 3, &got);                    /* the recv's peer is its sender */
    const int E1 = 21 + 13 + 4 + 11;                       /* the second entry */
    struct {
        int64_t at;
        int32_t value;
        int bytes;
        const char *what;
    } bad[] = {{16, 2, 1, "a partial flag of 2"},
               {17, HVDL_WAITS_MAX + 1, 4, "more ops than a report may carry"},
               {17, 3, 4, "more ops than the frame holds"},
               {21, HVDL_OP_RECV + 1, 4, "an op kind out of range"},
               {21, -1, 4, "a negative op kind"},
               {25, HVDL_MAX_SETS, 4, "a process set out of range"},
               {29, 0, 4, "a collective with a peer"},
               {33, 2, 1, "a waited flag of 2"},
               {34, 0, 4, "an empty name"},
               {34, 1 << 30, 4, "a name longer than the frame"},
               {E1 + 8, -1, 4, "a recv without a peer"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memcpy(q, p, (size_t)n);
        memcpy(q + bad[i].at, &bad[i].value, (size_t)bad[i].bytes);
        reader_t rr = rd(q, n);
        CHECK(read_waits(&rr, 1, &got) == -1 && rr.why, "a wait report with %s accepted",
              bad[i].what);
    }
    free(q);
    buf_free(&b);
}

void test_frames(void) {
    int before = atomic_load(&g_failures);
    test_bye();
    test_clock();
    test_node_frames();
    test_waits();
    printf("%-40s %s\n", "small control frames",
           atomic_load(&g_failures) > before ? "FAILED" : "ok");
}
