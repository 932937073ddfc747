/* Failure (fail.c): one owner for every cause. */
#ifndef HVDL_FAIL_H
#define HVDL_FAIL_H
#include "engine.h"

/* fail.c: failure is sticky and names its cause. hvdl__fail records a cause on this
 * rank; hvdl__fail_job also tells every other rank (through rank 0), so that the whole
 * job reports the one true cause. Both return -1, so a failing site can return them. */
int hvdl__fail(engine_t *e, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int hvdl__fail_job(engine_t *e, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int hvdl__oom(engine_t *e, const char *what, int64_t bytes); /* fail_job: out of memory for what */
void hvdl__peer_lost(engine_t *e, int peer, const char *why);
int hvdl__abort_received(engine_t *e, int from, const void *msg, int64_t n); /* -1 */
/* Only records the cause (1 if it is the first): for a loss found once nothing is left
 * to complete or tell, as when a worker never finishes shutting down. */
int hvdl__record_failure(engine_t *e, int status, const char *msg);
int hvdl__malformed(engine_t *e, int from, const char *what, const char *why); /* -1 */
void hvdl__complete(engine_t *e, op_t *o, int status, const char *msg);
void hvdl__complete_all_locked(engine_t *e, int status, const char *msg);

#endif
