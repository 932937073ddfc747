/* Heartbeats on the control star (liveness.c); every wait calls hvdl__liveness_check. */
#ifndef HVDL_LIVENESS_H
#define HVDL_LIVENESS_H
#include "engine.h"

/* liveness.c: heartbeats on the control star; a silent peer is named and the job ends */
void hvdl__liveness_start(engine_t *e);
int hvdl__liveness_tick(engine_t *e);               /* -1 once the engine has failed */
int hvdl__liveness_ms(const engine_t *e);            /* until the next tick is due */
double hvdl__heartbeat_interval(const engine_t *e);
/* Seconds this rank itself did not run, when its peers may have given it up (else 0). */
double hvdl__liveness_own_gap(const engine_t *e, double now);
/* Every wait calls this with the time it has at hand: one comparison when nothing is due. */
static inline int hvdl__liveness_check(engine_t *e, double now) {
    return now >= e->next_tick ? hvdl__liveness_tick(e) : 0;
}

#endif
