#include "log.h"
#include <stdarg.h>
#include <stdio.h>

/* Process-wide on purpose: logging is the one thing every engine in a process shares. */
static int g_level = HVDL_LOG_WARNING;
static int g_rank = -1;
static const char *NAMES[] = {"TRACE", "DEBUG", "INFO", "WARNING", "ERROR"};

void hvdl__log_set_level(int level) { g_level = level; }
void hvdl__log_set_rank(int rank) { g_rank = rank; }

void hvdl__log(int level, const char *fmt, ...) {
    if (level < g_level) return;
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    /* One write per line so ranks' lines do not interleave mid-line. */
    fprintf(stderr, "[horovodlike rank %d] %s: %s\n", g_rank, NAMES[level > 4 ? 4 : level], line);
    fflush(stderr);
}
