/*
 * The address blob: what each rank publishes before start-up (hvdl_prepare) so the
 * others can reach it: where it listens, its host, the nonce that proves a connection
 * is meant for this job and rank, and the settings every rank must share (config.h).
 * Fixed size (HVDL_BLOB_BYTES), versioned by the wire's magic and version.
 */
#include "net.h"
#include <stdio.h>
#include <string.h>

typedef struct blob {
    uint32_t magic, version;
    uint64_t nonce;
    int32_t port, pad;
    agreed_t agreed;         /* settings every rank must share */
    char ip[64];
    char host[128];
} blob_t;
_Static_assert(sizeof(blob_t) <= HVDL_BLOB_BYTES, "blob too large");

void hvdl__blob_write(engine_t *e, int port, const char *ip, char *out) {
    blob_t b = {.magic = WIRE_MAGIC, .version = WIRE_VERSION, .nonce = e->nonce, .port = port};
    hvdl__config_agreed(&e->cfg, &b.agreed);
    snprintf(b.ip, sizeof b.ip, "%s", ip);
    snprintf(b.host, sizeof b.host, "%s", e->host);
    memset(out, 0, HVDL_BLOB_BYTES);
    memcpy(out, &b, sizeof b);
}

int hvdl__blob_read(const char *in, peer_t *p) {
    blob_t b;
    memcpy(&b, in, sizeof b);
    if (b.magic != WIRE_MAGIC || b.version != WIRE_VERSION) return -1;
    b.ip[sizeof b.ip - 1] = b.host[sizeof b.host - 1] = 0;
    memcpy(p->host, b.host, sizeof p->host);
    memcpy(p->ip, b.ip, sizeof p->ip);
    p->port = b.port;
    p->nonce = b.nonce;
    p->agreed = b.agreed;
    return 0;
}
