/* Setting up this node's shared-memory segment (shm.c). */
#ifndef HVDL_SHM_H
#define HVDL_SHM_H
#include "engine.h"

/* shm.c: setting up this node's segment (its waits are in context.h) */
int hvdl__shm_open(engine_t *e);
uint8_t *hvdl__shm_neg_area(hvdl_shm_t *s);         /* negotiate_shm.c's part */
void hvdl__shm_report(engine_t *e);                 /* the barriers' counters, at debug level */
void hvdl__shm_close(engine_t *e);

#endif
