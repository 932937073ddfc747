"""The numpy side of every TensorFlow collective: one call runs a batch of requests.

A batch enqueues every tensor first and only then waits for all of them, so the
gradients of one backward pass reach the engine together and are fused there; in a
graph the whole batch is one `tf.numpy_function` call. Requests go through the common
layer's handle machinery (`ops.submit` / `ops.synchronize`), so naming, keep-alive and
error mapping are the ones the numpy API has. Outputs that this module allocates are
64-byte aligned, which lets TensorFlow adopt them without a copy.
"""
from dataclasses import dataclass
from typing import Optional

import numpy as np

from horovodlike.common import engine, ops
from horovodlike.common.process_sets import global_process_set, set_id

from ._tensors import aligned_empty

_KINDS = {"allreduce": engine.ALLREDUCE, "allgather": engine.ALLGATHER,
          "broadcast": engine.BROADCAST, "alltoall": engine.ALLTOALL,
          "reducescatter": engine.REDUCESCATTER}


@dataclass(frozen=True)
class Request:
    """One tensor's collective. `raw`: carry the bytes as uint8 rows (dtypes the engine
    has no type for, in ops that only move data). `splits_input`: alltoall whose splits
    arrive as a second array at run time."""
    kind: str
    name: Optional[str] = None
    reduce_op: int = engine.SUM
    prescale: float = 1.0
    postscale: float = 1.0
    root_rank: int = 0
    process_set: object = None
    raw: bool = False
    splits_input: bool = False

    @property
    def n_outputs(self):
        return 2 if self.kind == "alltoall" else 1

    @property
    def n_inputs(self):
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


def _common(req, x, what):
    # Validate first: a refused request must not use up a number of the unnamed-op
    # counter, or this rank's later unnamed ops would stop matching the others'.
    dtype, psid = ops.dtype_code(x.dtype, what), set_id(req.process_set)
    return dict(name=ops.op_name(req.kind, req.name), dtype=dtype, shape=x.shape,
                input_ptr=x.ctypes.data, process_set=psid)


def _submit(req, x, splits):
    x = _contiguous(x)
    orig = x
    if req.raw:
        x = _as_rows(x)

    def back(out):
        if not req.raw:
            return out
        if orig.ndim == 0:
            return out.reshape(-1).view(orig.dtype).reshape(())
        return _from_rows(out, orig.dtype, orig.shape[1:])

    kind = _KINDS[req.kind]
    if req.kind in ("allreduce", "broadcast", "reducescatter"):
        if req.kind == "reducescatter":
            rows = ops.reducescatter_rows(x.shape[0], req.process_set)
            out = aligned_empty((rows,) + x.shape[1:], x.dtype)
        else:
            out = aligned_empty(x.shape, x.dtype)
        if req.kind != "broadcast":
            extra = dict(reduce_op=req.reduce_op, prescale=float(req.prescale),
                         postscale=float(req.postscale))
        else:
            extra = dict(root_rank=int(req.root_rank))
        return ops.submit((orig, x, out), lambda _: (back(out),), op=kind,
                          output_ptr=out.ctypes.data, **extra, **_common(req, x, req.kind))

    def finish(res):
        flat = np.frombuffer(res.buffer(), dtype=x.dtype) if res.nbytes else \
            np.empty(0, x.dtype)
        out = back(flat.reshape((res.first_dim,) + x.shape[1:]))
        if req.kind == "allgather":
            return (out,)
        return out, np.asarray(res.recv_splits or [], dtype=np.int32)

    if splits is not None:
        splits = [int(v) for v in np.asarray(splits).reshape(-1)]
        n = (req.process_set or global_process_set).size()
        if len(splits) != n:
            raise ValueError(f"alltoall: {len(splits)} splits given for {n} ranks")
        if sum(splits) != x.shape[0]:
            raise ValueError(f"alltoall: splits {splits} add up to {sum(splits)}, but the "
                             f"tensor has {x.shape[0]} rows")
    return ops.submit((orig, x), finish, op=kind, splits=splits, **_common(req, x, req.kind))


def execute(requests, arrays):
    """Enqueue every request, then wait for all; returns the outputs in order (alltoall
    gives two: the output and the received splits). The first error is raised after
    every enqueued op has been waited for, so no handle is left behind."""
    handles, error = [], None
    pos = 0
    try:
        for req in requests:
            x = np.asarray(arrays[pos])     # a py-function passes 0-d tensors as scalars
            splits = arrays[pos + 1] if req.splits_input else None
            pos += req.n_inputs
            handles.append(_submit(req, x, splits))
    except Exception as e:           # refused at enqueue: still drain what was queued
        error = e
    outs = []
    for h in handles:
        try:
            outs.extend(ops.synchronize(h))
        except Exception as e:
            error = error or e
    if error is not None:
        raise error
    return outs


def kernel(requests):
    """A function of numpy arrays running `requests` (what tf.numpy_function calls)."""
    requests = tuple(requests)

    def run(*arrays):
        return execute(requests, arrays)
    return run
