/*
 * The negotiation messages on the wire (wire.c) and the checks on what peers send
 * (wire_check.c).
 */
#ifndef HVDL_WIRE_H
#define HVDL_WIRE_H
#include "control.h"

/* wire.c: pure encode/decode of the negotiation messages (no engine state is changed) */
int hvdl__put_request(buf_t *full, const char *name, const meta_t *m, const int64_t *splits, int n);
int hvdl__write_requests(buf_t *msg, const uint64_t *bits, int nwords, int nfull,
                         const buf_t *full);
int hvdl__read_requests(engine_t *e, reader_t *r, request_list_t *out);
void hvdl__request_list_free(request_list_t *l);
int hvdl__write_response(engine_t *e, buf_t *b, const response_t *r);
int hvdl__read_responses(engine_t *e, reader_t *r, response_t **out, int *count);
int hvdl__response_alloc(response_t *r, int ntensors, int n, int op);
void hvdl__response_free(response_t *r);

/* wire_check.c: what peers send is checked before it is trusted (NULL = fine, else why) */
const char *hvdl__meta_problem(engine_t *e, const meta_t *m);
const char *hvdl__splits_problem(const meta_t *m, const int64_t *splits, uint32_t n, int nmembers);
const char *hvdl__response_problem(engine_t *e, const group_t *g, const response_t *r,
                                   op_t *const *ops);

#include "frames.h"          /* and the small frames: goodbye, clock sync, the nodes' */
#endif
