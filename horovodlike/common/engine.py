"""The only module that touches cffi: thin, typed wrappers over engine/include/horovodlike.h.

Every call goes through `_check`, which turns an engine status into one exception
family. cffi releases the GIL for the duration of each C call, so waiting here never
blocks other Python threads.
"""
import functools
import threading

from horovodlike._engine import ffi, lib

from .exceptions import HorovodInternalError, TensorMismatchError

MAX_DIMS = lib.HVDL_MAX_DIMS
BLOB_BYTES = lib.HVDL_BLOB_BYTES

# Op codes, reduce ops and dtypes straight from the C header.
ALLREDUCE, ALLGATHER, BROADCAST, BARRIER = (lib.HVDL_OP_ALLREDUCE, lib.HVDL_OP_ALLGATHER,
                                            lib.HVDL_OP_BROADCAST, lib.HVDL_OP_BARRIER)
ALLTOALL, REDUCESCATTER, JOIN = lib.HVDL_OP_ALLTOALL, lib.HVDL_OP_REDUCESCATTER, lib.HVDL_OP_JOIN
SEND, RECV = lib.HVDL_OP_SEND, lib.HVDL_OP_RECV
SUM, AVERAGE, MIN, MAX, PRODUCT, ADASUM = (lib.HVDL_SUM, lib.HVDL_AVERAGE, lib.HVDL_MIN,
                                           lib.HVDL_MAX, lib.HVDL_PRODUCT, lib.HVDL_ADASUM)
DTYPES = {
    "uint8": lib.HVDL_UINT8, "int8": lib.HVDL_INT8, "int16": lib.HVDL_INT16,
    "int32": lib.HVDL_INT32, "int64": lib.HVDL_INT64, "float16": lib.HVDL_FLOAT16,
    "bfloat16": lib.HVDL_BFLOAT16, "float32": lib.HVDL_FLOAT32, "float64": lib.HVDL_FLOAT64,
    "bool": lib.HVDL_BOOL,
}
DTYPE_NAMES = {code: name for name, code in DTYPES.items()}

_NOT_INIT = "Horovod has not been initialized; use hvd.init()."

# Called with the message when an op reports that the job cannot go on (a lost peer, a
# stall shutdown); the layer that knows the launcher decides what that means (basics).
on_job_failure = []


def _job_failure(status, message):
    if status in (lib.HVDL_ERR_PEER_LOST, lib.HVDL_ERR_STALLED):
        for fn in on_job_failure:
            fn(message)


def _error(status, message):
    if not message:
        # The engine's funnels give every error a message; this guards the one place
        # that turns them into exceptions, so that none is ever raised with no text.
        message = (f"horovodlike engine error {ffi.string(lib.hvdl_status_name(status)).decode()} "
                   "without a message (a bug in horovodlike)")
    _job_failure(status, message)
    if status in (lib.HVDL_ERR_INVALID, lib.HVDL_ERR_DUPLICATE_NAME):
        return ValueError(message)
    if status == lib.HVDL_ERR_NOT_INITIALIZED:
        return ValueError(_NOT_INIT)
    if status == lib.HVDL_ERR_MISMATCH:
        return TensorMismatchError(message)
    if status == lib.HVDL_ERR_NOT_IMPLEMENTED:
        return NotImplementedError(message)
    if status == lib.HVDL_ERR_TIMEOUT:
        return TimeoutError(message)
    return HorovodInternalError(message)


def _check(rc):
    if rc != lib.HVDL_OK:
        raise _error(rc, ffi.string(lib.hvdl_last_error()).decode(errors="replace"))


def prepare(hostname: str, advertise_addr: str, bind_addr: str = "", key: bytes = b"") -> bytes:
    """Open this rank's listening socket on bind_addr ("" = every interface); returns its
    address blob. key is the job's secret, which every peer connection must prove."""
    blob = ffi.new("char[]", BLOB_BYTES)
    _check(lib.hvdl_prepare(hostname.encode(), advertise_addr.encode(), bind_addr.encode(),
                            key, len(key), blob))
    return bytes(ffi.buffer(blob, BLOB_BYTES))


def start(rank: int, size: int, blobs: list) -> None:
    _check(lib.hvdl_start(rank, size, b"".join(blobs)))


def shutdown() -> None:
    """Stop the engine; never raises. A job that failed (a rank lost, even one that did
    not finish shutting down) is told to on_job_failure."""
    rc = lib.hvdl_shutdown()
    if rc != lib.HVDL_OK:
        _job_failure(rc, ffi.string(lib.hvdl_last_error()).decode(errors="replace"))


def is_running() -> bool:
    return bool(lib.hvdl_is_running())


def address(array) -> int:
    """The address of a contiguous array's data, from cffi: numpy's .ctypes.data costs
    more, as it builds a ctypes helper object on every access (measured:
    docs/benchmarks.md, "Barriers from the segment, reductions sized to the cache")."""
    return int(ffi.cast("uintptr_t", ffi.from_buffer(array)))


# A contiguous array's data as a cffi pointer, for Prepared.enqueue (address() without
# the round trip through an integer).
data_pointer = ffi.from_buffer
# An integer address (torch's data_ptr()) as a cffi pointer, and the null one.
pointer = functools.partial(ffi.cast, "void *")
NULL = ffi.NULL


class _Scratch(threading.local):
    """Each thread's request, handle, message and result structs, made once: the engine
    copies what it keeps at enqueue and fills all it returns at release, so reusing them
    saves four allocations (one zeroing 1 KiB) on every op."""

    def __init__(self):
        self.req = ffi.new("hvdl_request *")
        self.handle = ffi.new("int64_t *")
        self.msg = ffi.new("char[]", lib.HVDL_MSG_BYTES)
        self.res = ffi.new("hvdl_result *")


_scratch = _Scratch()


def _check_request(name, shape):
    """The checks enqueue makes before the engine sees a request (shared by Prepared)."""
    if "\0" in name:
        raise ValueError(f"tensor name {name!r} contains a NUL character")
    if len(shape) > MAX_DIMS:
        raise ValueError(f"'{name}': {len(shape)} dimensions; at most {MAX_DIMS} are supported")


def _fill(req, op, name, dtype, shape, reduce_op, root_rank, prescale, postscale,
          process_set, splits, flags):
    """Fill every field of req but the buffers; returns the cffi objects req points into
    (they must stay alive as long as req is used)."""
    req.op, req.dtype, req.reduce_op = op, dtype, reduce_op
    req.root_rank, req.process_set, req.ndim = root_rank, process_set, len(shape)
    for i, d in enumerate(shape):
        req.shape[i] = d
    req.prescale, req.postscale = prescale, postscale
    req.flags = flags
    encoded = name.encode()
    c_name = ffi.new("char[]", encoded)
    req.name, req.name_len = c_name, len(encoded)
    c_splits = ffi.NULL if splits is None else ffi.new("int64_t[]", [int(v) for v in splits])
    req.splits = c_splits
    return c_name, c_splits


def enqueue(op, name, dtype=0, shape=(), input_ptr=0, output_ptr=0, reduce_op=SUM,
            root_rank=0, prescale=1.0, postscale=1.0, process_set=0, splits=None,
            caller_waits=False, recv_into=False, tune=False) -> int:
    """Queue one request; pointers are integer addresses of contiguous buffers that the
    caller keeps alive until the handle is released. caller_waits: this thread waits for
    it at once (the engine then lets the waiting thread start it). recv_into: a recv
    writes output_ptr, described by dtype and shape (recv_). tune: a broadcast whose
    values become the engine's knobs as it runs (HVDL_TUNE, the autotuner's)."""
    _check_request(name, shape)
    req = _scratch.req
    flags = (lib.HVDL_CALLER_WAITS if caller_waits else 0) | \
        (lib.HVDL_RECV_INTO if recv_into else 0) | (lib.HVDL_TUNE if tune else 0)
    keep = _fill(req, op, name, dtype, shape, reduce_op, root_rank, prescale, postscale,
                 process_set, splits, flags)
    req.input = ffi.cast("void *", input_ptr)
    req.output = ffi.cast("void *", output_ptr)
    handle = _scratch.handle
    _check(lib.hvdl_enqueue(req, handle))      # every field above is set on every call
    del keep                                   # the engine has copied what it keeps
    return handle[0]


class Prepared:
    """A request filled in once, for a call that repeats (the cached fast path of
    request.py): each enqueue sets only the two buffers and the caller-waits flag, and
    run() hands them to hvdl_run, which copies the request, so it sets nothing.

    The cost model: enqueue() fills some twenty cffi fields, encodes the name and
    allocates a C copy of it on every op, about 3 us of a 4 KiB op's 10-15 us; a
    Prepared enqueue sets three fields. One Prepared belongs to one thread (the cache
    that holds it is per thread): two threads setting its buffers at once would race.
    The engine copies the request at hvdl_enqueue, so reusing it is safe."""
    __slots__ = ("req", "_keep", "_handle", "_flags", "_msg", "_res")

    def __init__(self, op, name, dtype=0, shape=(), reduce_op=SUM, root_rank=0,
                 prescale=1.0, postscale=1.0, process_set=0, recv_into=False):
        _check_request(name, shape)
        self.req = ffi.new("hvdl_request *")
        self._flags = lib.HVDL_RECV_INTO if recv_into else 0
        self._keep = _fill(self.req, op, name, dtype, shape, reduce_op, root_rank, prescale,
                           postscale, process_set, None, self._flags)
        self._handle = ffi.new("int64_t *")
        self._msg, self._res = _scratch.msg, _scratch.res     # this thread's

    def enqueue(self, input_ptr, output_ptr, caller_waits) -> int:
        """Queue it on buffers given as cffi pointers or integer addresses."""
        req = self.req
        req.input = ffi.cast("void *", input_ptr)
        req.output = ffi.cast("void *", output_ptr)
        req.flags = self._flags | (lib.HVDL_CALLER_WAITS if caller_waits else 0)
        self._handle[0] = 0        # in_flight() must never see the last call's handle
        _check(lib.hvdl_enqueue(req, self._handle))
        return self._handle[0]

    def run(self, input_ptr, output_ptr) -> int:
        """Enqueue, wait and release in one engine call (hvdl_run), on buffers given as
        cffi pointers (ffi.from_buffer's, or NULL), for an op whose output is the
        caller's buffer. Returns 0 once it is done, raising its error if it failed; or,
        if it is still in flight after half a second (so that Ctrl-C is honoured between
        waits), its engine handle, which the caller waits for and releases."""
        h = self._handle
        h[0] = 0                   # in_flight() must never see the last call's handle
        rc = lib.hvdl_run(self.req, input_ptr, output_ptr, 0.5, h, self._msg, NULL)
        if not rc:                                      # HVDL_OK
            return 0
        if h[0]:
            return h[0]
        raise _release_error(rc, self._msg)

    def run_result(self):
        """run() for an op whose output the engine allocates (a recv): returns its
        Result once done, or an engine handle as run() does."""
        h, res = self._handle, self._res
        h[0] = 0
        rc = lib.hvdl_run(self.req, NULL, NULL, 0.5, h, self._msg, res)
        if h[0]:
            return h[0]
        return _result(rc, self._msg, res)

    def in_flight(self) -> int:
        """The handle the last run() left in flight (0: none); read when an exception
        interrupted the code between that call and its caller's looking at its value."""
        return self._handle[0]


def poll(handle: int) -> bool:
    rc = lib.hvdl_poll(handle)
    if rc < 0:
        raise ValueError(f"unknown or already synchronized handle {handle}")
    return rc == 1


def wait(handle: int, timeout: float) -> bool:
    """Wait up to timeout seconds; True when the op is done."""
    rc = lib.hvdl_wait(handle, timeout)
    if rc == lib.HVDL_ERR_TIMEOUT:
        return False
    _check(rc)
    return True


def wait_done(handle: int):
    """Wait until the op is done, in half-second waits so that Ctrl-C is honoured between
    them (the GIL is released inside). After the first, the thread declares the wait
    (hvdl_waits_until_done): the engine's deadlock check then counts it as blocked in
    it throughout, and as busy once this returns or raises."""
    if wait(handle, 0.5):
        return
    lib.hvdl_waits_until_done(handle)
    try:
        while not wait(handle, 0.5):
            pass
    finally:
        lib.hvdl_waits_until_done(0)


class Result:
    """What a finished op produced. data: engine-allocated output (allgather, alltoall)
    or None; buffer() views it without a copy and keeps it alive."""
    __slots__ = ("data", "nbytes", "first_dim", "recv_splits", "value", "_res")

    def __init__(self, data, nbytes, first_dim, recv_splits, value, res=None):
        self.data, self.nbytes, self.first_dim = data, nbytes, first_dim
        self.recv_splits, self.value = recv_splits, value
        self._res = res

    def message(self):
        """A recv's message: (dtype name, shape, source rank)."""
        dtype, ndim, shape, peer = self._res
        return DTYPE_NAMES[dtype], tuple(shape[:ndim]), peer

    def buffer(self):
        return ffi.buffer(self.data, self.nbytes) if self.data is not None else b""


def _release_error(status, msg):
    text = ffi.string(msg).decode(errors="replace") or \
        ffi.string(lib.hvdl_last_error()).decode(errors="replace")
    return _error(status, text)


def release_done(handle: int) -> None:
    """release() for an op whose output is the caller's own buffer (allreduce): frees
    the handle and raises the op's error, without building a Result (about 1 us)."""
    msg, res = _scratch.msg, _scratch.res
    status = lib.hvdl_release(handle, msg, res)
    if res.data != ffi.NULL:                # not for such an op; never leaked if it were
        lib.hvdl_free(res.data)
    if res.recv_splits != ffi.NULL:
        lib.hvdl_free(res.recv_splits)
    if status != lib.HVDL_OK:
        raise _release_error(status, msg)


def release(handle: int) -> Result:
    """Free a finished handle and return its Result; raises the op's error if it failed."""
    msg, res = _scratch.msg, _scratch.res
    return _result(lib.hvdl_release(handle, msg, res), msg, res)


def _result(status, msg, res) -> Result:
    """The Result hvdl_release (or hvdl_run) left in res; raises the op's error."""
    data = ffi.gc(res.data, lib.hvdl_free) if res.data != ffi.NULL else None
    if status != lib.HVDL_OK:
        raise _release_error(status, msg)
    splits = None
    if res.recv_splits != ffi.NULL:
        splits = [res.recv_splits[i] for i in range(res.nsplits)]
        lib.hvdl_free(res.recv_splits)
    # A recv's message metadata (cheap: read only when the engine filled it in).
    meta = (res.dtype, res.ndim, list(res.shape), res.peer) if res.ndim > 0 or res.peer else \
        (res.dtype, 0, [], res.peer)
    return Result(data, res.nbytes, res.first_dim, splits, res.value, meta)


def process_set_add(set_id: int, ranks) -> None:
    c_ranks = ffi.new("int[]", list(ranks))
    _check(lib.hvdl_process_set_add(set_id, c_ranks, len(ranks)))


def process_set_remove(set_id: int) -> None:
    _check(lib.hvdl_process_set_remove(set_id))



def timeline_start(path: str, mark_cycles: bool) -> None:
    _check(lib.hvdl_timeline_start(path.encode(), int(bool(mark_cycles))))


def timeline_stop() -> None:
    _check(lib.hvdl_timeline_stop())
