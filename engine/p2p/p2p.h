/* Point-to-point messages (engine/p2p/; p2p_internal.h lists its files): what the rest of
 * the engine calls. */
#ifndef HVDL_P2P_H
#define HVDL_P2P_H
#include "engine.h"

/* p2p_thread.c: point-to-point messages on their own connections and thread */
int hvdl__p2p_start(engine_t *e);                   /* after the connections, before the loop */
void hvdl__p2p_leave(engine_t *e); /* this rank shuts down: its peers learn it, in order */
void hvdl__p2p_stop(engine_t *e);                   /* after the loop thread has ended */
void hvdl__p2p_free(engine_t *e);
void hvdl__p2p_kick(engine_t *e); /* the job failed: its thread fails the ops it holds */
/* p2p.c */
int hvdl__p2p_enqueue(engine_t *e, const hvdl_request *q, int64_t *handle);
/* p2p_complete.c */
int hvdl__p2p_tend(engine_t *e); /* the loop: a peer p2p found broken; -1 failed */
/* p2p_thread.c */
void hvdl__p2p_close_in_child(engine_t *e); /* a forked child's copies of the fds */
/* p2p_poll.c: a caller waiting on a recv polls the peer's mailbox: begin (1: polling), look,
 * end. */
int hvdl__p2p_poll_begin(engine_t *e, const op_t *o);
int hvdl__p2p_look_us(engine_t *e, const op_t *o); /* more time to look for o, in us */
void hvdl__p2p_poll(engine_t *e, const op_t *o);
void hvdl__p2p_poll_end(engine_t *e, const op_t *o);

#endif
