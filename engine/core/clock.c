/*
 * Clock sync, for the timeline: each worker measures rank 0's wall clock minus its own
 * at start-up (NTP's estimate: of a few ping-pongs over the control connection, trust
 * the one with the shortest round trip). The timeline writes the offset into each rank's
 * file (clock_offset_us) so that a viewer can lay every rank on rank 0's axis. Blocking,
 * before the loop starts; costs a few ms. An ABORT that arrives instead (a rank failed
 * during start-up and said why) fails this rank with that cause.
 */
#include "wire.h"
#include "fail.h"
#include "net.h"
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double wall_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* Read a frame header from peer; an ABORT in its place fails this rank with the
 * message it carries (rank 0 relays it), and is reported as -1 with e->failed set. */
static int read_header(engine_t *e, int peer, frame_hdr_t *h, double deadline) {
    int fd = e->peers[peer].ctrl.fd;
    if (hvdl__io_full(fd, h, sizeof *h, 0, deadline) || h->magic != WIRE_MAGIC) return -1;
    if (h->type != MSG_ABORT) return 0;
    char msg[HVDL_MSG_BYTES];
    if (h->len < 0 || h->len >= HVDL_MSG_BYTES ||
        hvdl__io_full(fd, msg, (size_t)h->len, 0, deadline))
        return -1;
    return hvdl__abort_received(e, peer, msg, h->len);
}

/* The payload of a frame whose header h was read: at most cap bytes, else -1. */
static int read_payload(engine_t *e, int peer, const frame_hdr_t *h, uint8_t *buf, int64_t cap,
                        reader_t *r, double deadline) {
    if (h->len < 0 || h->len > cap ||
        hvdl__io_full(e->peers[peer].ctrl.fd, buf, (size_t)h->len, 0, deadline))
        return -1;
    *r = (reader_t){.p = buf, .left = h->len};
    return 0;
}

int hvdl__clock_sync(engine_t *e) {
    enum { ROUNDS = 5 };
    double deadline = hvdl_now() + e->cfg.start_timeout;
    frame_hdr_t h;
    uint8_t buf[HVDL_PONG_BYTES];
    reader_t r;
    if (e->rank == 0) {
        for (int w = 1; w < e->size; w++) {
            for (int k = 0; k < ROUNDS; k++) {
                if (read_header(e, w, &h, deadline) || h.type != MSG_PING ||
                    read_payload(e, w, &h, buf, 0, &r, deadline) || hvdl__read_ping(&r))
                    goto lost;
                frame_hdr_t pong = {WIRE_MAGIC, MSG_PONG, HVDL_PONG_BYTES};
                uint8_t msg[sizeof pong + HVDL_PONG_BYTES];
                memcpy(msg, &pong, sizeof pong);
                hvdl__put_pong(msg + sizeof pong, wall_us());
                if (hvdl__io_full(e->peers[w].ctrl.fd, msg, sizeof msg, 1, deadline)) goto lost;
                continue;
            lost:
                if (e->failed) return -1;
                hvdl__fail(e, HVDL_ERR_PEER_LOST,
                           "rank %d (host %s) failed the start-up clock sync", w, e->peers[w].host);
                return -1;
            }
        }
        return 0;
    }
    double best_rtt = 1e18;
    for (int k = 0; k < ROUNDS; k++) {
        frame_hdr_t ping = {WIRE_MAGIC, MSG_PING, 0};     /* a ping is empty (frames.h) */
        double t0 = wall_us(), remote;
        if (hvdl__io_full(e->peers[0].ctrl.fd, &ping, sizeof ping, 1, deadline) ||
            read_header(e, 0, &h, deadline) || h.type != MSG_PONG ||
            read_payload(e, 0, &h, buf, sizeof buf, &r, deadline) || hvdl__read_pong(&r, &remote)) {
            if (e->failed) return -1;
            hvdl__fail(e, HVDL_ERR_PEER_LOST, "rank 0 (host %s) failed the start-up clock sync",
                       e->peers[0].host);
            return -1;
        }
        double t1 = wall_us();
        if (t1 - t0 < best_rtt) {
            best_rtt = t1 - t0;
            e->clock_offset_us = remote - (t0 + t1) / 2;
        }
    }
    return 0;
}
