/*
 * horovodlike engine — the public C API.
 *
 * This header is the manual and also the cffi declaration: the text between the
 * CDEF-BEGIN and CDEF-END markers is handed to ffi.cdef() verbatim, so every constant
 * and enum Python uses comes from here, never copied by hand. Keep that part to plain
 * declarations cffi understands (no #if, no macro expressions).
 *
 * Life of an op: hvdl_enqueue() checks the request locally and queues it; the engine's
 * background thread negotiates with the other ranks, fuses, moves the data and marks the
 * handle done; hvdl_wait()/hvdl_poll() observe it; hvdl_release() returns the status,
 * the error message and (for ops whose output size is only known after negotiation,
 * such as allgather) the output buffer, which the caller frees with hvdl_free().
 * hvdl_run() does the three in one call, for a caller that blocks on the op.
 *
 * Threading: hvdl_enqueue, hvdl_poll, hvdl_wait, hvdl_release, hvdl_run and the
 * process-set calls may be called from any thread, concurrently; the engine's own
 * background thread does the I/O, except that on one node a caller waiting in
 * hvdl_wait() (or hvdl_run()) does the engine's work itself while that thread sleeps
 * (HVDL_CALLER_WAITS). hvdl_prepare, hvdl_start and hvdl_shutdown are serialized with
 * each other, but no other call may be in flight across hvdl_shutdown and the next
 * hvdl_prepare (which frees the old engine). hvdl_last_error() is per thread. Waits spin
 * briefly, then block, and are meant to be called without the caller's interpreter lock
 * held.
 */
#ifndef HOROVODLIKE_H
#define HOROVODLIKE_H
#include <stddef.h>
#include <stdint.h>

/* CDEF-BEGIN */
#define HVDL_MAX_DIMS 8
#define HVDL_BLOB_BYTES 320
#define HVDL_MSG_BYTES 1024
#define HVDL_KEY_MAX 64
/* The longest request name, in bytes (without its NUL): enqueue refuses a longer one,
 * and no frame carries one. */
#define HVDL_MAX_NAME 4096

/* Status codes: one table for the whole engine (names in hvdl_status_name()). */
enum hvdl_status {
    HVDL_OK = 0,
    HVDL_ERR_INVALID = 1,          /* a bad argument, caught before anything was queued */
    HVDL_ERR_DUPLICATE_NAME = 2,   /* a request with this name is already in flight */
    HVDL_ERR_MISMATCH = 3,         /* ranks disagree on an op's dtype/shape/op/root/... */
    HVDL_ERR_PEER_LOST = 4,        /* a rank died or its connection broke */
    HVDL_ERR_NOT_INITIALIZED = 5,
    HVDL_ERR_SHUT_DOWN = 6,
    HVDL_ERR_SYSTEM = 7,           /* an operating-system call failed (message has errno) */
    HVDL_ERR_TIMEOUT = 8,          /* hvdl_wait's deadline passed; the op goes on */
    HVDL_ERR_NOT_IMPLEMENTED = 9,
    HVDL_ERR_STALLED = 10,         /* HOROVOD_STALL_SHUTDOWN_TIME_SECONDS passed */
    HVDL_NUM_STATUSES = 11
};

enum hvdl_dtype {
    HVDL_UINT8 = 0,
    HVDL_INT8 = 1,
    HVDL_INT16 = 2,
    HVDL_INT32 = 3,
    HVDL_INT64 = 4,
    HVDL_FLOAT16 = 5,
    HVDL_BFLOAT16 = 6,
    HVDL_FLOAT32 = 7,
    HVDL_FLOAT64 = 8,
    HVDL_BOOL = 9,
    HVDL_NUM_DTYPES = 10
};

enum hvdl_reduce_op {
    HVDL_SUM = 0,
    HVDL_AVERAGE = 1,
    HVDL_MIN = 2,
    HVDL_MAX = 3,
    HVDL_PRODUCT = 4,
    HVDL_ADASUM = 5,
    HVDL_NUM_REDUCE_OPS = 6
};

enum hvdl_op_type {
    HVDL_OP_ALLREDUCE = 0,
    HVDL_OP_ALLGATHER = 1,
    HVDL_OP_BROADCAST = 2,
    HVDL_OP_BARRIER = 3,
    HVDL_OP_ALLTOALL = 4,
    HVDL_OP_REDUCESCATTER = 5,
    HVDL_OP_JOIN = 6,
    /* Point-to-point (p2p.c): root_rank is the peer (a global rank): the destination of
     * a send, the source of a recv. Matched by (source, destination, name) alone; no
     * other rank takes part. A send reads input (dtype, ndim, shape); a recv allocates
     * its result (dtype and shape come with the message), or with HVDL_RECV_INTO writes
     * output, whose dtype, ndim and shape must then match the message's size. */
    HVDL_OP_SEND = 7,
    HVDL_OP_RECV = 8
};

/* One collective request. The engine copies the struct and the name; the buffers are
 * borrowed and must stay alive (and unmodified) until the handle is released. */
typedef struct hvdl_request {
    int op;                  /* enum hvdl_op_type */
    int dtype;               /* enum hvdl_dtype */
    int reduce_op;           /* enum hvdl_reduce_op (allreduce only) */
    int root_rank;           /* broadcast only */
    int process_set;         /* 0 = all ranks */
    int ndim;                /* 0..HVDL_MAX_DIMS; 0 is a scalar */
    int64_t shape[8];        /* HVDL_MAX_DIMS entries, the first ndim used */
    double prescale;         /* allreduce: multiply inputs by this before reducing */
    double postscale;        /* allreduce: multiply the result by this */
    const void *input;       /* the caller's contiguous data (NULL only if empty) */
    void *output;            /* allreduce/broadcast: result buffer (may equal input);
                                reducescatter: this rank's rows of the result;
                                allgather: NULL, the engine allocates the result, or a
                                buffer of n times the input's bytes (n = the set's size),
                                written when the result fits (result.data is then NULL);
                                alltoall: NULL, the engine allocates the result */
    const int64_t *splits;   /* alltoall: rows for each member of the process set, in
                                set order (NULL: even split); copied at enqueue */
    const char *name;        /* unique among in-flight requests; required, at most
                                HVDL_MAX_NAME bytes */
    int64_t name_len;        /* bytes of name when known (0: up to its NUL); a name with
                                a NUL byte inside is refused */
    int flags;               /* enum hvdl_request_flags, or 0 */
} hvdl_request;

enum hvdl_request_flags {
    /* The caller calls hvdl_wait() on this op at once: on one node, the waiting caller
     * then starts it itself rather than the engine's thread (an op flagged so and never
     * waited for may not start until another op is enqueued or waited for). */
    HVDL_CALLER_WAITS = 1,
    /* A recv into the caller's output buffer (recv_), described by dtype/ndim/shape. */
    HVDL_RECV_INTO = 2,
    /* A broadcast from rank 0 on the global set of at least HVDL_TUNE_VALUES float64 (enum
     * hvdl_tune_value, then the caller's own; a negative value keeps the knob as it is):
     * once it has run, its first values are this rank's knobs. Every rank executes ops in one order, so every rank
     * changes them between the same two ops, and an algorithm choice stays agreed. The
     * autotuner (horovodlike/common/autotune.py) is its user. */
    HVDL_TUNE = 4
};

enum hvdl_tune_value {
    HVDL_TUNE_FUSION_BYTES = 0,  /* HOROVOD_FUSION_THRESHOLD */
    HVDL_TUNE_CYCLE_MS = 1,      /* HOROVOD_CYCLE_TIME */
    HVDL_TUNE_ALLREDUCE = 2, /* HOROVODLIKE_ALLREDUCE_ALGORITHM: 0 auto, 2 ring, 3 rd, 4 hier */
    HVDL_TUNE_ALLGATHER = 3, /* HOROVODLIKE_ALLGATHER_ALGORITHM: 0 auto, 2 ring, 4 hier */
    HVDL_TUNE_VALUES = 4
};

/* What a finished op produced (filled by hvdl_release). */
typedef struct hvdl_result {
    void *data; /* allgather/alltoall: engine-allocated output, hvdl_free it
                                (NULL when the allgather wrote the caller's output) */
    int64_t nbytes; /* bytes at data */
    int64_t first_dim; /* allgather/alltoall: the first dimension of the output */
    int64_t *recv_splits; /* alltoall: rows received from each member; hvdl_free it */
    int nsplits;
    int64_t value; /* join: the last rank to join */
    int dtype; /* recv: the message's dtype, ndim and shape, and its sender */
    int ndim;
    int64_t shape[8];
    int peer;
} hvdl_result;

/* Start-up in two steps so that the caller can exchange the address blobs however it
 * likes (MPI, the launcher's store, nothing at size 1):
 *   hvdl_prepare: read the configuration from the environment, open the listening
 *                 socket on bind_addr (NULL or "" = every interface; "127.0.0.1" for a
 *                 single-host job), and write this rank's blob (HVDL_BLOB_BYTES) to
 *                 blob_out. key (key_len bytes, at most HVDL_KEY_MAX) is the job's secret:
 *                 every connection between ranks proves it knows the key before anything
 *                 else is read; the key itself never crosses the wire.
 *   hvdl_start:   given every rank's blob, in rank order, concatenated, connect to the
 *                 peers and start the background thread. */
int hvdl_prepare(const char *hostname, const char *advertise_addr, const char *bind_addr,
                 const unsigned char *key, int key_len, char *blob_out);
int hvdl_start(int rank, int size, const char *all_blobs);

/* Ends this rank's part in the job (control/shutdown.c): its requests not yet sent are
 * announced and it submits nothing more; an op of another rank that needs it and that it
 * never submitted then fails at once, naming it, and every other op goes on. Returns
 * once every rank has shut down (rank 0 then tells every rank to stop; an op not
 * finished by then completes with HVDL_ERR_SHUT_DOWN) and this rank's background thread
 * has exited, or once a silent rank has been named lost (HOROVODLIKE_PEER_TIMEOUT_SECONDS);
 * after a failure it returns at once. Safe to call twice. The engine stops either way; the status is
 * HVDL_ERR_PEER_LOST or HVDL_ERR_STALLED (hvdl_last_error() says which rank) when the job
 * failed, a worker that never finished shutting down included, else HVDL_OK. */
int hvdl_shutdown(void);
int hvdl_is_running(void);

/* Queue a request; on success *handle is set. On failure nothing was queued and
 * hvdl_last_error() says why. */
int hvdl_enqueue(const hvdl_request *req, int64_t *handle);

/* 1 if done, 0 if not, negative if the handle is unknown. */
int hvdl_poll(int64_t handle);
/* Block until done or timeout_s passes (HVDL_ERR_TIMEOUT); timeout_s < 0 waits forever. */
int hvdl_wait(int64_t handle, double timeout_s);
/* The calling thread waits for handle until it is done, in hvdl_wait slices (so that it
 * can handle signals between them), and submits nothing meanwhile: deadlock detection
 * counts it blocked between the slices too. 0, or any other call of this thread into
 * the engine, ends it. A thread asleep in hvdl_wait with a timeout it did not declare so
 * may go on when it passes, and never counts as blocked. */
void hvdl_waits_until_done(int64_t handle);
/* Free a finished handle: returns the op's status, copies its message (if any) into
 * msg (HVDL_MSG_BYTES), and fills *result. Releasing an unfinished handle is refused. */
int hvdl_release(int64_t handle, char *msg, hvdl_result *result);
/* hvdl_enqueue, hvdl_wait and hvdl_release in one call, for a caller that blocks on the
 * op (HVDL_CALLER_WAITS is set for it): req is read with input and output in place of
 * its own buffers, and is not modified, so a request filled in once serves every call.
 * Returns the op's status with msg and *result filled as hvdl_release fills them
 * (result may be NULL: what the engine allocated is freed), and *handle = 0. If the op
 * is not done after timeout_s, returns HVDL_ERR_TIMEOUT with its handle in *handle: the
 * op goes on, and the caller waits for it and releases it as any other. A request refused
 * at once returns its status, *handle = 0 and the reason in msg (*result zeroed, in
 * both cases). */
int hvdl_run(const hvdl_request *req, const void *input, void *output, double timeout_s,
             int64_t *handle, char *msg, hvdl_result *result);

/* Process sets: ids are chosen by the caller, identically on every rank (the Python
 * layer agrees on them with a collective first). Set 0 is all ranks and always exists.
 * Ranks are global ranks, sorted, unique. */
int hvdl_process_set_add(int id, const int *ranks, int n);
int hvdl_process_set_remove(int id);

/* Tracing: every rank writes <stem>.rank<r><ext> next to path (HOROVOD_TIMELINE does the
 * same at start-up). Starting again with a new path closes the previous file. */
int hvdl_timeline_start(const char *path, int mark_cycles);
int hvdl_timeline_stop(void);

/* The message of the last failed call made on this thread. */
const char *hvdl_last_error(void);
/* The names of a status, an op kind (enum hvdl_op_type: "allreduce", "send") and a dtype
 * ("float32"), as every message of the engine spells them (core/names.c); "UNKNOWN" or
 * "?" for a value out of range. */
const char *hvdl_status_name(int status);
const char *hvdl_op_name(int op);
const char *hvdl_dtype_name(int dtype);
/* Failure injection for tests (HOROVODLIKE_TEST_INJECT=site[:rank[:nth]]): the name of
 * site i, from 1 while i is below the number of sites, then NULL. */
const char *hvdl_inject_site(int i);
int hvdl_dtype_size(int dtype);
void hvdl_free(void *p);
/* HMAC-SHA256 of msg under key into out (32 bytes), as the connection handshake computes
 * it; exposed so that tests can check it against RFC 4231. */
int hvdl_hmac_sha256(const unsigned char *key, int key_len, const unsigned char *msg, int64_t len,
                     unsigned char *out);
/* CDEF-END */

#endif
