/*
 * The loop (loop.c), what it runs (exec.c), and the context it hands the algorithms
 * (context.c).
 */
#ifndef HVDL_LOOP_H
#define HVDL_LOOP_H
#include "engine.h"

struct response;      /* control/control.h */

/* loop.c */
void hvdl__queue_push(op_queue_t *q, op_t *o);
op_t *hvdl__queue_pop(op_queue_t *q);

/* loop.c: the background thread; owns what is done with each frame */
void *hvdl__loop(void *arg);
/* a waiting caller does the loop's work that needs no waiting, if the loop is not:
 * enter, drive as often as it looks, leave */
void hvdl__drive_enter(engine_t *e);
int hvdl__drive(engine_t *e);                 /* 1: it ran (took the new ops) */
void hvdl__drive_leave(engine_t *e);

/* exec.c: choose the algorithm, move the data, complete the handles */
int hvdl__execute(engine_t *e, struct response *r);
int hvdl__execute_cached(engine_t *e, const int32_t *ids, int n, const double *posted_at);

/* context.c: the algorithms' view of this engine, once start-up has connected the peers
 * and opened the segment */
void hvdl__ctx_fill(engine_t *e);

#endif
