/*
 * Everything that depends on the CPU or on the operating system, in one place: a spin
 * pause, futex wait/wake, the wake-up eventfd, the doorbell signal between processes,
 * kernel randomness, and function
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
 * at load time; elsewhere the one baseline build (aarch64's baseline has NEON). Not
 * under ThreadSanitizer: the picker (an ifunc resolver) runs while the program is being
 * relocated, before TSan's runtime is up, and its instrumented entry crashes. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define HVDL_TARGET_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define HVDL_TARGET_CLONES
#endif

#ifdef __linux__
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Sleep while *addr == expected, at most ts (NULL: no limit); shared between processes. */
static inline long hvdl_futex_wait(_Atomic uint32_t *addr, uint32_t expected,
                                   const struct timespec *ts) {
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
    if (write(fd, &one, sizeof one) < 0) { /* counter saturated: already awake */
    }
}

static inline void hvdl_wakefd_drain(int fd) {
    uint64_t v;
    if (read(fd, &v, sizeof v) < 0) { /* nothing to drain */
    }
}

/* The doorbell: one thread wakes a thread of another process that sleeps in poll(),
 * without a file descriptor shared between them. The sleeper keeps the signal blocked
 * except inside ppoll(), which unblocks it atomically, so a ring that comes before the
 * sleep is not lost (it stays pending and ends the next ppoll at once) and one that
 * comes during it ends the ppoll with EINTR. Its handler does nothing. */
#define HVDL_DOORBELL_SIG (SIGRTMIN + 7)

static inline void hvdl_doorbell_handler(int sig) { (void)sig; }

/* Install the handler (process-wide, once). -1 if the signal already has another one. */
static inline int hvdl_doorbell_install(void) {
    struct sigaction old, sa = {0};
    if (sigaction(HVDL_DOORBELL_SIG, NULL, &old)) return -1;
    if (old.sa_handler == hvdl_doorbell_handler) return 0;
    if (old.sa_handler != SIG_DFL) return -1;
    sa.sa_handler = hvdl_doorbell_handler;
    sigemptyset(&sa.sa_mask);
    return sigaction(HVDL_DOORBELL_SIG, &sa, NULL);
}

/* Called by the sleeping thread: block the signal, and give the mask ppoll() sleeps with. */
static inline void hvdl_doorbell_block(sigset_t *sleep_mask) {
    sigset_t bell;
    sigemptyset(&bell);
    sigaddset(&bell, HVDL_DOORBELL_SIG);
    pthread_sigmask(SIG_BLOCK, &bell, sleep_mask);
    sigdelset(sleep_mask, HVDL_DOORBELL_SIG);
}

static inline int hvdl_gettid(void) { return (int)syscall(SYS_gettid); }

/* Ring thread tid of process pid (both must match: a reused pid alone is not rung). */
static inline void hvdl_doorbell_ring(int pid, int tid) {
    if (pid > 0 && tid > 0) syscall(SYS_tgkill, pid, tid, HVDL_DOORBELL_SIG);
}

/* poll(), or ppoll() with sleep_mask when it is given. */
static inline int hvdl_poll_masked(struct pollfd *pf, nfds_t n, int timeout_ms,
                                   const sigset_t *sleep_mask) {
    if (!sleep_mask) return poll(pf, n, timeout_ms);
    struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
    /* the system call, not glibc's ppoll(), which would need _GNU_SOURCE everywhere */
    return (int)syscall(SYS_ppoll, pf, n, timeout_ms < 0 ? NULL : &ts, sleep_mask,
                        (size_t)(_NSIG / 8));
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
#error "horovodlike's engine needs Linux (futex, eventfd, getrandom): port engine/util/platform.h"
#endif

#endif
