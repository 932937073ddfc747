/*
 * Negotiation in the node's shared-memory segment: one node (negotiate_shm.c) and a
 * node's ranks first on several nodes (negotiate_nodes.c).
 */
#ifndef HVDL_SEGMENT_H
#define HVDL_SEGMENT_H
#include "control.h"

/* negotiate_shm.c: a one-node job agrees on cached requests in the segment */
size_t hvdl__neg_bytes(int nlocal);                 /* its part of the segment */
int hvdl__neg_open(engine_t *e);                    /* after hvdl__shm_open; off unless one node */
void hvdl__neg_free(engine_t *e);
void hvdl__neg_thread_start(engine_t *e);
void hvdl__neg_thread_end(engine_t *e);
/* announce.c: post a request equal to cache entry id: 0 = go through rank 0 (off, or
 * the id is closed), 1 = posted, 2 = this rank completed it (hvdl__neg_complete those) */
int hvdl__neg_post(engine_t *e, int id);
int hvdl__neg_complete(engine_t *e, const int *ids, int n);
/* rank 0: take over an id (its posted bits become requests), and give it back */
int hvdl__neg_close_id(engine_t *e, int id);
int hvdl__neg_close_name(engine_t *e, const char *name);
int hvdl__neg_close_all(engine_t *e);               /* a join: every id */
int hvdl__neg_settle(engine_t *e, const response_t *r);   /* r planned: its ids reopen */
int hvdl__neg_order(engine_t *e, const response_t *r);    /* r's place in the log */
void hvdl__neg_stall_scan(engine_t *e, double now);
/* every rank: responses from rank 0 wait for their place; the log runs in order */
int hvdl__neg_queue(engine_t *e, response_t *r);   /* takes r's contents */
int hvdl__neg_run(engine_t *e);
uint64_t hvdl__neg_position(engine_t *e);           /* entries this rank has executed */
int hvdl__neg_finish_to(engine_t *e, uint64_t pos); /* a worker, told to stop */
int hvdl__neg_sleep_begin(engine_t *e);             /* 1: there is work, do not sleep */
void hvdl__neg_sleep_end(engine_t *e);
int hvdl__neg_has_work(engine_t *e);               /* without e->drive */
void hvdl__neg_watch_begin(engine_t *e);            /* a caller drives (loop.c) */
int hvdl__neg_watch_end(engine_t *e);               /* 1: wake the sleeping loop */
int hvdl__neg_deferred(engine_t *e);

/* negotiate_nodes.c: on several nodes, a node's ranks agree in their segment first */
int hvdl__nodes_open(engine_t *e);                  /* after hvdl__shm_open; off on one node */
void hvdl__nodes_free(engine_t *e);
void hvdl__nodes_thread_end(engine_t *e);
void hvdl__nodes_count(engine_t *e, const response_t *r);   /* a worker applied r */
int hvdl__nodes_post(engine_t *e, int id);           /* as hvdl__neg_post */
int hvdl__nodes_complete(engine_t *e, const int *ids, int n);
int hvdl__nodes_took_request(engine_t *e, int from, pending_t *p, const meta_t *m);   /* rank 0 */
int hvdl__nodes_withdraw(engine_t *e, uint64_t *bits);   /* before a join: this rank's posted ids */
int hvdl__nodes_join(engine_t *e);                   /* rank 0 */
int hvdl__nodes_settle(engine_t *e, const response_t *r, int anyone_joined);   /* rank 0 planned r */
int hvdl__nodes_take_done(engine_t *e, int from, const uint8_t *p, int64_t n);
int hvdl__nodes_take_posted(engine_t *e, int from, const uint8_t *p, int64_t n);
int hvdl__nodes_take_close(engine_t *e, const uint8_t *p, int64_t n);
int hvdl__nodes_take_reopen(engine_t *e, const uint8_t *p, int64_t n);
int hvdl__nodes_leads(engine_t *e);                  /* this rank leads a node's segment */
int hvdl__nodes_scan(engine_t *e, double now);       /* a leader's words stuck partly set */
int hvdl__nodes_before_stall(engine_t *e, pending_t *p);   /* stall.c: 1 = ask again later */

#endif
