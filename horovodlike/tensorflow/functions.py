"""Variables and Python objects across ranks: broadcast_variables, broadcast_object,
allgather_object."""
import io

import numpy as np
import tensorflow as tf

try:
    import cloudpickle as _pickle
except ImportError:          # plain pickle handles everything but lambdas and locals
    import pickle as _pickle

from horovodlike.common import ops as _common
from horovodlike.common.process_sets import global_process_set

from . import _graph, _kernels, _tensors
from .mpi_ops import _check_root, _process_set, _raw, _shape


def _read(var, what):
    if isinstance(var, (list, tuple)) or not hasattr(var, "assign"):
        raise TypeError(f"{what} expects tf.Variable or Keras variable objects, got "
                        f"{type(var).__name__}")
    value = tf.convert_to_tensor(var)
    _tensors.check_dtype(value, f"{what}: variable '{var.name}'", movement=True)
    return value


@_graph.entry_point
def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=False):
    """Assign root_rank's values to `variables` on every rank (one engine batch).

    Returns None when eager, the grouped assign op inside a graph. `inplace` is
    accepted for Horovod compatibility (the assignment is always in place here)."""
    variables = list(variables)
    ps = _process_set(process_set)
    root = _check_root(root_rank, ps, "broadcast_variables")
    if not variables:
        return None if tf.executing_eagerly() else tf.no_op()
    values = [_read(v, "broadcast_variables") for v in variables]   # check all first
    reqs = [_kernels.Request("broadcast", root_rank=root, process_set=ps, raw=_raw(t))
            for t in values]
    outs = _graph.run(_kernels.kernel(reqs), values, [t.dtype for t in values],
                      [_shape(t) for t in values], "broadcast_variables")
    assigns = [v.assign(o) for v, o in zip(variables, outs)]
    if tf.executing_eagerly():
        return None
    return tf.group(*[a for a in assigns if a is not None])


@_graph.entry_point
def broadcast_(variables, root_rank, name=None, process_set=global_process_set):
    """In-place broadcast of variables; returns their new values."""
    broadcast_variables(variables, root_rank, process_set)
    return [tf.convert_to_tensor(v) for v in variables]


def _dumps(obj):
    b = io.BytesIO()
    _pickle.dump(obj, b)
    return np.frombuffer(b.getvalue(), dtype=np.uint8)


def broadcast_object(obj, root_rank=0, session=None, name=None,
                     process_set=global_process_set):
    """Pickle obj on root_rank and return it on every rank (eager / Python only)."""
    ps = _process_set(process_set)
    root = _check_root(root_rank, ps, "broadcast_object")
    name = name or type(obj).__name__
    if ps.rank() == root:
        data = _dumps(obj)
        sz = np.array([data.size], np.int64)
    else:
        data, sz = None, np.zeros(1, np.int64)
    sz = _common.broadcast(sz, root, name=f"{name}.sz", process_set=ps)
    if data is None:
        data = np.zeros(int(sz[0]), np.uint8)
    data = _common.broadcast(data, root, name=f"{name}.t", process_set=ps)
    if ps.rank() == root:
        return obj
    return _pickle.loads(data.tobytes())


def allgather_object(obj, session=None, name=None, process_set=global_process_set):
    """Pickle obj on every rank; returns the list of every rank's object, in rank order."""
    ps = _process_set(process_set)
    name = name or type(obj).__name__
    data = _dumps(obj)
    sizes = _common.allgather(np.array([data.size], np.int64), name=f"{name}.sz",
                              process_set=ps)
    gathered = _common.allgather(data, name=f"{name}.t", process_set=ps)
    out, off = [], 0
    for n in sizes.tolist():
        out.append(_pickle.loads(gathered[off:off + n].tobytes()))
        off += n
    return out


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """Horovod's TF1 helper; here simply a function that broadcasts an object."""
    return lambda obj: broadcast_object(obj, root_rank, session, name, process_set)


__all__ = ["broadcast_variables", "broadcast_", "broadcast_object", "allgather_object",
           "broadcast_object_fn"]
