/* SHA-256 and HMAC-SHA256 (FIPS 180-4, RFC 2104), small and dependency-free, for the
 * engine's connection handshake: a peer proves it holds the job key by answering a
 * random challenge with an HMAC over it, so the key itself never crosses the wire.
 * Speed does not matter here (a few hashes per connection at start-up). */
#ifndef HVDL_AUTH_H
#define HVDL_AUTH_H
#include <stddef.h>
#include <stdint.h>

#define HVDL_SHA256_BYTES 32

typedef struct sha256 {
    uint32_t h[8];           /* the chaining state */
    uint8_t block[64];       /* bytes of the current, incomplete block */
    size_t fill;             /* how many of block[] are used */
    uint64_t total;          /* message length so far, in bytes */
} sha256_t;

void hvdl__sha256_init(sha256_t *s);
void hvdl__sha256_update(sha256_t *s, const void *p, size_t n);
void hvdl__sha256_final(sha256_t *s, uint8_t out[HVDL_SHA256_BYTES]);

/* HMAC-SHA256 over the concatenation of nparts byte ranges (parts[i], lens[i]). */
void hvdl__hmac_sha256(const uint8_t *key, size_t key_len, int nparts, const void *const *parts,
                       const size_t *lens, uint8_t out[HVDL_SHA256_BYTES]);

/* 1 when a and b are equal; the time taken does not depend on where they differ. */
int hvdl__equal_ct(const uint8_t *a, const uint8_t *b, size_t n);
#endif
