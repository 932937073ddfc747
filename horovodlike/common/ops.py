"""Collectives on numpy arrays with Horovod's signatures, and the handle machinery the
framework bindings reuse.

Naming, like every rule about a call's arguments, is request.py's: `name=x` becomes
"allreduce.x"; unnamed ops are numbered per op and per process set
("allreduce.noname.3"), so they match across ranks only if every rank makes the same
sequence of calls. Buffers are passed to the engine by address (zero copy) and kept
alive in `_pending` until the engine has released the op: an exception that interrupts
a wait (Ctrl-C, a watchdog's alarm) leaves them there, so the engine never writes into
freed memory and the same handle can be waited on again.

Handles are ours, not the engine's: a process-wide counter, so a handle from before
shutdown() can never name an op after the next init().
"""
import itertools
import threading

import numpy as np

from . import basics, engine, request
from .request import Adasum, Average, Max, Min, Product, Sum  # noqa: F401  (the API's ops)

_pending = {}       # handle -> (engine handle, keep-alive objects, finisher(Result) -> output)
_handles = itertools.count(1)


_codes = {}     # dtype -> engine code; np.dtype(...).name costs microseconds per op


def dtype_code(dtype, what):
    code = _codes.get(dtype)
    if code is not None:
        return code
    code = engine.DTYPES.get(np.dtype(dtype).name) if dtype is not None else None
    if code is not None:
        _codes[dtype] = code
    if code is None:
        raise TypeError(f"{what}: dtype {dtype} is not supported; supported dtypes are "
                        f"{', '.join(engine.DTYPES)}")
    return code


def _as_array(tensor, what):
    if not isinstance(tensor, np.ndarray):
        raise TypeError(f"{what} expects a numpy array, got {type(tensor).__name__}")
    if not tensor.dtype.isnative:
        raise TypeError(f"{what}: the array's byte order ({tensor.dtype.str}) is not this "
                        f"machine's; pass x.astype(x.dtype.newbyteorder('='))")
    if not tensor.flags.c_contiguous:
        raise ValueError(f"{what}: the array is not C-contiguous; pass "
                         f"np.ascontiguousarray(x)")
    return tensor


class _Waiting(threading.local):
    """`with waiting:` around *_async calls whose handles this thread synchronizes at
    once (the blocking collectives): the engine is told so, and on one node the waiting
    thread then starts the op itself instead of waking the engine's thread for it."""
    now = False

    def __enter__(self):
        self.now = True

    def __exit__(self, *exc):
        self.now = False


waiting = _Waiting()


def submit(keep, finish, **request):
    """Enqueue a request; remember what must stay alive and how to finish it."""
    basics._t()
    engine_handle = engine.enqueue(**request, caller_waits=waiting.now)
    handle = next(_handles)
    _pending[handle] = (engine_handle, keep, finish)
    return handle


def submit_prepared(prepared, keep, finish, input_ptr, output_ptr):
    """submit() of a request filled in earlier (request.py's cached fast path)."""
    basics._t()
    engine_handle = prepared.enqueue(input_ptr, output_ptr, waiting.now)
    handle = next(_handles)
    _pending[handle] = (engine_handle, keep, finish)
    return handle


pointer, NULL = engine.pointer, engine.NULL      # run_now's buffers, for the bindings


def _wait(engine_handle):
    # Short waits so Ctrl-C is honoured between them; the GIL is released inside.
    engine.wait_done(engine_handle)


def _park(engine_handle, keep):
    """An op left in flight by an exception: its buffers stay alive in `_pending` (no
    one collects it; the engine finishes it, and shutdown forgets it)."""
    if engine_handle:
        _pending[next(_handles)] = (engine_handle, keep, _none)


def run_now(prepared, keep, input_ptr, output_ptr):
    """A blocking call on a prepared request whose output is the caller's buffer, given
    as cffi pointers: enqueue, wait and release in one engine call (engine.Prepared.run,
    hvdl_run), with no handle in `_pending` and no Result. It is the path of the cached
    blocking allreduce and of the blocking p2p calls, where the engine's part of a small
    message costs less than the Python calls around it. An op still in flight after the
    first half second is waited for in short waits (Ctrl-C is honoured between them) and
    released. One left in flight by an exception (Ctrl-C as the call returns, or during
    its later waits) is parked, as synchronize() leaves it, so that its buffers stay
    alive while the engine may still use them: one `try` spans the call and the waits,
    so no instant between them leaves an op in flight unparked."""
    basics._t()
    try:
        engine_handle = prepared.run(input_ptr, output_ptr)
        if not engine_handle:
            return
        _wait(engine_handle)
    except BaseException:
        _park(prepared.in_flight(), keep)
        raise
    engine.release_done(engine_handle)


def run_now_result(prepared, finish):
    """run_now() for an op whose output the engine allocates (recv): returns
    finish(Result)."""
    basics._t()
    try:
        result = prepared.run_result()
        if type(result) is int:       # still in flight: wait for it as any handle
            _wait(result)
    except BaseException:
        _park(prepared.in_flight(), None)
        raise
    if type(result) is int:
        result = engine.release(result)
    return finish(result)


def _entry(handle):
    try:
        return _pending[handle]
    except (KeyError, TypeError):
        raise ValueError(f"unknown or already synchronized handle {handle}") from None


def poll(handle):
    """True once the op behind handle has finished (it does not wait)."""
    return engine.poll(_entry(handle)[0])


def wait(handle, timeout):
    """Wait up to `timeout` seconds for the op (the GIL is released); True once it has
    finished. The handle stays valid: synchronize() collects it."""
    return engine.wait(_entry(handle)[0], timeout)


def declare_wait(handle):
    """The calling thread waits on `handle` until it is done, or (None) no longer: the
    engine's deadlock check then counts it as blocked in it (engine.wait_done)."""
    engine.lib.hvdl_waits_until_done(_entry(handle)[0] if handle is not None else 0)


def synchronize(handle):
    """Wait for the op, free its handle and return its output (or raise its error).

    If the wait is interrupted, the op goes on and its buffers stay alive; call
    synchronize(handle) again to collect it."""
    engine_handle, _, finish = _entry(handle)
    _wait(engine_handle)
    # Only now has the engine finished with the buffers; release frees the op either way.
    try:
        result = engine.release(engine_handle)
    finally:
        del _pending[handle]
    return finish(result)


def _forget_all():
    """After the engine has stopped: no op can touch a buffer any more."""
    _pending.clear()


basics._on_shutdown.append(_forget_all)


# ---- numpy collectives ----
# Each checks its array, asks request.py for a checked, named request, and allocates
# the output.

def _same_shape(x, req):
    """Submit an op whose output has the input's shape, into a new array."""
    code = dtype_code(x.dtype, req.kind)
    out = np.empty_like(x)
    return submit((x, out), lambda _: out,
                  **req.fields(code, x.shape, engine.address(x), engine.address(out)))


def _gathered(x, res):
    flat = np.frombuffer(res.buffer(), dtype=x.dtype)
    return flat.reshape((res.first_dim,) + x.shape[1:])


def _allreduce_key(tensor, average, name, op, prescale_factor, postscale_factor,
                   process_set):
    """(key, prepared request or None) of the cached fast path (request.allreduce_key):
    the array's dtype (with its byte order) and shape are in the key; C-contiguity is
    checked on every call, as a view of the same shape and dtype may not be. key is
    None when the call cannot be cached."""
    if type(tensor) is not np.ndarray or not tensor.flags.c_contiguous:
        return None, None
    key = request.allreduce_key(name, op, average, prescale_factor, postscale_factor,
                                process_set, (tensor.dtype, tensor.shape))
    return key, (request.cached(key) if key is not None else None)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=None):
    key, prepared = _allreduce_key(tensor, average, name, op, prescale_factor,
                                   postscale_factor, process_set)
    if prepared is not None:
        out = np.empty_like(tensor)
        return submit_prepared(prepared, (tensor, out), lambda _: out,
                               engine.data_pointer(tensor), engine.data_pointer(out))
    seen = request.generation()
    x = _as_array(tensor, "allreduce")
    code = dtype_code(x.dtype, "allreduce")
    req = request.allreduce(name, op, average, prescale_factor, postscale_factor,
                            process_set)
    if key is None:
        return _same_shape(x, req)
    prepared = request.prepare(req, code, x.shape)
    out = np.empty_like(x)
    handle = submit_prepared(prepared, (x, out), lambda _: out, engine.data_pointer(x),
                             engine.data_pointer(out))
    request.remember(key, prepared, seen)
    return handle


def allreduce(tensor, average=None, name=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=None):
    _, prepared = _allreduce_key(tensor, average, name, op, prescale_factor,
                                 postscale_factor, process_set)
    if prepared is not None:
        out = np.empty_like(tensor)
        run_now(prepared, (tensor, out), engine.data_pointer(tensor),
                engine.data_pointer(out))
        return out
    with waiting:
        h = allreduce_async(tensor, average, name, op, prescale_factor, postscale_factor,
                            process_set)
    return synchronize(h)


def allgather_async(tensor, name=None, process_set=None):
    x = _as_array(tensor, "allgather")
    code = dtype_code(x.dtype, "allgather")
    req = request.allgather(name, process_set, x.ndim)
    return submit((x,), lambda res: _gathered(x, res), **req.fields(code, x.shape, engine.address(x)))


def allgather(tensor, name=None, process_set=None):
    with waiting:
        h = allgather_async(tensor, name, process_set)
    return synchronize(h)


def broadcast_async(tensor, root_rank, name=None, process_set=None):
    """root_rank is a global rank, also with a process set (as in Horovod)."""
    x = _as_array(tensor, "broadcast")
    dtype_code(x.dtype, "broadcast")
    return _same_shape(x, request.broadcast(root_rank, name, process_set))


def broadcast(tensor, root_rank, name=None, process_set=None):
    with waiting:
        h = broadcast_async(tensor, root_rank, name, process_set)
    return synchronize(h)


def tune(values):
    """The autotuner's agreed step (autotune.py): every rank takes part in a broadcast of
    rank 0's float64 `values`, whose first ones become each rank's engine knobs as the
    op runs (HVDL_TUNE); returns rank 0's values."""
    x = np.ascontiguousarray(values, dtype=np.float64)
    req = request.broadcast(0, "horovodlike.autotune", None)
    out = np.empty_like(x)
    with waiting:
        h = submit((x, out), lambda _: out, tune=True,
                   **req.fields(dtype_code(x.dtype, "broadcast"), x.shape, engine.address(x),
                                engine.address(out)))
    return synchronize(h)


def barrier(process_set=None):
    with waiting:
        h = submit((), lambda _: None, **request.barrier(process_set).fields())
    synchronize(h)


def reducescatter_async(tensor, op=None, name=None, process_set=None, prescale_factor=1.0,
                        postscale_factor=1.0):
    x = _as_array(tensor, "reducescatter")
    code = dtype_code(x.dtype, "reducescatter")
    req = request.reducescatter(name, op, prescale_factor, postscale_factor, process_set,
                                x.ndim)
    out = np.empty((req.rows(x.shape[0]),) + x.shape[1:], x.dtype)
    return submit((x, out), lambda _: out,
                  **req.fields(code, x.shape, engine.address(x), engine.address(out)))


def reducescatter(tensor, op=None, name=None, process_set=None, prescale_factor=1.0,
                  postscale_factor=1.0):
    with waiting:
        h = reducescatter_async(tensor, op, name, process_set, prescale_factor, postscale_factor)
    return synchronize(h)


def alltoall_async(tensor, splits=None, name=None, process_set=None):
    x = _as_array(tensor, "alltoall")
    code = dtype_code(x.dtype, "alltoall")
    req = request.alltoall(splits, x.shape[0] if x.ndim else None, name, process_set, x.ndim)

    def finish(res):
        out = _gathered(x, res)
        return (out, np.array(res.recv_splits or [], np.int32)) if req.splits_given else out

    return submit((x,), finish, **req.fields(code, x.shape, engine.address(x), splits=req.splits))


def alltoall(tensor, splits=None, name=None, process_set=None):
    """Send splits[j] rows to rank j. Returns the output, and the received splits if
    splits were given (Horovod's convention)."""
    with waiting:
        h = alltoall_async(tensor, splits, name, process_set)
    return synchronize(h)


def join(device=-1):
    """Say this rank is out of data: it contributes zeros to others' allreduces until
    every rank has joined. Returns the last rank to join."""
    with waiting:
        h = submit((), lambda res: int(res.value), **request.join().fields())
    return synchronize(h)


# ---- point-to-point ----
# A send and a recv are matched by (source, destination, name) by the two ranks alone
# (engine/p2p/p2p.c). The bindings share these helpers: they hand over a contiguous buffer
# and say how to wrap what arrives.

def submit_send(req, code, shape, address, keep):
    """Queue a send of a contiguous buffer; `keep` stays alive until it completes."""
    return submit(keep, lambda _: None, **req.fields(code, shape, address))


def submit_recv(req, wrap):
    """Queue a recv into a new buffer; wrap(result) builds the output from the message
    (result.message() gives its dtype name, shape and source)."""
    return submit((), wrap, **req.fields())


def submit_recv_into(req, code, shape, address, keep, finish):
    """Queue a recv into the caller's contiguous buffer: the message's dtype and size
    must match it, or the recv fails naming both ranks, the name and the field."""
    return submit(keep, finish, **req.fields(code, shape, 0, address, recv_into=True))


def _np_dtype(name):
    try:
        return np.dtype(name)
    except TypeError:
        raise TypeError(f"recv: the message is {name}, which numpy cannot hold here; "
                        f"receive it with horovodlike.torch or horovodlike.tensorflow") from None


def _np_message(res):
    dtype, shape, _ = res.message()
    dt = _np_dtype(dtype)
    if not res.nbytes:
        return np.empty(shape, dt)
    return np.frombuffer(res.buffer(), dtype=dt).reshape(shape)


def _p2p_key(kind, tensor, peer, name, process_set):
    """(key, prepared request or None) of a named send's or recv_'s cached fast path
    (request.p2p_key), as _allreduce_key: C-contiguity is checked on every call."""
    flags = tensor.flags if type(tensor) is np.ndarray else None
    if flags is None or not flags.c_contiguous or (kind != "send" and not flags.writeable):
        return None, None
    key = request.p2p_key(kind, name, peer, process_set, (tensor.dtype, tensor.shape))
    return key, (request.cached(key) if key is not None else None)


def _p2p_slow(kind, tensor, peer, name, process_set, key, finish):
    """A send or recv_ with every check, remembered under key for the next call."""
    seen = request.generation()
    what = "send" if kind == "send" else "recv_"
    x = _as_array(tensor, what)
    code = dtype_code(x.dtype, what)
    req = request.p2p("send" if kind == "send" else "recv", peer, name, process_set, what=what)
    into = kind != "send"
    if into and not x.flags.writeable:
        raise ValueError(f"recv_ from rank {peer} ({name!r}): the array is read-only "
                         f"(flags.writeable is False); pass a writable array, e.g. x.copy()")
    if key is None:
        if into:
            return submit_recv_into(req, code, x.shape, engine.address(x), (x,), finish)
        return submit_send(req, code, x.shape, engine.address(x), (x,))
    prepared = request.prepare(req, code, x.shape, recv_into=into)
    ptr = engine.data_pointer(x)
    handle = submit_prepared(prepared, (x,), finish, 0 if into else ptr, ptr if into else 0)
    request.remember(key, prepared, seen)
    return handle


def _none(_):
    return None


def send_async(tensor, dst, name=None, process_set=None):
    """Send `tensor` to global rank `dst`. Up to HOROVODLIKE_P2P_EAGER_BYTES the handle
    completes once the data has left this rank (possibly before `dst` posts its recv);
    a larger message moves once `dst` has posted its recv (rendezvous), and the handle
    completes then. Posting never blocks."""
    key, prepared = _p2p_key("send", tensor, dst, name, process_set)
    if prepared is not None:
        return submit_prepared(prepared, (tensor,), _none, engine.data_pointer(tensor), 0)
    return _p2p_slow("send", tensor, dst, name, process_set, key, _none)


def send(tensor, dst, name=None, process_set=None):
    _, prepared = _p2p_key("send", tensor, dst, name, process_set)
    if prepared is not None:
        run_now(prepared, tensor, engine.data_pointer(tensor), NULL)
        return
    with waiting:
        h = send_async(tensor, dst, name, process_set)
    synchronize(h)


def recv_async(src, name=None, process_set=None):
    """Receive the message `name` from global rank `src` into a new array whose dtype and
    shape are the message's."""
    return submit_recv(request.p2p("recv", src, name, process_set), _np_message)


def recv_key(src, name, process_set):
    """(key, prepared request or None) of a named recv's cached fast path: as
    request.p2p_key, with no tensor facts (the message brings its dtype and shape)."""
    key = request.p2p_key("recv", name, src, process_set, None)
    return key, (request.cached(key) if key is not None else None)


def recv_prepared(key, src, name, process_set, finish):
    """A blocking named recv into a new buffer, wrapped by finish(Result): the cached
    one-call path (run_now_result), or, the first time, every check, and the prepared
    request remembered under key."""
    seen = request.generation()
    prepared = request.prepare(request.p2p("recv", src, name, process_set), 0, ())
    out = run_now_result(prepared, finish)
    request.remember(key, prepared, seen)
    return out


def recv(src, name=None, process_set=None):
    key, prepared = recv_key(src, name, process_set)
    if prepared is not None:
        return run_now_result(prepared, _np_message)
    if key is not None:
        return recv_prepared(key, src, name, process_set, _np_message)
    return synchronize(recv_async(src, name, process_set))


def recv_async_(tensor, src, name=None, process_set=None):
    """Receive into `tensor` (C-contiguous); returns it at synchronize()."""
    key, prepared = _p2p_key("recv_", tensor, src, name, process_set)
    if prepared is not None:
        return submit_prepared(prepared, (tensor,), lambda _: tensor, 0,
                               engine.data_pointer(tensor))
    return _p2p_slow("recv_", tensor, src, name, process_set, key, lambda _: tensor)


def recv_(tensor, src, name=None, process_set=None):
    _, prepared = _p2p_key("recv_", tensor, src, name, process_set)
    if prepared is not None:
        run_now(prepared, tensor, NULL, engine.data_pointer(tensor))
        return tensor
    with waiting:
        h = recv_async_(tensor, src, name, process_set)
    return synchronize(h)
