/*
 * Everything that depends on the CPU or on the operating system, in one place: a spin
 * pause, futex wait/wake, the wake-up eventfd, kernel randomness, and function
 * multi-versioning for the reduce kernels. The rest of the engine is plain C11 + POSIX;
 * a port to a new architecture or OS starts (and should end) here.
 *
 * CI compiles the engine for aarch64 as well as x86-64 (scripts/cross_compile.sh), so
 * an architecture-specific builtin anywhere else breaks the build at once.
 */
#ifndef HVDL_PLATFORM_H
#define HVDL_PLATFORM_H
#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* A hint inside a spin loop: lets the sibling hyperthread run and saves power. */
static inline void hvdl_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
    __asm__ __volatile__("yield" ::: "memory");
#else
    atomic_signal_fence(memory_order_seq_cst);   /* keeps the loop a loop, nothing more */
#endif
}

/* Reduce kernels built twice on x86-64 (AVX2/FMA/F16C and baseline), the best picked
 * at load time; elsewhere the one baseline build (aarch64's baseline has NEON). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HVDL_TARGET_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define HVDL_TARGET_CLONES
#endif

#ifdef __linux__
#include <linux/futex.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Sleep while *addr == expected, at most ts (NULL: no limit); shared between processes. */
static inline long hvdl_futex_wait(_Atomic uint32_t *addr, uint32_t expected, const struct timespec *ts) {
    return syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT, expected, ts, NULL, 0);
}

/* Wake every sleeper on addr. */
static inline long hvdl_futex_wake_all(_Atomic uint32_t *addr) {
    return syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

/* A non-blocking, close-on-exec counter fd that poll() sees as readable once written. */
static inline int hvdl_wakefd_open(void) { return eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); }

static inline void hvdl_wakefd_signal(int fd) {
    uint64_t one = 1;
    if (write(fd, &one, sizeof one) < 0) { /* counter saturated: already awake */ }
}

static inline void hvdl_wakefd_drain(int fd) {
    uint64_t v;
    if (read(fd, &v, sizeof v) < 0) { /* nothing to drain */ }
}

/* n bytes from the kernel's random source; 0, or -1 if it cannot supply them. */
static inline int hvdl_random_bytes(void *out, size_t n) {
    uint8_t *p = out;
    while (n) {
        ssize_t k = getrandom(p, n, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}
#else
#error "horovodlike's engine needs Linux (futex, eventfd, getrandom): port engine/platform.h"
#endif

#endif
