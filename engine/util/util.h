/* Small containers the engine needs: a growable byte buffer with a writer and a reader
 * for the wire format, a string-keyed hash map, and a monotonic clock. */
#ifndef HVDL_UTIL_H
#define HVDL_UTIL_H
#include <stdint.h>
#include <stddef.h>

typedef struct buf {
    uint8_t *data;
    int64_t len, cap;
} buf_t;
int buf_reserve(buf_t *b, int64_t cap);     /* 0 or -1 (out of memory) */
int buf_put(buf_t *b, const void *p, int64_t n);
int buf_put_u32(buf_t *b, uint32_t v);
int buf_put_str(buf_t *b, const char *s);
void buf_consume(buf_t *b, int64_t n);      /* drop n bytes from the front */
const char *buf_cstr(buf_t *b);             /* NUL-terminated view (the NUL is not counted) */
void buf_free(buf_t *b);

/* Reads a wire message; any read past the end sets bad and yields zeros, so a parser
 * checks r.bad once at the end instead of after every field. why keeps the first
 * problem found, for the error message. oom says that problem is this rank's, not the
 * sender's: memory ran out while decoding (why then names what was being allocated,
 * oom_bytes its size), and the frame may well be fine. */
typedef struct reader {
    const uint8_t *p;
    int64_t left;
    int bad;
    const char *why;
    int oom;
    int64_t oom_bytes;
} reader_t;
void rd_get(reader_t *r, void *out, int64_t n);
uint32_t rd_u32(reader_t *r);
char *rd_str(reader_t *r);                  /* malloc'd copy, NULL if bad (or holds a NUL) */
int rd_fail(reader_t *r, const char *why);  /* mark bad with a reason; returns -1 */
int rd_oom(reader_t *r, const char *what, int64_t bytes); /* bad, but ours: no memory for what */

/* Open-addressing map from strings (copied) to pointers. */
typedef struct strmap {
    char **keys;
    void **vals;
    int cap, count, tombs;
} strmap_t;
void *strmap_get(const strmap_t *m, const char *key);
int strmap_put(strmap_t *m, const char *key, void *val); /* 0 or -1 */
void *strmap_del(strmap_t *m, const char *key);
void strmap_free(strmap_t *m);

double hvdl_now(void); /* seconds, monotonic */
#endif
