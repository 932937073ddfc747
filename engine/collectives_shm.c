/*
 * Collectives over the node's shared-memory segment, used when every member of the
 * process set is on this node and they are all of its ranks.
 *
 * Each local rank owns two slots (double buffering: a slot written in epoch k is read by
 * the others before they post anything in epoch k+1, so it is free again in k+2) of (L + 1) chunks: L chunks hold its
 * copy of the current piece of the buffer, one chunk its share of the reduced result.
 * A piece is L chunks (C bytes each, HOROVODLIKE_SHM_CHUNK_BYTES), so it stays in cache
 * from copy-in through reduction to copy-out.
 *
 * Allreduce, two-shot, per piece:
 *   1. copy-in     every rank copies its piece into its slot            post, wait all
 *   2. reduce      rank j reduces chunk j of every rank's slot into its result chunk
 *                                                                        post, wait all
 *   3. copy-out    every rank copies every result chunk into its buffer
 * The next piece uses the other slot, so a fast rank's copy-in of piece k+1 overlaps a
 * slow rank's copy-out of piece k; two barriers per piece are the only synchronisation.
 * Cost for S bytes: each rank copies S in, reduces S/L from L slots, copies S out: about
 * 4S bytes of cache traffic per rank, of which only reading the input and writing the
 * output reach DRAM. Synchronisation: 2 * S/(L*C) barriers.
 *
 * Allreduce, one-shot (S <= one chunk): copy-in, one barrier, and every rank reduces all
 * L slots itself, in rank order so every rank gets bit-identical results. Cost: one
 * barrier and L*S reads: the choice for latency-bound sizes.
 *
 * Broadcast: the root copies a piece in, one barrier, the others copy it out.
 * Allgather: every rank copies a piece of its block in, one barrier, every rank copies
 * every block's piece out.
 * The reduction arithmetic runs only here, in the engine thread, never in the caller's.
 */
#include "internal.h"
#include <stdio.h>
#include <string.h>

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static int one_shot(engine_t *e, hvdl_shm_t *s, uint8_t *buf, int64_t bytes, int dtype, int op) {
    int esz = hvdl_dtype_size(dtype), which = s->epoch++ & 1;
    memcpy(hvdl__shm_slot(s, s->me, which), buf, (size_t)bytes);
    hvdl__shm_post(e);
    if (hvdl__shm_wait_all(e)) return -1;
    memcpy(buf, hvdl__shm_slot(s, 0, which), (size_t)bytes);
    for (int q = 1; q < s->nlocal; q++)
        hvdl__reduce(dtype, op, buf, hvdl__shm_slot(s, q, which), bytes / esz);
    return 0;
}

/* The part of a piece that local rank j reduces: whole elements, nearly equal. */
static void share_of(int64_t len, int esz, int L, int j, int64_t *off, int64_t *n) {
    int64_t elems = len / esz;
    int64_t lo = elems / L * j + (j < elems % L ? j : elems % L);
    *off = lo * esz;
    *n = (elems / L + (j < elems % L)) * esz;
}

static int two_shot(engine_t *e, hvdl_shm_t *s, uint8_t *buf, int64_t bytes, int dtype, int op) {
    int L = s->nlocal, esz = hvdl_dtype_size(dtype);
    int64_t piece = s->chunk * L;
    for (int64_t lo = 0; lo < bytes; lo += piece) {
        int which = s->epoch++ & 1;
        int64_t len = min64(piece, bytes - lo), off, n;
        uint8_t *mine = hvdl__shm_slot(s, s->me, which);
        memcpy(mine, buf + lo, (size_t)len);                       /* 1. copy-in */
        hvdl__shm_post(e);
        if (hvdl__shm_wait_all(e)) return -1;
        share_of(len, esz, L, s->me, &off, &n);                    /* 2. reduce my share */
        uint8_t *res = mine + L * s->chunk;
        memcpy(res, hvdl__shm_slot(s, 0, which) + off, (size_t)n);
        for (int q = 1; q < L; q++)
            hvdl__reduce(dtype, op, res, hvdl__shm_slot(s, q, which) + off, n / esz);
        hvdl__shm_post(e);
        if (hvdl__shm_wait_all(e)) return -1;
        for (int q = 0; q < L; q++) {                              /* 3. copy-out */
            share_of(len, esz, L, q, &off, &n);
            memcpy(buf + lo + off, hvdl__shm_slot(s, q, which) + L * s->chunk, (size_t)n);
        }
    }
    return 0;
}

int hvdl__allreduce_shm(engine_t *e, void *buf, int64_t count, int dtype, int op) {
    hvdl_shm_t *s = e->shm;
    int64_t bytes = count * hvdl_dtype_size(dtype);
    if (!bytes) return 0;
    double t0 = hvdl_now();
    int one = bytes <= s->chunk;
    int rc = one ? one_shot(e, s, buf, bytes, dtype, op) : two_shot(e, s, buf, bytes, dtype, op);
    if (!rc && TL_ON(e)) {
        char args[64];
        snprintf(args, sizeof args, "\"bytes\": %lld", (long long)bytes);
        hvdl__tl_span(e, TL_ALGORITHM, one ? "SHM_ONE_SHOT" : "SHM_TWO_SHOT", t0, hvdl_now(), args);
    }
    return rc;
}

int hvdl__broadcast_shm(engine_t *e, void *buf, int64_t bytes, int root) {
    hvdl_shm_t *s = e->shm;
    int64_t piece = s->chunk * s->nlocal;
    for (int64_t lo = 0; lo < bytes; lo += piece) {
        int which = s->epoch++ & 1;
        int64_t len = min64(piece, bytes - lo);
        if (s->me == root) memcpy(hvdl__shm_slot(s, root, which), (uint8_t *)buf + lo, (size_t)len);
        hvdl__shm_post(e);
        if (hvdl__shm_wait_all(e)) return -1;
        if (s->me != root) memcpy((uint8_t *)buf + lo, hvdl__shm_slot(s, root, which), (size_t)len);
    }
    return 0;
}

int hvdl__allgather_shm(engine_t *e, void *out, const int64_t *block_bytes) {
    hvdl_shm_t *s = e->shm;
    int L = s->nlocal;
    int64_t piece = s->chunk * L, off[L + 1], longest = 0;
    off[0] = 0;
    for (int q = 0; q < L; q++) {
        off[q + 1] = off[q] + block_bytes[q];
        if (block_bytes[q] > longest) longest = block_bytes[q];
    }
    uint8_t *o = out;
    for (int64_t lo = 0; lo < longest; lo += piece) {
        int which = s->epoch++ & 1;
        int64_t mine = min64(piece, block_bytes[s->me] - lo);
        if (mine > 0) memcpy(hvdl__shm_slot(s, s->me, which), o + off[s->me] + lo, (size_t)mine);
        hvdl__shm_post(e);
        if (hvdl__shm_wait_all(e)) return -1;
        for (int q = 0; q < L; q++) {
            int64_t n = min64(piece, block_bytes[q] - lo);
            if (q != s->me && n > 0) memcpy(o + off[q] + lo, hvdl__shm_slot(s, q, which), (size_t)n);
        }
    }
    return 0;
}
