#include "util.h"
#include <stdlib.h>
#include <string.h>
#include <time.h>

int buf_reserve(buf_t *b, int64_t cap) {
    if (cap <= b->cap) return 0;
    int64_t n = b->cap ? b->cap : 256;
    while (n < cap) n *= 2;
    uint8_t *p = realloc(b->data, (size_t)n);
    if (!p) return -1;
    b->data = p;
    b->cap = n;
    return 0;
}

int buf_put(buf_t *b, const void *p, int64_t n) {
    if (buf_reserve(b, b->len + n)) return -1;
    if (n) memcpy(b->data + b->len, p, (size_t)n);
    b->len += n;
    return 0;
}

int buf_put_u32(buf_t *b, uint32_t v) { return buf_put(b, &v, 4); }

int buf_put_str(buf_t *b, const char *s) {
    uint32_t n = (uint32_t)strlen(s);
    return buf_put_u32(b, n) || buf_put(b, s, n);
}

void buf_consume(buf_t *b, int64_t n) {
    if (n >= b->len) {
        b->len = 0;
        return;
    }
    memmove(b->data, b->data + n, (size_t)(b->len - n));
    b->len -= n;
}

const char *buf_cstr(buf_t *b) {
    if (buf_reserve(b, b->len + 1)) return "";
    b->data[b->len] = 0;
    return (const char *)b->data;
}

void buf_free(buf_t *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

int rd_fail(reader_t *r, const char *why) {
    if (!r->why) r->why = why;
    r->bad = 1;
    return -1;
}

int rd_oom(reader_t *r, const char *what, int64_t bytes) {
    if (!r->bad) {
        r->oom = 1;
        r->oom_bytes = bytes;
    }
    return rd_fail(r, what);
}

void rd_get(reader_t *r, void *out, int64_t n) {
    if (r->bad || n < 0 || n > r->left) {
        rd_fail(r, "it ends before its last field");
        if (n > 0) memset(out, 0, (size_t)n);
        return;
    }
    memcpy(out, r->p, (size_t)n);
    r->p += n;
    r->left -= n;
}

uint32_t rd_u32(reader_t *r) {
    uint32_t v;
    rd_get(r, &v, 4);
    return v;
}

char *rd_str(reader_t *r) {
    uint32_t n = rd_u32(r);
    if (r->bad || n > r->left) {
        rd_fail(r, "a string runs past the end of the frame");
        return NULL;
    }
    if (memchr(r->p, 0, n)) {
        rd_fail(r, "a string holds a NUL byte");
        return NULL;
    }
    char *s = malloc((size_t)n + 1);
    if (!s) {
        rd_oom(r, "string from the wire", (int64_t)n + 1);
        return NULL;
    }
    memcpy(s, r->p, n);
    s[n] = 0;
    r->p += n;
    r->left -= n;
    return s;
}

/* FNV-1a: names are short and this map is small; no need for anything stronger. */
static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ULL;
    return h;
}

static char TOMB[1];

static int find_slot(const strmap_t *m, const char *key, int *found) {
    int mask = m->cap - 1, first_tomb = -1;
    for (int i = (int)(hash_str(key) & (uint64_t)mask);; i = (i + 1) & mask) {
        char *k = m->keys[i];
        if (!k) {
            *found = 0;
            return first_tomb >= 0 ? first_tomb : i;
        }
        if (k == TOMB) {
            if (first_tomb < 0) first_tomb = i;
            continue;
        }
        if (!strcmp(k, key)) {
            *found = 1;
            return i;
        }
    }
}

static int grow(strmap_t *m) {
    strmap_t n = {0};
    n.cap = m->cap ? m->cap * 2 : 64;
    while ((m->count + 1) * 2 > n.cap) n.cap *= 2;
    n.keys = calloc((size_t)n.cap, sizeof(char *));
    n.vals = calloc((size_t)n.cap, sizeof(void *));
    if (!n.keys || !n.vals) {
        free(n.keys);
        free(n.vals);
        return -1;
    }
    for (int i = 0; i < m->cap; i++) {
        if (!m->keys[i] || m->keys[i] == TOMB) continue;
        int found, j = find_slot(&n, m->keys[i], &found);
        n.keys[j] = m->keys[i];
        n.vals[j] = m->vals[i];
        n.count++;
    }
    free(m->keys);
    free(m->vals);
    *m = n;
    return 0;
}

void *strmap_get(const strmap_t *m, const char *key) {
    if (!m->cap) return NULL;
    int found, i = find_slot(m, key, &found);
    return found ? m->vals[i] : NULL;
}

int strmap_put(strmap_t *m, const char *key, void *val) {
    if ((m->count + m->tombs + 1) * 2 > m->cap && grow(m)) return -1;
    int found, i = find_slot(m, key, &found);
    if (!found) {
        char *k = strdup(key);
        if (!k) return -1;
        if (m->keys[i] == TOMB) m->tombs--;
        m->keys[i] = k;
        m->count++;
    }
    m->vals[i] = val;
    return 0;
}

void *strmap_del(strmap_t *m, const char *key) {
    if (!m->cap) return NULL;
    int found, i = find_slot(m, key, &found);
    if (!found) return NULL;
    void *v = m->vals[i];
    free(m->keys[i]);
    m->keys[i] = TOMB;
    m->vals[i] = NULL;
    m->count--;
    m->tombs++;
    return v;
}

void strmap_free(strmap_t *m) {
    for (int i = 0; i < m->cap; i++)
        if (m->keys[i] && m->keys[i] != TOMB) free(m->keys[i]);
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

double hvdl_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}
