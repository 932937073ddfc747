/*
 * SHA-256 (FIPS 180-4) and HMAC (RFC 2104), written out plainly. Checked against the
 * RFC 4231 test vectors and Python's hmac module by tests/test_engine_hostile.py through
 * hvdl_hmac_sha256().
 *
 * SHA-256 in one paragraph: pad the message to a multiple of 64 bytes (a 1 bit, zeros,
 * then the length in bits as a big-endian u64), and fold each 64-byte block into eight
 * 32-bit words of state with 64 rounds of additions, rotations and the constants K
 * (the fractional parts of the cube roots of the first 64 primes).
 *
 * HMAC in one line: H((K ^ opad) || H((K ^ ipad) || message)), with K the key padded
 * with zeros to the block size (or hashed first if it is longer than a block).
 */
#include "auth.h"
#include "horovodlike.h"
#include <string.h>

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

/* Fold one 64-byte block into the state. */
static void compress(uint32_t h[8], const uint8_t *b) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++)     /* the block as 16 big-endian words */
        w[i] = (uint32_t)b[4 * i] << 24 | (uint32_t)b[4 * i + 1] << 16 |
               (uint32_t)b[4 * i + 2] << 8 | b[4 * i + 3];
    for (int i = 16; i < 64; i++) {  /* expanded to 64 */
        uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], bb = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[i] +
                      w[i];
        uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & bb) ^ (a & c) ^ (bb & c));
        hh = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = bb;
        bb = a;
        a = t1 + t2;
    }
    h[0] += a;
    h[1] += bb;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += hh;
}

void hvdl__sha256_init(sha256_t *s) {
    static const uint32_t H0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, H0, sizeof H0);
    s->fill = 0;
    s->total = 0;
}

void hvdl__sha256_update(sha256_t *s, const void *p, size_t n) {
    const uint8_t *c = p;
    s->total += n;
    while (n) {
        size_t k = 64 - s->fill < n ? 64 - s->fill : n;
        memcpy(s->block + s->fill, c, k);
        s->fill += k;
        c += k;
        n -= k;
        if (s->fill == 64) {
            compress(s->h, s->block);
            s->fill = 0;
        }
    }
}

void hvdl__sha256_final(sha256_t *s, uint8_t out[HVDL_SHA256_BYTES]) {
    uint64_t bits = s->total * 8;
    uint8_t pad[72] = {0x80};
    /* 0x80, then zeros up to 56 mod 64, then the 8-byte length */
    size_t npad = (s->fill < 56 ? 56 : 120) - s->fill;
    for (int i = 0; i < 8; i++) pad[npad + (size_t)i] = (uint8_t)(bits >> (56 - 8 * i));
    hvdl__sha256_update(s, pad, npad + 8);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(s->h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
        out[4 * i + 3] = (uint8_t)s->h[i];
    }
}

void hvdl__hmac_sha256(const uint8_t *key, size_t key_len, int nparts, const void *const *parts,
                       const size_t *lens, uint8_t out[HVDL_SHA256_BYTES]) {
    uint8_t k[64] = {0}, pad[64], inner[HVDL_SHA256_BYTES];
    sha256_t s;
    if (key_len > 64) {              /* a long key is replaced by its hash */
        hvdl__sha256_init(&s);
        hvdl__sha256_update(&s, key, key_len);
        hvdl__sha256_final(&s, k);
    } else if (key_len) {
        memcpy(k, key, key_len);
    }
    /* inner = H((K ^ ipad) || message) */
    for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x36;
    hvdl__sha256_init(&s);
    hvdl__sha256_update(&s, pad, 64);
    for (int i = 0; i < nparts; i++) hvdl__sha256_update(&s, parts[i], lens[i]);
    hvdl__sha256_final(&s, inner);
    /* out = H((K ^ opad) || inner) */
    for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x5c;
    hvdl__sha256_init(&s);
    hvdl__sha256_update(&s, pad, 64);
    hvdl__sha256_update(&s, inner, sizeof inner);
    hvdl__sha256_final(&s, out);
    memset(k, 0, sizeof k);
    memset(pad, 0, sizeof pad);
}

int hvdl__equal_ct(const uint8_t *a, const uint8_t *b, size_t n) {
    uint8_t diff = 0;
    for (size_t i = 0; i < n; i++) diff |= a[i] ^ b[i];
    return diff == 0;
}

/* The public test hook (horovodlike.h). */
int hvdl_hmac_sha256(const unsigned char *key, int key_len, const unsigned char *msg, int64_t len,
                     unsigned char *out) {
    if (key_len < 0 || len < 0 || (key_len && !key) || (len && !msg) || !out)
        return HVDL_ERR_INVALID;
    const void *parts[1] = {msg};
    size_t lens[1] = {(size_t)len};
    hvdl__hmac_sha256(key, (size_t)key_len, 1, parts, lens, out);
    return HVDL_OK;
}
