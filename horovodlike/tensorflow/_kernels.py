"""The numpy side of every TensorFlow collective: one call runs a batch of requests.

Each item carries a `request.Request` built (named and checked) when the op was called
or traced; this module only maps arrays to engine buffers and allocates outputs. A
batch enqueues every tensor first and only then waits for all of them, so the gradients
of one backward pass reach the engine together and are fused there; in a graph the
whole batch is one enqueue call and one wait call (see _graph). Outputs that this
module allocates are 64-byte aligned, which lets TensorFlow adopt them without a copy.
"""
from dataclasses import dataclass

import numpy as np

from horovodlike.common import engine, ops, request

from ._tensors import aligned_empty


@dataclass(frozen=True)
class Item:
    """One tensor's collective. `raw`: carry the bytes as uint8 rows (dtypes the engine
    has no type for, in ops that only move data). `splits_input`: an alltoall whose
    splits arrive as a second array at run time."""
    req: request.Request
    raw: bool = False
    splits_input: bool = False

    @property
    def n_inputs(self):
        if self.req.kind in ("barrier", "join"):
            return 0
        return 2 if self.splits_input else 1


def _contiguous(x):
    return x if x.flags.c_contiguous else np.require(x, x.dtype, "C")


def _as_rows(x):
    """x as uint8 rows (first dimension kept), for dtypes the engine cannot name."""
    rows = x.shape[0] if x.ndim else 1
    row_bytes = x.dtype.itemsize * int(np.prod(x.shape[1:], dtype=np.int64))
    return x.reshape(-1).view(np.uint8).reshape(rows, row_bytes)


def _from_rows(b, dtype, tail):
    return b.reshape(-1).view(dtype).reshape((b.shape[0],) + tuple(tail))


def _submit(item, x, splits):
    req = item.req
    kind = req.kind
    if kind == "barrier":
        return ops.submit((), lambda _: (np.int32(0),), **req.fields())
    if kind == "join":
        return ops.submit((), lambda res: (np.int32(res.value),), **req.fields())
    x = _contiguous(x)
    if kind in ("allgather", "alltoall", "reducescatter"):
        # A graph may not have known the rank when it was traced.
        request.need_dims(x.ndim, kind, {"allgather": "concatenate on",
                                         "alltoall": "split on"}.get(kind, "scatter on"))
    orig = x
    if item.raw:
        x = _as_rows(x)
    code = ops.dtype_code(x.dtype, kind)

    def back(out):
        if not item.raw:
            return out
        if orig.ndim == 0:
            return out.reshape(-1).view(orig.dtype).reshape(())
        return _from_rows(out, orig.dtype, orig.shape[1:])

    if kind in ("allreduce", "broadcast", "reducescatter"):
        shape = x.shape
        if kind == "reducescatter":
            shape = (req.rows(x.shape[0]),) + x.shape[1:]
        out = aligned_empty(shape, x.dtype)
        return ops.submit((orig, x, out), lambda _: (back(out),),
                          **req.fields(code, x.shape, engine.address(x), engine.address(out)))

    def finish(res):
        flat = np.frombuffer(res.buffer(), dtype=x.dtype) if res.nbytes else \
            np.empty(0, x.dtype)
        out = back(flat.reshape((res.first_dim,) + x.shape[1:]))
        if kind == "allgather":
            return (out,)
        return out, np.asarray(res.recv_splits or [], dtype=np.int32)

    if kind == "alltoall":
        splits = req.alltoall_splits(x.shape[0], splits)
    return ops.submit((orig, x), finish, **req.fields(code, x.shape, engine.address(x),
                                                      splits=splits))


def submit_all(items, arrays):
    """Enqueue every item; never waits. Returns (handles, error): a refusal stops the
    batch, and is raised by wait_all once the ops already enqueued have finished."""
    handles, pos = [], 0
    try:
        for item in items:
            x = np.asarray(arrays[pos]) if item.n_inputs else None  # 0-d come as scalars
            splits = np.asarray(arrays[pos + 1]) if item.splits_input else None
            pos += item.n_inputs
            handles.append(_submit(item, x, splits))
    except Exception as e:  # noqa: BLE001 - refused at enqueue: still drain what was queued
        return handles, e
    return handles, None


def wait_all(handles, error=None):
    """Wait for every handle (so none is left behind), then raise the first error, or
    return the outputs in order (alltoall gives two: the output and the received
    splits)."""
    try:
        outs = request.wait_all(handles, ops.synchronize)
    except Exception as e:  # noqa: BLE001
        error = error or e
    if error is not None:
        raise error
    return [o for out in outs for o in out]


def execute(items, arrays):
    """Enqueue every item, then wait for all (eager calls)."""
    return wait_all(*submit_all(items, arrays))
