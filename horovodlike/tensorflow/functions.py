"""Variables and Python objects across ranks: broadcast_variables, broadcast_object,
allgather_object (the object helpers are horovodlike.common.objects')."""
import tensorflow as tf

from horovodlike.common import objects, request
from horovodlike.common.process_sets import global_process_set

from . import _errors, _graph, _kernels, _tensors
from .mpi_ops import _raw, _shape


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
    what = "broadcast_variables"
    if not variables:
        request.root(request.resolve_set(process_set)[0], root_rank, what)
        return None if tf.executing_eagerly() else tf.no_op()
    values = [_read(v, what) for v in variables]                  # check all first
    reqs = request.broadcast(root_rank, None, process_set, what, _graph.namer(),
                             members=len(values))
    items = [_kernels.Item(r, raw=_raw(t)) for r, t in zip(reqs, values)]
    outs = _graph.run(items, values, [t.dtype for t in values],
                      [_shape(t) for t in values], what)
    assigns = [v.assign(o) for v, o in zip(variables, outs)]
    if tf.executing_eagerly():
        return None
    return tf.group(*[a for a in assigns if a is not None])


@_graph.entry_point
def broadcast_(variables, root_rank, name=None, process_set=global_process_set):
    """In-place broadcast of variables; returns their new values (inside a graph, read
    after the assignments, so that running them runs the broadcast)."""
    variables = list(variables)
    assigned = broadcast_variables(variables, root_rank, process_set)
    with tf.control_dependencies([] if assigned is None else [assigned]):
        return [tf.identity(v) for v in variables]


def broadcast_object(obj, root_rank=0, session=None, name=None,
                     process_set=global_process_set):
    """Pickle obj on root_rank and return it on every rank (eager / Python only).
    root_rank is a global rank, also with a process set."""
    with _errors.translated():
        return objects.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj, session=None, name=None, process_set=global_process_set):
    """Pickle obj on every rank; returns the list of every rank's object, in rank order."""
    with _errors.translated():
        return objects.allgather_object(obj, name, process_set)


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """Horovod's TF1 helper; here simply a function that broadcasts an object."""
    return lambda obj: broadcast_object(obj, root_rank, session, name, process_set)


__all__ = ["broadcast_variables", "broadcast_", "broadcast_object", "allgather_object",
           "broadcast_object_fn"]
