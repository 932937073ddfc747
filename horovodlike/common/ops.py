"""Collectives on numpy arrays with Horovod's signatures, and the handle machinery the
framework bindings reuse.

Naming, like every rule about a call's arguments, is request.py's: `name=x` becomes
"allreduce.x"; unnamed ops are numbered per op and per process set
("allreduce.noname.3"), so they match across ranks only if every rank makes the same
sequence of calls. Buffers are passed to the engine by address (zero copy) and kept
alive in `_pending` until their handle is synchronized.
"""
import numpy as np

from . import basics, engine, request
from .process_sets import global_process_set, set_id

Average, Sum, Adasum, Min, Max, Product = (engine.AVERAGE, engine.SUM, engine.ADASUM,
                                           engine.MIN, engine.MAX, engine.PRODUCT)

_pending = {}       # handle -> (keep-alive objects, finisher(engine.Result) -> output)


def op_name(kind, name, set_key=0):
    """Horovod's naming (request.engine_name: numbered per op kind and per process set,
    the set's id in the name)."""
    return request.engine_name(kind, name, set_key)


def resolve_op(op, average, what="allreduce"):
    """Horovod's op/average arguments (request.reduce_op)."""
    return request.reduce_op(op, average, what)


def dtype_code(dtype, what):
    code = engine.DTYPES.get(np.dtype(dtype).name) if dtype is not None else None
    if code is None:
        raise TypeError(f"{what}: dtype {dtype} is not supported; supported dtypes are "
                        f"{', '.join(engine.DTYPES)}")
    return code


def _as_array(tensor, what):
    if not isinstance(tensor, np.ndarray):
        raise TypeError(f"{what} expects a numpy array, got {type(tensor).__name__}")
    if not tensor.flags.c_contiguous:
        raise ValueError(f"{what}: the array is not C-contiguous; pass "
                         f"np.ascontiguousarray(x)")
    return tensor


def submit(keep, finish, **request):
    """Enqueue a request; remember what must stay alive and how to finish it."""
    basics._t()
    handle = engine.enqueue(**request)
    _pending[handle] = (keep, finish)
    return handle


def poll(handle):
    """True once the op behind handle has finished (it does not wait)."""
    return engine.poll(handle)


def synchronize(handle):
    """Wait for the op, free its handle and return its output (or raise its error)."""
    if handle not in _pending:
        raise ValueError(f"unknown or already synchronized handle {handle}")
    try:
        # Short waits so Ctrl-C is honoured between them; the GIL is released inside.
        while not engine.wait(handle, 0.5):
            pass
        result = engine.release(handle)
    finally:
        keep, finish = _pending.pop(handle)
    return finish(result)


# ---- numpy collectives ----

def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=None):
    x = _as_array(tensor, "allreduce")
    # Validate before naming: a refused call must not use up an unnamed op's number.
    code, reduce_op = dtype_code(x.dtype, "allreduce"), resolve_op(op, average)
    out = np.empty_like(x)
    return submit((x, out), lambda _: out, op=engine.ALLREDUCE,
                  name=op_name("allreduce", name, set_id(process_set)),
                  dtype=code, shape=x.shape,
                  input_ptr=x.ctypes.data, output_ptr=out.ctypes.data,
                  reduce_op=reduce_op, prescale=float(prescale_factor),
                  postscale=float(postscale_factor), process_set=set_id(process_set))


def allreduce(tensor, average=None, name=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=None):
    return synchronize(allreduce_async(tensor, average, name, op, prescale_factor,
                                       postscale_factor, process_set))


def allgather_async(tensor, name=None, process_set=None):
    x = _as_array(tensor, "allgather")
    if x.ndim == 0:
        raise ValueError("allgather needs at least one dimension to concatenate on")

    def finish(res):
        flat = np.frombuffer(res.buffer(), dtype=x.dtype)
        return flat.reshape((res.first_dim,) + x.shape[1:])

    code = dtype_code(x.dtype, "allgather")
    return submit((x,), finish, op=engine.ALLGATHER,
                  name=op_name("allgather", name, set_id(process_set)),
                  dtype=code, shape=x.shape,
                  input_ptr=x.ctypes.data, process_set=set_id(process_set))


def allgather(tensor, name=None, process_set=None):
    return synchronize(allgather_async(tensor, name, process_set))


def broadcast_async(tensor, root_rank, name=None, process_set=None):
    x = _as_array(tensor, "broadcast")
    if not isinstance(root_rank, (int, np.integer)) or isinstance(root_rank, bool):
        raise TypeError(f"broadcast: root_rank must be an int, got {root_rank!r}")
    code = dtype_code(x.dtype, "broadcast")
    out = np.empty_like(x)
    return submit((x, out), lambda _: out, op=engine.BROADCAST,
                  name=op_name("broadcast", name, set_id(process_set)),
                  dtype=code, shape=x.shape,
                  input_ptr=x.ctypes.data, output_ptr=out.ctypes.data, root_rank=int(root_rank),
                  process_set=set_id(process_set))


def broadcast(tensor, root_rank, name=None, process_set=None):
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


def barrier(process_set=None):
    synchronize(submit((), lambda _: None, op=engine.BARRIER,
                       name=op_name("barrier", None, set_id(process_set)),
                       process_set=set_id(process_set)))


def reducescatter_rows(rows, process_set=None):
    """Rows of a reducescatter result on this rank: lower ranks take the remainder."""
    return request.reducescatter_rows(rows, process_set)


def reducescatter_async(tensor, op=None, name=None, process_set=None, prescale_factor=1.0,
                        postscale_factor=1.0):
    x = _as_array(tensor, "reducescatter")
    if x.ndim == 0:
        raise ValueError("reducescatter needs at least one dimension to scatter on")
    out = np.empty((reducescatter_rows(x.shape[0], process_set),) + x.shape[1:], x.dtype)
    return submit((x, out), lambda _: out, op=engine.REDUCESCATTER,
                  name=op_name("reducescatter", name, set_id(process_set)),
                  dtype=dtype_code(x.dtype, "reducescatter"),
                  shape=x.shape, input_ptr=x.ctypes.data, output_ptr=out.ctypes.data,
                  reduce_op=resolve_op(op, None, "reducescatter"), prescale=float(prescale_factor),
                  postscale=float(postscale_factor), process_set=set_id(process_set))


def reducescatter(tensor, op=None, name=None, process_set=None, prescale_factor=1.0,
                  postscale_factor=1.0):
    return synchronize(reducescatter_async(tensor, op, name, process_set, prescale_factor,
                                           postscale_factor))


def alltoall_async(tensor, splits=None, name=None, process_set=None):
    x = _as_array(tensor, "alltoall")
    if x.ndim == 0:
        raise ValueError("alltoall needs at least one dimension to split on")
    n = (process_set or global_process_set).size()
    if splits is not None:
        splits = [int(v) for v in np.asarray(splits).reshape(-1)]
        if len(splits) != n:
            raise ValueError(f"alltoall: {len(splits)} splits given for {n} ranks")

    def finish(res):
        out = np.frombuffer(res.buffer(), dtype=x.dtype).reshape((res.first_dim,) + x.shape[1:])
        return out if splits is None else (out, np.array(res.recv_splits, np.int32))

    return submit((x,), finish, op=engine.ALLTOALL,
                  name=op_name("alltoall", name, set_id(process_set)),
                  dtype=dtype_code(x.dtype, "alltoall"), shape=x.shape, input_ptr=x.ctypes.data,
                  splits=splits, process_set=set_id(process_set))


def alltoall(tensor, splits=None, name=None, process_set=None):
    """Send splits[j] rows to rank j. Returns the output, and the received splits if
    splits were given (Horovod's convention)."""
    return synchronize(alltoall_async(tensor, splits, name, process_set))


def join(device=-1):
    """Say this rank is out of data: it contributes zeros to others' allreduces until
    every rank has joined. Returns the last rank to join."""
    return synchronize(submit((), lambda res: int(res.value), op=engine.JOIN, name="join"))
