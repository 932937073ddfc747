"""Python objects across ranks, for every binding: broadcast_object and
allgather_object (Horovod's helpers), on numpy buffers.

Objects travel pickled, with cloudpickle when it is installed (as Horovod does, so
lambdas and local functions travel too). They are unpickled only from the ranks of this
job, which proved the job's key when they connected. Default names are the same on
every rank, so ranks may pass different placeholder objects (None, say) where the root
passes data.
"""
import io
import pickle

import numpy as np

from . import basics, ops, request

try:                                  # Horovod pickles with cloudpickle (lambdas, ...)
    import cloudpickle as _pickler
except ImportError:                   # plain pickle handles all but lambdas and locals
    _pickler = pickle


def dumps(obj):
    """obj pickled, as a uint8 array."""
    buf = io.BytesIO()
    _pickler.dump(obj, buf)
    return np.frombuffer(buf.getbuffer(), dtype=np.uint8)


def loads(data):
    return _pickler.loads(memoryview(np.ascontiguousarray(data, dtype=np.uint8)))


def broadcast_object(obj, root_rank=0, name=None, process_set=None):
    """root_rank's `obj` on every rank of the set (root gets its own object back).
    root_rank is a global rank, also with a process set."""
    ps, _ = request.resolve_set(process_set)
    root = request.root(ps, root_rank, "broadcast_object")
    request.member_index(ps, "broadcast_object")
    name = name or "broadcast_object"
    is_root = basics.rank() == root
    data = dumps(obj) if is_root else None
    size = np.array([data.size if is_root else 0], np.int64)
    size = ops.broadcast(size, root, name=f"{name}.sz", process_set=ps)
    if not is_root:
        data = np.zeros(int(size[0]), np.uint8)
    data = ops.broadcast(data, root, name=f"{name}.t", process_set=ps)
    return obj if is_root else loads(data)


def allgather_object(obj, name=None, process_set=None):
    """Every rank's `obj`, as a list in the set's rank order."""
    ps, _ = request.resolve_set(process_set)
    request.member_index(ps, "allgather_object")
    name = name or "allgather_object"
    data = dumps(obj)
    sizes = ops.allgather(np.array([data.size], np.int64), name=f"{name}.sz", process_set=ps)
    gathered = ops.allgather(data, name=f"{name}.t", process_set=ps)
    if int(sizes.sum()) != gathered.size:
        raise ValueError(f"allgather_object: ranks reported {int(sizes.sum())} bytes in all "
                         f"but {gathered.size} arrived")
    out, start = [], 0
    for n in sizes.tolist():
        out.append(loads(gathered[start:start + n]))
        start += n
    return out
