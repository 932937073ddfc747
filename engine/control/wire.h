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

/* wire.c: a rank's wait report, MSG_WAITS (laid out in frames.h): its unfinished ops as of
 * a moment, for rank 0's deadlock check (deadlock.c). */
#define HVDL_WAITS_MAX 4096       /* ops one report carries (more: partial) */
typedef struct wait_entry {
    char *name;
    int32_t op, set, peer;   /* peer: a send's or recv's other rank; -1 for a collective */
    uint8_t waited;          /* a blocked thread of the rank waits on it */
} wait_entry_t;
typedef struct wait_report {
    int have;                /* a report has arrived (rank 0) */
    int partial;             /* too many ops to list: this rank never counts as blocked */
    uint64_t posts;          /* ops its threads have posted (deadlock.c: "nothing since") */
    double blocked_for;      /* < 0: not blocked */
    int n;
    wait_entry_t *ops;
} wait_report_t;
int hvdl__put_waits(buf_t *b, const wait_report_t *w);
/* Checks every field against e's job, the report coming from rank `from` (e may be NULL in
 * tests: then any peer but `from` below 1 << 20 is taken). */
int hvdl__read_waits(engine_t *e, reader_t *r, int from, wait_report_t *out);
void hvdl__waits_clear(wait_report_t *w);
/* A request's name as its user gave it, without what the binding added to the name it
 * negotiates (its kind, and the set's suffix when set is not 0), into out. */
const char *hvdl__user_name(const char *name, int op, int set, char *out, size_t cap);
#endif
