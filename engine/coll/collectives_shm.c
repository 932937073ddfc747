/*
 * Collectives over the node's shared-memory segment, used when every member of the
 * process set is on this node and they are all of its ranks.
 *
 * Each local rank owns two slots of (L + 1) chunks: L chunks (the "copy" part) hold its
 * copy of a piece of the buffer, one chunk (the "result" part) its share of the reduced
 * result. Pieces alternate between the two slots (s->epoch counts them across calls).
 * A piece is L chunks (C bytes each, HOROVODLIKE_SHM_CHUNK_BYTES), so it stays in cache
 * from copy-in through reduction to copy-out.
 *
 * Synchronisation is the node barrier of shm.c (post = arrive, wait all = until all
 * have), and one rule makes the double buffer safe without a closing barrier:
 *   (R) data published by barrier g (written before it, read after it) is read only
 *       before the reader arrives at barrier g + 1; so a rank that has passed g + 1
 *       may overwrite it.
 * A part of slot s holds piece e, then piece e + 2 (e + 1 uses the other slot). Every
 * collective below writes a part for piece e + 2 only after passing the barrier that
 * follows the one that published piece e there, so by (R) every reader is done with it.
 *
 * Allreduce, two-shot, pipelined: one barrier per piece, P + 1 for P pieces.
 *   round k (k = 0..P), then barrier k:
 *     copy-out  piece k-2: every result chunk of its slot into the buffer
 *     reduce    piece k-1: rank j reduces chunk j of every rank's copy into its result
 *     copy-in   piece k:   this rank's piece into the copy part of its slot
 *   after barrier P: copy-out of piece P-1.
 * Piece k's copies are published by barrier k and reduced before barrier k + 1; its
 * results are published by barrier k + 1 and copied out before barrier k + 2: (R)
 * holds. Piece k + 2 writes its copies in round k + 2 (after barrier k + 1) and its
 * results in round k + 3 (after barrier k + 2): each after the barrier that follows
 * the publication of piece k's, as the rule needs. Within a round, copy-in writes the
 * copy part of piece k's slot while the others may still read the result part of that
 * same slot (piece k-2): different bytes. Across calls: the next collective's first
 * piece (P) uses piece P-2's slot, whose copies and results were read before barriers
 * P-1 and P, and it writes only after barrier P; its second piece writes only after a
 * barrier of its own, which every rank reaches after the final copy-out of piece P-1.
 * Unpipelined (copy-in, barrier, reduce, barrier, copy-out) it would take 2P barriers
 * (measured: docs/benchmarks.md, "One barrier per shared-memory piece").
 * Cost for S bytes: each rank copies S in, reduces S/L from L slots, copies S out: about
 * 4S bytes of cache traffic per rank, of which only reading the input and writing the
 * output reach DRAM. Average's 1/n is applied to each share by the rank that reduces it
 * (S/L multiplies per rank, in cache), not by every rank over its whole output (S).
 * Synchronisation: S/(L*C) + 1 barriers.
 *
 * Allreduce, one-shot (S <= one chunk): copy-in, one barrier, and every rank reduces all
 * L slots itself, in rank order so every rank gets bit-identical results. Cost: one
 * barrier and L*S reads: the choice for latency-bound sizes.
 *
 * Every other collective here is one barrier per piece: write this piece's part of the
 * slot, barrier, read; the next piece's barrier is then the "g + 1" of rule (R).
 * Broadcast: the root copies a piece in, one barrier, the others copy it out.
 * Reducescatter and alltoall: a slot holds one chunk per member; see each function.
 * Allgather: every rank copies a piece of its block in, one barrier, every rank copies
 * every block's piece out.
 * The reduction arithmetic runs only here, in the thread running the engine's cycle:
 * the engine thread, or, on one node, a training thread waiting for its op (it drives
 * the engine's work while the engine thread waits; core/engine.h, "Threads and who owns
 * what", which gives the trade and its measured figure): a small op needs no thread
 * hand-off, and the caller's core spends the reduction's time that it would otherwise
 * have spent waiting.
 */
#include "context.h"
#include <string.h>

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* dst = src[0] (op) src[1] (op) ... (op) src[L-1], in that order on every rank, so that
 * every rank's result is bit-identical: the first step reads two sources at once. */
static void reduce_in_order(int dtype, int op, void *dst, const uint8_t *const *src, int L,
                            int64_t count) {
    /* L >= 1 (this rank is on the node); "L < 2" rather than "L == 1" shows the compiler
     * that src[0] and src[1] are set on the path below (no -Wmaybe-uninitialized). */
    if (L < 2) {
        memcpy(dst, src[0], (size_t)(count * hvdl_dtype_size(dtype)));
        return;
    }
    hvdl__reduce_to(dtype, op, dst, src[0], src[1], count);
    for (int q = 2; q < L; q++) hvdl__reduce(dtype, op, dst, src[q], count);
}

static int one_shot(ctx_t *c, hvdl_shm_t *s, const uint8_t *in, uint8_t *out, int64_t bytes,
                    int dtype, int op, double post) {
    int esz = hvdl_dtype_size(dtype), which = s->epoch++ & 1, L = s->nlocal;
    const uint8_t *src[L];
    memcpy(hvdl__shm_slot(s, s->me, which), in, (size_t)bytes);
    hvdl__shm_post(c);
    if (hvdl__shm_wait_all(c)) return -1;
    for (int q = 0; q < L; q++) src[q] = hvdl__shm_slot(s, q, which);
    reduce_in_order(dtype, op, out, src, L, bytes / esz);
    hvdl__scale(dtype, out, bytes / esz, post);   /* while out is still in cache */
    return 0;
}

/* The part of a piece that local rank j reduces: whole elements, nearly equal. */
static void share_of(int64_t len, int esz, int L, int j, int64_t *off, int64_t *n) {
    int64_t elems = len / esz;
    int64_t lo = elems / L * j + (j < elems % L ? j : elems % L);
    *off = lo * esz;
    *n = (elems / L + (j < elems % L)) * esz;
}

/* Two-shot step 2 for one piece: this rank's share of every rank's copy in slot `which`,
 * reduced in rank order into its result chunk and scaled by post there (Average's 1/n):
 * each element is scaled once on the node, by its share's owner, and no pass over the
 * output follows. Returns the share's offset and size. */
static void reduce_share(hvdl_shm_t *s, int64_t len, int dtype, int op, double post, int which,
                         int64_t *off, int64_t *n) {
    int L = s->nlocal, esz = hvdl_dtype_size(dtype);
    uint8_t *res = hvdl__shm_slot(s, s->me, which) + L * s->rchunk;
    const uint8_t *src[L];
    share_of(len, esz, L, s->me, off, n);
    for (int q = 0; q < L; q++) src[q] = hvdl__shm_slot(s, q, which) + *off;
    reduce_in_order(dtype, op, res, src, L, *n / esz);
    hvdl__scale(dtype, res, *n / esz, post);
}

/* Step 3 for one piece: every rank's result chunk into place. */
static void piece_copy_out(hvdl_shm_t *s, uint8_t *dst, int64_t len, int esz, int which) {
    for (int q = 0; q < s->nlocal; q++) {
        int64_t off, n;
        share_of(len, esz, s->nlocal, q, &off, &n);
        memcpy(dst + off, hvdl__shm_slot(s, q, which) + s->nlocal * s->rchunk, (size_t)n);
    }
}

/* Several tensors as one virtual buffer (a fused response) without a fusion buffer:
 * pieces are gathered from the callers' inputs straight into the slot and the results
 * scattered straight to their outputs. `at` walks the spans in order. */
typedef struct cursor {
    const span_t *v;
    int i;
    int64_t skip;
} cursor_t;

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

/* Where a two-shot pass reads and writes: one input and one output buffer, or (v set)
 * the spans of a fused response. */
typedef struct io {
    const uint8_t *in;
    uint8_t *out;
    const span_t *v;
    int nspans;
    cursor_t at;
} io_t;

static void copy_in(io_t *io, uint8_t *slot, int64_t lo, int64_t len) {
    if (!io->v) {
        memcpy(slot, io->in + lo, (size_t)len);
        return;
    }
    gather(&io->at, slot, len);
    while (io->at.i < io->nspans && io->v[io->at.i].nbytes == 0) io->at.i++;
}

static void copy_out(io_t *io, hvdl_shm_t *s, int which, int64_t lo, int64_t len, int esz) {
    if (!io->v) {
        piece_copy_out(s, io->out + lo, len, esz, which);
        return;
    }
    for (int q = 0; q < s->nlocal; q++) {
        int64_t off, n;
        share_of(len, esz, s->nlocal, q, &off, &n);
        if (n) scatter(io->v, lo + off, hvdl__shm_slot(s, q, which) + s->nlocal * s->rchunk, n);
    }
}

/* The pipelined two-shot (see the top of the file): P pieces, P + 1 barriers. Round k
 * copies piece k - 2's results out, reduces this rank's share of piece k - 1 and copies
 * piece k in, then arrives at barrier k. */
static int two_shot(ctx_t *c, hvdl_shm_t *s, io_t *io, int64_t bytes, int dtype, int op,
                    double post) {
    int esz = hvdl_dtype_size(dtype);
    int64_t piece = s->rchunk * s->nlocal, P = (bytes + piece - 1) / piece, off, n;
    uint32_t e0 = s->epoch;
    s->epoch += (uint32_t)P;
#define LEN(k) min64(piece, bytes - (k) * piece)
#define WHICH(k) (int)((e0 + (uint32_t)(k)) & 1)
    /* The clock is read four times a piece (tens of nanoseconds against a piece's tens
     * of microseconds) for the debug report's split of the work (shm.c). */
    double t = hvdl_now(), t1;   /* t1: the end of the step that began at t */
    for (int64_t k = 0; k <= P; k++) {
        if (k >= 2) copy_out(io, s, WHICH(k - 2), (k - 2) * piece, LEN(k - 2), esz);
        t1 = hvdl_now();
        s->copy_out_s += t1 - t, t = t1;
        if (k >= 1) reduce_share(s, LEN(k - 1), dtype, op, post, WHICH(k - 1), &off, &n);
        t1 = hvdl_now();
        s->reduce_s += t1 - t, t = t1;
        if (k < P) copy_in(io, hvdl__shm_slot(s, s->me, WHICH(k)), k * piece, LEN(k));
        s->copy_in_s += hvdl_now() - t;
        hvdl__shm_post(c);
        if (hvdl__shm_wait_all(c)) return -1;
        t = hvdl_now();
    }
    if (P) copy_out(io, s, WHICH(P - 1), (P - 1) * piece, LEN(P - 1), esz);
    s->copy_out_s += hvdl_now() - t;
    s->two_shots++;
#undef LEN
#undef WHICH
    return 0;
}

int hvdl__allreduce_shm_spans(ctx_t *c, const span_t *v, int nspans, int dtype, int op,
                              double post) {
    int64_t total = 0;
    for (int i = 0; i < nspans; i++) total += v[i].nbytes;
    if (!total) return 0;
    io_t io = {NULL, NULL, v, nspans, {v, 0, 0}};
    while (io.at.i < nspans && v[io.at.i].nbytes == 0) io.at.i++;
    return two_shot(c, c->shm, &io, total, dtype, op, post);
}

/* The hierarchical allreduce's halves work on a range [lo, hi) of the buffer, lo a
 * multiple of hvdl__shm_piece_bytes (the two-shot's piece), so that it can pipeline
 * them piece by piece (allreduce_hier.c). Each shm piece of the range is one barrier. */
int64_t hvdl__shm_piece_bytes(const ctx_t *c) { return c->shm->rchunk * c->shm->nlocal; }

/* This rank's share of [lo, hi): what hvdl__shm_reduce_scatter writes for that range. */
int64_t hvdl__shm_share_bytes(const ctx_t *c, int64_t lo, int64_t hi, int dtype) {
    int64_t piece = hvdl__shm_piece_bytes(c), total = 0, off, n;
    for (; lo < hi; lo += piece) {
        share_of(min64(piece, hi - lo), hvdl_dtype_size(dtype), c->shm->nlocal, c->shm->me, &off,
                 &n);
        total += n;
    }
    return total;
}

/* The first half of hierarchical allreduce: this rank's reduced shares of every piece of
 * [lo, hi), written contiguously to out (hvdl__shm_share_bytes in all). */
int hvdl__shm_reduce_scatter(ctx_t *c, const void *buf, int64_t lo, int64_t hi, int dtype, int op,
                             uint8_t *out) {
    hvdl_shm_t *s = c->shm;
    int64_t piece = hvdl__shm_piece_bytes(c), off, n;
    for (; lo < hi; lo += piece) {
        int which = s->epoch++ & 1;
        int64_t len = min64(piece, hi - lo);
        memcpy(hvdl__shm_slot(s, s->me, which), (const uint8_t *)buf + lo, (size_t)len);
        hvdl__shm_post(c);
        if (hvdl__shm_wait_all(c)) return -1;
        /* No closing barrier: the result chunk is read by this rank alone, and the
         * copies it reduces from are written again only two pieces later, after barrier
         * k + 1, which every rank reaches once it has finished reducing piece k. */
        reduce_share(s, len, dtype, op, 1.0, which, &off, &n);
        memcpy(out, hvdl__shm_slot(s, s->me, which) + s->nlocal * s->rchunk, (size_t)n);
        out += n;
    }
    return 0;
}

/* The second half: put every rank's (now globally reduced) shares of [lo, hi) back into
 * buf. */
int hvdl__shm_allgather_shares(ctx_t *c, void *buf, int64_t lo, int64_t hi, int dtype,
                               const uint8_t *shares) {
    hvdl_shm_t *s = c->shm;
    int esz = hvdl_dtype_size(dtype);
    int64_t piece = hvdl__shm_piece_bytes(c), off, n;
    for (; lo < hi; lo += piece) {
        int which = s->epoch++ & 1;
        int64_t len = min64(piece, hi - lo);
        share_of(len, esz, s->nlocal, s->me, &off, &n);
        if (n) {   /* a rank's share may be empty (and `shares` NULL) for tiny buffers */
            memcpy(hvdl__shm_slot(s, s->me, which) + s->nlocal * s->rchunk, shares, (size_t)n);
            shares += n;
        }
        hvdl__shm_post(c);
        if (hvdl__shm_wait_all(c)) return -1;
        piece_copy_out(s, (uint8_t *)buf + lo, len, esz, which);
    }
    return 0;
}

/* in may equal out; when it does not, the caller's input is read straight into the
 * segment and the result written straight to the output: no staging copy. */
int hvdl__allreduce_shm(ctx_t *c, const void *in, void *out, int64_t count, int dtype, int op,
                        double post) {
    hvdl_shm_t *s = c->shm;
    int64_t bytes = count * hvdl_dtype_size(dtype);
    if (!bytes) return 0;
    double t0 = hvdl_now();
    int one = bytes <= s->rchunk;
    io_t io = {in, out, NULL, 0, {NULL, 0, 0}};
    int rc = one ? one_shot(c, s, in, out, bytes, dtype, op, post)
                 : two_shot(c, s, &io, bytes, dtype, op, post);
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
            if (q != s->me && n > 0)
                memcpy(o + off[q] + lo, hvdl__shm_slot(s, q, which), (size_t)n);
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
                            int dtype, int op, double post) {
    hvdl_shm_t *s = c->shm;
    int L = s->nlocal, esz = hvdl_dtype_size(dtype);
    int64_t off[L + 1], longest = 0, C = s->rchunk;
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
        const uint8_t *src[L];
        for (int q = 0; q < L; q++)
            src[q] = q == s->me && !staged ? own + lo : hvdl__shm_slot(s, q, which) + s->me * C;
        reduce_in_order(dtype, op, dst, src, L, n / esz);
        hvdl__scale(dtype, dst, n / esz, post);   /* while the piece is in cache */
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
    int64_t soff[L + 1], roff[L + 1], C = s->rchunk;
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
            if (n > 0)
                memcpy((uint8_t *)out + roff[q] + lo, hvdl__shm_slot(s, q, which) + s->me * C,
                       (size_t)n);
        }
    }
    return 0;
}
