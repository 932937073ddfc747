/*
 * Tracing: every rank writes its own Chrome Trace Event file, through a writer thread so
 * the engine never blocks on I/O. With tracing off each call site costs one branch
 * (TL_ON). Lanes (tid) are phase families, so a person reads them; pid is the rank.
 */
#ifndef HVDL_TIMELINE_H
#define HVDL_TIMELINE_H
#include <stdatomic.h>

struct engine;
struct buf;

enum {
    TL_NEGOTIATE = 1,
    TL_QUEUE = 2,
    TL_MEMCPY = 3,
    TL_COLLECTIVE = 4,
    TL_ALGORITHM = 5,
    TL_CYCLES = 6,
    TL_P2P = 7,
    TL_LANES
};

#define TL_ON(e) atomic_load_explicit(&(e)->tl_on, memory_order_relaxed)

int hvdl__timeline_open(struct engine *e, const char *path, int mark_cycles);
void hvdl__timeline_close(struct engine *e);
/* args: the inside of a JSON object (`"k": v, ...`) or NULL. Times are hvdl_now(). */
void hvdl__tl_span(struct engine *e, int lane, const char *name, double t0, double t1,
                   const char *args);
void hvdl__tl_instant(struct engine *e, int lane, const char *name, double t, const char *args);
void hvdl__tl_count_step(struct engine *e, const char *name);   /* a name was submitted */
int hvdl__tl_mark_cycles(struct engine *e);
/* Append a JSON string literal (quoted, escaped) to b. */
void hvdl__json_str(struct buf *b, const char *s);
#endif
