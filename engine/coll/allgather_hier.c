/*
 * Hierarchical allgather: shared memory inside each node, TCP only between nodes.
 *
 *  1. shm allgather on each node: every local rank has its node's blocks.
 *  2. One cross-node ring per local index: local rank j forwards part j of its node's
 *     buffer around the ranks with index j on the other nodes, so the L rings of a node
 *     share the inter-node traffic.
 *  3. shm allgather on each node of those parts: every local rank has every node's
 *     buffer, and copies each rank's block to its place in the output.
 *
 * Cost for S bytes over N nodes of L ranks: N-1 network steps (against NL-1 for a flat
 * ring), each node sending (N-1)/N * S in total split over L streams; two shm
 * allgathers. Needs every node to have the same number of ranks.
 */
#include "context.h"
#include <stdlib.h>
#include <string.h>

/* Bytes [off, off + len) of node k's buffer that local index j carries across nodes. */
static void part(int64_t node_bytes, int L, int j, int64_t *off, int64_t *len) {
    *off = node_bytes * j / L;
    *len = node_bytes * (j + 1) / L - *off;
}

int hvdl__allgather_hier(ctx_t *c, void *out, const int64_t *block_bytes) {
    int P = c->size, L = c->shm->nlocal, N = c->cross->n, me = c->shm->me, kme = c->cross->me;
    const int *node_of = c->node;
    int64_t goff[P + 1], node_bytes[N], total = 0;
    int64_t local[L], cb[N], pj[L], nstart[N + 1];    /* before any goto: they are VLAs */
    goff[0] = 0;
    for (int r = 0; r < P; r++) goff[r + 1] = goff[r] + block_bytes[r];
    for (int k = 0; k < N; k++) {
        node_bytes[k] = 0;
        for (int r = 0; r < P; r++)
            if (node_of[r] == node_of[c->cross->ranks[k]]) node_bytes[k] += block_bytes[r];
        total += node_bytes[k];
    }
    int inject = HVDL_CTX_INJECT(c, INJ_HIER_ALLOC);
    uint8_t *node = inject ? NULL : malloc((size_t)node_bytes[kme] + 1),
            *cross = malloc((size_t)total + 1), *all = malloc((size_t)total + 1),
            *nodes = malloc((size_t)total + 1);
    int rc = -1;
    if (!node || !cross || !all || !nodes) {
        hvdl__ctx_oom(c, "hierarchical allgather buffer", 3 * total);
        goto done;
    }

    /* 1. my node's blocks, in local order */
    int64_t at = 0, mine_at = 0;
    for (int r = 0, i = 0; r < P; r++) {
        if (node_of[r] != node_of[c->rank]) continue;
        if (r == c->rank) mine_at = at;
        local[i++] = block_bytes[r];
        at += block_bytes[r];
    }
    memcpy(node + mine_at, (uint8_t *)out + goff[c->rank], (size_t)block_bytes[c->rank]);
    if (hvdl__allgather_shm(c, node, local)) goto done;

    /* 2. part `me` of every node's buffer, around my cross ring */
    int64_t coff = 0, off, len;
    for (int k = 0; k < N; k++) {
        part(node_bytes[k], L, me, &off, &len);
        cb[k] = len;
        if (k == kme) memcpy(cross + coff, node + off, (size_t)len);
        coff += len;
    }
    if (hvdl__allgather_ring(c, c->cross, cross, cb)) goto done;

    /* 3. everyone's parts, then each node's buffer, then each rank's block */
    int64_t aoff = 0;
    for (int j = 0; j < L; j++) {
        pj[j] = 0;
        for (int k = 0; k < N; k++) {
            part(node_bytes[k], L, j, &off, &len);
            pj[j] += len;
        }
        if (j < me) aoff += pj[j];
    }
    memcpy(all + aoff, cross, (size_t)pj[me]);
    if (hvdl__allgather_shm(c, all, pj)) goto done;
    nstart[0] = 0;
    for (int k = 0; k < N; k++) nstart[k + 1] = nstart[k] + node_bytes[k];
    for (int j = 0, a = 0; j < L; j++)
        for (int k = 0; k < N; k++) {
            part(node_bytes[k], L, j, &off, &len);
            memcpy(nodes + nstart[k] + off, all + a, (size_t)len);
            a += len;
        }
    for (int k = 0; k < N; k++) {
        int64_t pos = nstart[k];
        for (int r = 0; r < P; r++) {
            if (node_of[r] != node_of[c->cross->ranks[k]]) continue;
            memcpy((uint8_t *)out + goff[r], nodes + pos, (size_t)block_bytes[r]);
            pos += block_bytes[r];
        }
    }
    rc = 0;
done:
    free(node);
    free(cross);
    free(all);
    free(nodes);
    return rc;
}
