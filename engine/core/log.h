/* Leveled logging to stderr, prefixed with the rank, as Horovod's HOROVOD_LOG_LEVEL. */
#ifndef HVDL_LOG_H
#define HVDL_LOG_H
enum { HVDL_LOG_TRACE, HVDL_LOG_DEBUG, HVDL_LOG_INFO, HVDL_LOG_WARNING, HVDL_LOG_ERROR };
void hvdl__log_set_level(int level);
void hvdl__log_set_rank(int rank);
void hvdl__log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#endif
