/* Leveled logging to stderr, prefixed with the rank, as Horovod's HOROVOD_LOG_LEVEL. */
#ifndef HVDL_LOG_H
#define HVDL_LOG_H
enum {
    HVDL_LOG_TRACE,
    HVDL_LOG_DEBUG,
    HVDL_LOG_INFO,
    HVDL_LOG_WARNING,
    HVDL_LOG_ERROR,
    HVDL_LOG_COUNT
};
struct engine;
void hvdl__log_set_level(int level);
/* A line of engine e, prefixed with e's rank: several engines in one process (tests/c)
 * each log as themselves. NULL: no engine has a rank yet (settings being read), -1. */
void hvdl__log(const struct engine *e, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#endif
