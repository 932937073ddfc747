#include "engine.h"
#include <stdarg.h>
#include <stdio.h>

/* The level is process-wide: every engine of a process reads the same HOROVOD_LOG_LEVEL.
 * Relaxed: it only filters lines, and nothing else is read on its strength. The rank is
 * each engine's own (e->rank, set at start before any thread of the engine runs). */
static atomic_int g_level = HVDL_LOG_WARNING;
static const char *const NAMES[] = {
    [HVDL_LOG_TRACE] = "TRACE",     [HVDL_LOG_DEBUG] = "DEBUG", [HVDL_LOG_INFO] = "INFO",
    [HVDL_LOG_WARNING] = "WARNING", [HVDL_LOG_ERROR] = "ERROR",
};
_Static_assert(sizeof NAMES / sizeof NAMES[0] == HVDL_LOG_COUNT, "a log level without a name");

void hvdl__log_set_level(int level) {
    atomic_store_explicit(&g_level, level, memory_order_relaxed);
}

void hvdl__log(const engine_t *e, int level, const char *fmt, ...) {
    if (level < atomic_load_explicit(&g_level, memory_order_relaxed)) return;
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    /* One write per line so ranks' lines do not interleave mid-line. */
    fprintf(stderr, "[horovodlike rank %d] %s: %s\n", e ? e->rank : -1,
            NAMES[level < 0                 ? 0
                  : level >= HVDL_LOG_COUNT ? HVDL_LOG_ERROR
                                            : level],
            line);
    fflush(stderr);
}
