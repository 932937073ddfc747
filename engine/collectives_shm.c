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
 * Reducescatter and alltoall: a slot holds one chunk per member; see each function.
 * Allgather: every rank copies a piece of its block in, one barrier, every rank copies
 * every block's piece out.
 * The reduction arithmetic runs only here, in the engine thread, never in the caller's.
 */
#include "context.h"
#include <string.h>

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static int one_shot(ctx_t *c, hvdl_shm_t *s, const uint8_t *in, uint8_t *out, int64_t bytes,
                    int dtype, int op) {
    int esz = hvdl_dtype_size(dtype), which = s->epoch++ & 1;
    memcpy(hvdl__shm_slot(s, s->me, which), in, (size_t)bytes);
    hvdl__shm_post(c);
    if (hvdl__shm_wait_all(c)) return -1;
    memcpy(out, hvdl__shm_slot(s, 0, which), (size_t)bytes);
    for (int q = 1; q < s->nlocal; q++)
        hvdl__reduce(dtype, op, out, hvdl__shm_slot(s, q, which), bytes / esz);
    return 0;
}

/* The part of a piece that local rank j reduces: whole elements, nearly equal. */
static void share_of(int64_t len, int esz, int L, int j, int64_t *off, int64_t *n) {
    int64_t elems = len / esz;
    int64_t lo = elems / L * j + (j < elems % L ? j : elems % L);
    *off = lo * esz;
    *n = (elems / L + (j < elems % L)) * esz;
}

/* Two-shot steps 1 and 2 for one piece: copy-in, barrier, reduce this rank's share into
 * its result chunk, barrier. Returns the share's offset and size in the piece. */
static int piece_reduce(ctx_t *c, hvdl_shm_t *s, const uint8_t *src, int64_t len, int dtype,
                        int op, int which, int64_t *off, int64_t *n) {
    int L = s->nlocal, esz = hvdl_dtype_size(dtype);
    uint8_t *mine = hvdl__shm_slot(s, s->me, which), *res = mine + L * s->chunk;
    if (src) memcpy(mine, src, (size_t)len);     /* NULL: the caller filled the slot */
    hvdl__shm_post(c);
    if (hvdl__shm_wait_all(c)) return -1;
    share_of(len, esz, L, s->me, off, n);
    memcpy(res, hvdl__shm_slot(s, 0, which) + *off, (size_t)*n);
    for (int q = 1; q < L; q++)
        hvdl__reduce(dtype, op, res, hvdl__shm_slot(s, q, which) + *off, *n / esz);
    hvdl__shm_post(c);
    return hvdl__shm_wait_all(c);
}

/* Step 3 for one piece: every rank's result chunk into place. */
static void piece_copy_out(hvdl_shm_t *s, uint8_t *dst, int64_t len, int esz, int which) {
    for (int q = 0; q < s->nlocal; q++) {
        int64_t off, n;
        share_of(len, esz, s->nlocal, q, &off, &n);
        memcpy(dst + off, hvdl__shm_slot(s, q, which) + s->nlocal * s->chunk, (size_t)n);
    }
}

static int two_shot(ctx_t *c, hvdl_shm_t *s, const uint8_t *in, uint8_t *out, int64_t bytes,
                    int dtype, int op) {
    int64_t piece = s->chunk * s->nlocal, off, n;
    for (int64_t lo = 0; lo < bytes; lo += piece) {
        int which = s->epoch++ & 1;
        int64_t len = min64(piece, bytes - lo);
        if (piece_reduce(c, s, in + lo, len, dtype, op, which, &off, &n)) return -1;
        piece_copy_out(s, out + lo, len, hvdl_dtype_size(dtype), which);
    }
    return 0;
}

/* Several tensors as one virtual buffer (a fused response) without a fusion buffer:
 * pieces are gathered from the callers' inputs straight into the slot and the results
 * scattered straight to their outputs. `at` walks the spans in order. */
typedef struct cursor { const span_t *v; int i; int64_t skip; } cursor_t;

static void gather(cursor_t *c, uint8_t *dst, int64_t len) {
    while (len > 0) {
        int64_t k = min64(c->v[c->i].nbytes - c->skip, len);
        memcpy(dst, (const uint8_t *)c->v[c->i].in + c->skip, (size_t)k);
        dst += k, len -= k, c->skip += k;
        if (c->skip == c->v[c->i].nbytes) c->i++, c->skip = 0;
    }
}

/* Write len bytes of the virtual output starting at byte `at`. */
static void scatter(const span_t *v, int64_t at, const uint8_t *src, int64_t len) {
    int i = 0;
    while (at >= v[i].nbytes) at -= v[i++].nbytes;
    while (len > 0) {
        int64_t k = min64(v[i].nbytes - at, len);
        memcpy((uint8_t *)v[i].out + at, src, (size_t)k);
        src += k, len -= k, at = 0, i++;
    }
}

int hvdl__allreduce_shm_spans(ctx_t *c, const span_t *v, int nspans, int dtype, int op) {
    hvdl_shm_t *s = c->shm;
    int L = s->nlocal, esz = hvdl_dtype_size(dtype);
    int64_t total = 0, piece = s->chunk * L, off, n;
    for (int i = 0; i < nspans; i++) total += v[i].nbytes;
    cursor_t at = {v, 0, 0};
    while (nspans > 0 && at.i < nspans && v[at.i].nbytes == 0) at.i++;
    for (int64_t lo = 0; lo < total; lo += piece) {
        int which = s->epoch++ & 1;
        int64_t len = min64(piece, total - lo);
        gather(&at, hvdl__shm_slot(s, s->me, which), len);
        while (at.i < nspans && v[at.i].nbytes == 0) at.i++;
        if (piece_reduce(c, s, NULL, len, dtype, op, which, &off, &n)) return -1;
        for (int q = 0; q < L; q++) {
            share_of(len, esz, L, q, &off, &n);
            if (n) scatter(v, lo + off, hvdl__shm_slot(s, q, which) + L * s->chunk, n);
        }
    }
    return 0;
}

/* The first half of hierarchical allreduce: this rank's reduced shares of every piece,
 * gathered contiguously into out (*share_bytes in all). */
int hvdl__shm_reduce_scatter(ctx_t *c, const void *buf, int64_t bytes, int dtype, int op,
                             buf_t *out, int64_t *share_bytes) {
    hvdl_shm_t *s = c->shm;
    int64_t piece = s->chunk * s->nlocal, off, n;
    out->len = 0;
    for (int64_t lo = 0; lo < bytes; lo += piece) {
        int which = s->epoch++ & 1;
        int64_t len = min64(piece, bytes - lo);
        if (piece_reduce(c, s, (const uint8_t *)buf + lo, len, dtype, op, which, &off, &n)) return -1;
        if (buf_put(out, hvdl__shm_slot(s, s->me, which) + s->nlocal * s->chunk, n))
            return hvdl__ctx_oom(c, "hierarchical share buffer", out->len + n);
    }
    *share_bytes = out->len;
    return 0;
}

/* The second half: put every rank's (now globally reduced) shares back into buf. */
int hvdl__shm_allgather_shares(ctx_t *c, void *buf, int64_t bytes, int dtype, const void *shares) {
    hvdl_shm_t *s = c->shm;
    int esz = hvdl_dtype_size(dtype);
    int64_t piece = s->chunk * s->nlocal, off, n;
    const uint8_t *mine = shares;
    for (int64_t lo = 0; lo < bytes; lo += piece) {
        int which = s->epoch++ & 1;
        int64_t len = min64(piece, bytes - lo);
        share_of(len, esz, s->nlocal, s->me, &off, &n);
        if (n) {   /* a rank's share may be empty (and `shares` NULL) for tiny buffers */
            memcpy(hvdl__shm_slot(s, s->me, which) + s->nlocal * s->chunk, mine, (size_t)n);
            mine += n;
        }
        hvdl__shm_post(c);
        if (hvdl__shm_wait_all(c)) return -1;
        piece_copy_out(s, (uint8_t *)buf + lo, len, esz, which);
    }
    return 0;
}

/* in may equal out; when it does not, the caller's input is read straight into the
 * segment and the result written straight to the output: no staging copy. */
int hvdl__allreduce_shm(ctx_t *c, const void *in, void *out, int64_t count, int dtype, int op) {
    hvdl_shm_t *s = c->shm;
    int64_t bytes = count * hvdl_dtype_size(dtype);
    if (!bytes) return 0;
    double t0 = hvdl_now();
    int one = bytes <= s->chunk;
    int rc = one ? one_shot(c, s, in, out, bytes, dtype, op) : two_shot(c, s, in, out, bytes, dtype, op);
    if (!rc && hvdl__ctx_tracing(c))
        hvdl__ctx_span(c, one ? "SHM_ONE_SHOT" : "SHM_TWO_SHOT", t0, hvdl_now(), bytes);
    return rc;
}

int hvdl__broadcast_shm(ctx_t *c, void *buf, int64_t bytes, int root) {
    hvdl_shm_t *s = c->shm;
    int64_t piece = s->chunk * s->nlocal;
    for (int64_t lo = 0; lo < bytes; lo += piece) {
        int which = s->epoch++ & 1;
        int64_t len = min64(piece, bytes - lo);
        if (s->me == root) memcpy(hvdl__shm_slot(s, root, which), (uint8_t *)buf + lo, (size_t)len);
        hvdl__shm_post(c);
        if (hvdl__shm_wait_all(c)) return -1;
        if (s->me != root) memcpy((uint8_t *)buf + lo, hvdl__shm_slot(s, root, which), (size_t)len);
    }
    return 0;
}

int hvdl__allgather_shm(ctx_t *c, void *out, const int64_t *block_bytes) {
    hvdl_shm_t *s = c->shm;
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
        hvdl__shm_post(c);
        if (hvdl__shm_wait_all(c)) return -1;
        for (int q = 0; q < L; q++) {
            int64_t n = min64(piece, block_bytes[q] - lo);
            if (q != s->me && n > 0) memcpy(o + off[q] + lo, hvdl__shm_slot(s, q, which), (size_t)n);
        }
    }
    return 0;
}

/* Reducescatter by slices: in round t every rank copies the t-th chunk of every OTHER
 * member's segment into its slot (chunk j at position j), one barrier, and member j
 * reduces position j of every other slot, and its own input's chunk in their place,
 * straight into its output, in rank order (so a rank's result does not depend on which
 * rank computes it). Its own segment never goes through the segment: per rank, 1/L of
 * the copy-in less than the allreduce's two-shot, and one barrier per round instead of
 * two. (Only if the output overlaps the own segment of the input, as an in-place call
 * would, is that chunk staged in the slot too.) Segments may differ in size. */
int hvdl__reducescatter_shm(ctx_t *c, const void *in, const int64_t *seg_bytes, void *out,
                            int dtype, int op) {
    hvdl_shm_t *s = c->shm;
    int L = s->nlocal, esz = hvdl_dtype_size(dtype);
    int64_t off[L + 1], longest = 0, C = s->chunk;
    off[0] = 0;
    for (int q = 0; q < L; q++) {
        off[q + 1] = off[q] + seg_bytes[q];
        if (seg_bytes[q] > longest) longest = seg_bytes[q];
    }
    const uint8_t *own = (const uint8_t *)in + off[s->me];
    int staged = (const uint8_t *)out < own + seg_bytes[s->me] &&
                 own < (const uint8_t *)out + seg_bytes[s->me];    /* output overlaps it */
    for (int64_t lo = 0; lo < longest; lo += C) {
        int which = s->epoch++ & 1;
        uint8_t *mine = hvdl__shm_slot(s, s->me, which);
        for (int j = 0; j < L; j++) {
            int64_t n = min64(C, seg_bytes[j] - lo);
            if (n > 0 && (j != s->me || staged))
                memcpy(mine + j * C, (const uint8_t *)in + off[j] + lo, (size_t)n);
        }
        hvdl__shm_post(c);
        if (hvdl__shm_wait_all(c)) return -1;
        int64_t n = min64(C, seg_bytes[s->me] - lo);
        if (n <= 0) continue;
        uint8_t *dst = (uint8_t *)out + lo;
        for (int q = 0; q < L; q++) {
            const uint8_t *src = q == s->me && !staged ? own + lo
                                                       : hvdl__shm_slot(s, q, which) + s->me * C;
            if (q == 0) memcpy(dst, src, (size_t)n);
            else hvdl__reduce(dtype, op, dst, src, n / esz);
        }
    }
    return 0;
}

/* Alltoall through the slots: in round t every rank copies the t-th chunk of its block
 * for member j to position j of its slot, one barrier, and every rank copies position
 * `me` of every slot into place. */
int hvdl__alltoall_shm(ctx_t *c, const void *in, const int64_t *send_bytes, void *out,
                       const int64_t *recv_bytes, int64_t longest) {
    hvdl_shm_t *s = c->shm;
    int L = s->nlocal;
    int64_t soff[L + 1], roff[L + 1], C = s->chunk;
    soff[0] = roff[0] = 0;
    for (int q = 0; q < L; q++) {
        soff[q + 1] = soff[q] + send_bytes[q];
        roff[q + 1] = roff[q] + recv_bytes[q];
    }
    /* `longest` is the largest block of the whole exchange, so every rank runs the same
     * number of rounds */
    for (int64_t lo = 0; lo < longest; lo += C) {
        int which = s->epoch++ & 1;
        uint8_t *mine = hvdl__shm_slot(s, s->me, which);
        for (int j = 0; j < L; j++) {
            int64_t n = min64(C, send_bytes[j] - lo);
            if (n > 0) memcpy(mine + j * C, (const uint8_t *)in + soff[j] + lo, (size_t)n);
        }
        hvdl__shm_post(c);
        if (hvdl__shm_wait_all(c)) return -1;
        for (int q = 0; q < L; q++) {
            int64_t n = min64(C, recv_bytes[q] - lo);
            if (n > 0) memcpy((uint8_t *)out + roff[q] + lo, hvdl__shm_slot(s, q, which) + s->me * C, (size_t)n);
        }
    }
    return 0;
}
