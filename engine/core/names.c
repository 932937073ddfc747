/*
 * The names of the public enums (horovodlike.h), one table each: statuses, op kinds and
 * dtypes. Every message, trace and log line that names one of them reads it here. The
 * tables are indexed by their enums (designated) and sized by them, checked at compile
 * time; a value out of range, or skipped in the middle, reads as "?" ("UNKNOWN" for a
 * status).
 */
#include "engine.h"
#include <ctype.h>

enum { NUM_OPS = HVDL_OP_RECV + 1 };

static const char *const STATUS_NAMES[] = {
    [HVDL_OK] = "OK",
    [HVDL_ERR_INVALID] = "INVALID_ARGUMENT",
    [HVDL_ERR_DUPLICATE_NAME] = "DUPLICATE_NAME",
    [HVDL_ERR_MISMATCH] = "MISMATCH",
    [HVDL_ERR_PEER_LOST] = "PEER_LOST",
    [HVDL_ERR_NOT_INITIALIZED] = "NOT_INITIALIZED",
    [HVDL_ERR_SHUT_DOWN] = "SHUT_DOWN",
    [HVDL_ERR_SYSTEM] = "SYSTEM_ERROR",
    [HVDL_ERR_TIMEOUT] = "TIMEOUT",
    [HVDL_ERR_NOT_IMPLEMENTED] = "NOT_IMPLEMENTED",
    [HVDL_ERR_STALLED] = "STALLED",
};
_Static_assert(sizeof STATUS_NAMES / sizeof STATUS_NAMES[0] == HVDL_NUM_STATUSES,
               "a status without a name");

/* As the user calls them; the collectives are those before HVDL_OP_SEND. */
static const char *const OP_NAMES[] = {
    [HVDL_OP_ALLREDUCE] = "allreduce", [HVDL_OP_ALLGATHER] = "allgather",
    [HVDL_OP_BROADCAST] = "broadcast", [HVDL_OP_BARRIER] = "barrier",
    [HVDL_OP_ALLTOALL] = "alltoall",   [HVDL_OP_REDUCESCATTER] = "reducescatter",
    [HVDL_OP_JOIN] = "join",           [HVDL_OP_SEND] = "send",
    [HVDL_OP_RECV] = "recv",
};
_Static_assert(sizeof OP_NAMES / sizeof OP_NAMES[0] == NUM_OPS, "an op without a name");

static const char *const DTYPE_NAMES[] = {
    [HVDL_UINT8] = "uint8",       [HVDL_INT8] = "int8",       [HVDL_INT16] = "int16",
    [HVDL_INT32] = "int32",       [HVDL_INT64] = "int64",     [HVDL_FLOAT16] = "float16",
    [HVDL_BFLOAT16] = "bfloat16", [HVDL_FLOAT32] = "float32", [HVDL_FLOAT64] = "float64",
    [HVDL_BOOL] = "bool",
};
_Static_assert(sizeof DTYPE_NAMES / sizeof DTYPE_NAMES[0] == HVDL_NUM_DTYPES,
               "a dtype without a name");

const char *hvdl_status_name(int s) {
    return s >= 0 && s < HVDL_NUM_STATUSES && STATUS_NAMES[s] ? STATUS_NAMES[s] : "UNKNOWN";
}

const char *hvdl_op_name(int op) {
    return op >= 0 && op < NUM_OPS && OP_NAMES[op] ? OP_NAMES[op] : "?";
}

const char *hvdl_dtype_name(int dtype) {
    return dtype >= 0 && dtype < HVDL_NUM_DTYPES && DTYPE_NAMES[dtype] ? DTYPE_NAMES[dtype] : "?";
}

/* The timeline names an op's span as Horovod's does, in capitals ("ALLREDUCE"): made from
 * OP_NAMES once, so that the two spellings cannot drift apart. */
static char TRACE_NAMES[NUM_OPS][16];
static pthread_once_t trace_names_once = PTHREAD_ONCE_INIT;

static void make_trace_names(void) {
    for (int op = 0; op < NUM_OPS; op++)
        for (size_t i = 0; OP_NAMES[op][i] && i + 1 < sizeof TRACE_NAMES[op]; i++)
            TRACE_NAMES[op][i] = (char)toupper((unsigned char)OP_NAMES[op][i]);
}

const char *hvdl__op_trace_name(int op) {
    pthread_once(&trace_names_once, make_trace_names);
    return op >= 0 && op < NUM_OPS ? TRACE_NAMES[op] : "?";
}
