/*
 * The shared-memory mailbox of one (src, dst) pair of ranks on one node: a ring of
 * nslots slots of slot_bytes each, written by src and read by dst. p2p_rendezvous.c
 * moves a rendezvous message's payload through it piece by piece (a piece per slot); the pair's
 * TCP connection carries the signals (which slot is full, which is free), so matching,
 * ordering and failure detection stay where they were.
 *
 * The segment has no name: src makes it with memfd_create on its first rendezvous send
 * to dst and offers it over the connection as (its pid, the fd, a random token); dst
 * opens /proc/<pid>/fd/<fd>, maps it, and checks the token in its first page, which
 * proves it mapped the segment src meant (not some other file of that number). Nothing
 * is ever left in /dev/shm, whichever rank is killed when: the memory lives only in the
 * two processes' mappings (and src's fd) and goes with them. Where /proc cannot be read
 * (another pid namespace, a hardened /proc), dst refuses and the payloads go over the
 * connection.
 *
 * The same kind of segment, with one slot, is the pair's mailbox for small messages and
 * announcements (p2p_mailbox.c, "The mailbox"): a byte ring of records (header, name, payload)
 * whose producer and consumer positions, the receiver's "polling" count and the
 * sender's "want room" flag are atomic words in the token's page. The two processes
 * share nothing else: every length the reader takes from it is checked (p2p_frames.c).
 *
 * Cost: one page + slot_bytes * nslots of memory per pair that sends large messages
 * (HOROVODLIKE_P2P_SHM_RING_BYTES, 4 MiB by default), made once; a piece costs one
 * memcpy on each side plus a small frame each way.
 */
#define _GNU_SOURCE
#include "p2p_ring.h"
#include <errno.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#define RING_HEAD 4096                              /* the token's page, before the slots */

static int map(p2p_ring_t *r, int fd, int64_t slot_bytes, int nslots) {
    size_t bytes = RING_HEAD + (size_t)slot_bytes * (size_t)nslots;
    struct stat st;
    if (fstat(fd, &st)) return errno;
    if ((size_t)st.st_size != bytes) return EINVAL;
    void *base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) return errno;
    r->base = base;
    r->bytes = bytes;
    r->slot_bytes = slot_bytes;
    r->nslots = nslots;
    return 0;
}

int hvdl__p2p_ring_create(p2p_ring_t *r, int64_t slot_bytes, int nslots) {
    memset(r, 0, sizeof *r);
    r->fd = -1;
    int fd = memfd_create("hvdl-p2p-ring", MFD_CLOEXEC);
    if (fd < 0) return errno;
    int err = ftruncate(fd, (off_t)(RING_HEAD + (size_t)slot_bytes * (size_t)nslots))
                  ? errno
                  : map(r, fd, slot_bytes, nslots);
    if (!err && getrandom(&r->token, sizeof r->token, 0) != (ssize_t)sizeof r->token) err = EIO;
    if (err) {
        close(fd);
        hvdl__p2p_ring_close(r);
        return err;
    }
    memcpy(r->base, &r->token, sizeof r->token);
    r->fd = fd;
    return 0;
}

int hvdl__p2p_ring_attach(p2p_ring_t *r, int64_t pid, int64_t fdnum, uint64_t token,
                          int64_t slot_bytes, int nslots) {
    memset(r, 0, sizeof *r);
    r->fd = -1;
    char path[64];
    snprintf(path, sizeof path, "/proc/%lld/fd/%lld", (long long)pid, (long long)fdnum);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return errno;
    int err = map(r, fd, slot_bytes, nslots);
    close(fd);                                      /* the mapping keeps it */
    if (!err && memcmp(r->base, &token, sizeof token)) err = EACCES;
    if (err) hvdl__p2p_ring_close(r);
    return err;
}

void hvdl__p2p_ring_close(p2p_ring_t *r) {
    if (r->base) munmap(r->base, r->bytes);
    if (r->fd >= 0) close(r->fd);
    r->base = NULL;
    r->fd = -1;
}

uint8_t *hvdl__p2p_ring_slot(const p2p_ring_t *r, int64_t piece) {
    return r->base + RING_HEAD + (size_t)(piece % r->nslots) * (size_t)r->slot_bytes;
}

_Atomic uint64_t *hvdl__p2p_mbox_word(const p2p_ring_t *r, int which) {
    return (_Atomic uint64_t *)(r->base + 64 * (which + 1)); /* the token is at 0 */
}

void hvdl__p2p_mbox_put(const p2p_ring_t *r, uint64_t pos, const void *src, size_t n) {
    uint64_t cap = (uint64_t)r->slot_bytes, off = pos % cap;
    size_t k = n < cap - off ? n : (size_t)(cap - off);
    uint8_t *data = r->base + RING_HEAD;
    memcpy(data + off, src, k);
    if (n > k) memcpy(data, (const uint8_t *)src + k, n - k);
}

void hvdl__p2p_mbox_get(const p2p_ring_t *r, uint64_t pos, void *dst, size_t n) {
    uint64_t cap = (uint64_t)r->slot_bytes, off = pos % cap;
    size_t k = n < cap - off ? n : (size_t)(cap - off);
    const uint8_t *data = r->base + RING_HEAD;
    if (!dst) return;
    memcpy(dst, data + off, k);
    if (n > k) memcpy((uint8_t *)dst + k, data, n - k);
}
