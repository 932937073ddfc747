/*
 * The small control frames (engine/frames.h) through wire.c: each encodes and decodes to
 * what was sent, and each decoder refuses a frame one byte short, one byte long, and a
 * count beyond what the frame may carry, with a reason. These are the bytes a peer
 * controls: a decoder that read one field too far, or trusted a length, fails here.
 */
#include "harness.h"
#include "wire.h"
#include <stdio.h>
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

void test_frames(void) {
    int before = atomic_load(&g_failures);
    test_bye();
    test_clock();
    test_node_frames();
    printf("%-40s %s\n", "small control frames",
           atomic_load(&g_failures) > before ? "FAILED" : "ok");
}
