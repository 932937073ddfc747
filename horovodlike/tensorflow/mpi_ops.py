"""Collectives on TensorFlow tensors, eager and inside tf.function, with gradients.

Each public function checks its arguments at call (or trace) time, builds
`_kernels.Request`s and runs them as one batch (`_graph.run`). Gradients follow
Horovod's registered gradients:

  allreduce      -> allreduce of the gradient with the same op and scale factors
  allgather      -> Average-allreduce of the gradient, then this rank's rows
  broadcast      -> Average-allreduce of the gradient on the root, zeros elsewhere
  alltoall       -> alltoall of the gradient with the received splits
  reducescatter  -> allgather of the gradient (times the set size for Sum)
"""
import numbers

import tensorflow as tf

from horovodlike.common import basics
from horovodlike.common import ops as _common
from horovodlike.common.process_sets import (ProcessSet, add_process_set,  # noqa: F401
                                             global_process_set, remove_process_set)

from . import _graph, _kernels, _tensors
from .compression import Compression

Average, Sum, Adasum = _common.Average, _common.Sum, _common.Adasum
Min, Max, Product = _common.Min, _common.Max, _common.Product
_REDUCE_OPS = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max",
               Product: "Product"}


# ------------------------------------------------------------------ helpers

def _process_set(process_set):
    ps = global_process_set if process_set is None else process_set
    if not isinstance(ps, ProcessSet):
        raise TypeError(f"process_set must be a hvd.ProcessSet, got {type(ps).__name__}")
    return ps


def _check_op(op, what):
    if op not in _REDUCE_OPS:
        raise ValueError(f"{what}: unknown reduction op {op!r}; use hvd.Average, hvd.Sum, "
                         f"hvd.Min, hvd.Max, hvd.Product or hvd.Adasum")
    return op


def _names(name, n):
    if name is None:
        return [None] * n
    return [str(name)] if n == 1 else [f"{name}.{i}" for i in range(n)]


def _shape(t):
    return _tensors.static_shape(t.shape)


def _run(requests, inputs, out_dtypes, out_shapes, what):
    return _graph.run(_kernels.kernel(requests), inputs, out_dtypes, out_shapes, what)


def _differentiable(dtype):
    return dtype.is_floating or dtype.is_complex


def _with_gradient(forward, backward, tensors):
    """forward(xs) -> ys; backward(xs, ys, dys) -> dxs. Integer-only inputs skip the
    gradient machinery entirely."""
    if not any(_differentiable(t.dtype) for t in tensors):
        return forward(list(tensors))

    @tf.custom_gradient
    def op(*xs):
        ys = forward(list(xs))

        def grad(*dys):
            dys = [tf.zeros_like(y) if d is None else d for d, y in zip(dys, ys)]
            dxs = backward(list(xs), ys, dys)
            return [dx if _differentiable(x.dtype) else None for dx, x in zip(dxs, xs)]
        return ys, grad
    return list(op(*tensors))


def _dense(tensor, what, movement=False):
    t = _tensors.as_tensor(tensor, what)
    _tensors.check_dtype(t, what, movement)
    return t


def _raw(t):
    return t.dtype.base_dtype in _tensors.BYTE_DTYPES


def _check_root(root_rank, ps, what):
    if isinstance(root_rank, bool) or not isinstance(root_rank, numbers.Integral):
        raise TypeError(f"{what}: root_rank must be an int, got {root_rank!r}")
    if not 0 <= int(root_rank) < ps.size():
        raise ValueError(f"{what}: root_rank {root_rank} is not a rank of the process set "
                         f"(size {ps.size()})")
    return int(root_rank)


def _set_size(ps):
    return ps.size()


# ---------------------------------------------------------------- allreduce

def _allreduce_dense(tensors, names, op, prescale, postscale, ps):
    reqs = [_kernels.Request("allreduce", name=n, reduce_op=op, prescale=prescale,
                             postscale=postscale, process_set=ps) for n in names]

    def forward(xs):
        return _run(reqs, xs, [x.dtype for x in xs], [_shape(x) for x in xs], "allreduce")

    def backward(xs, ys, dys):
        return _allreduce_dense(dys, [None] * len(dys), op, prescale, postscale, ps)
    return _with_gradient(forward, backward, tensors)


def _sparse_check(op, prescale, postscale):
    if op == Adasum:
        raise NotImplementedError("The Adasum reduction does not support sparse tensors "
                                  "(tf.IndexedSlices); pass sparse_as_dense=True")
    if op not in (Sum, Average):
        raise NotImplementedError("Only Sum and Average ops are supported with tf.IndexedSlices")
    if prescale != 1.0 or postscale != 1.0:
        raise NotImplementedError("Pre/postscale_factor are not supported with tf.IndexedSlices")


def _finish_sparse(slices, values, indices, op, ps):
    out = []
    for s, v, i in zip(slices, values, indices):
        if op == Average:
            v = v / tf.cast(_set_size(ps), v.dtype)
        out.append(tf.IndexedSlices(v, i, dense_shape=s.dense_shape))
    return out


@_graph.entry_point
def allreduce(tensor, average=None, device_dense='', device_sparse='',
              compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, name=None, process_set=global_process_set,
              ignore_name_scope=False):
    """Reduce a tf.Tensor, tf.Variable or tf.IndexedSlices over all ranks (op defaults
    to Average). IndexedSlices are allgathered (values and indices) instead."""
    op = _check_op(_common.resolve_op(op, average), "allreduce")
    ps = _process_set(process_set)
    if isinstance(tensor, tf.IndexedSlices):
        _sparse_check(op, prescale_factor, postscale_factor)
        values, indices = grouped_allgather([tensor.values, tensor.indices],
                                            name=name, process_set=ps)
        return _finish_sparse([tensor], [values], [indices], op, ps)[0]
    t = _dense(tensor, "allreduce")
    c, ctx = compression.compress(t)
    _tensors.check_dtype(c, "allreduce")
    (out,) = _allreduce_dense([c], [name], op, prescale_factor, postscale_factor, ps)
    return compression.decompress(out, ctx)


@_graph.entry_point
def grouped_allreduce(tensors, average=None, device_dense='', device_sparse='',
                      compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set,
                      ignore_name_scope=False, name=None):
    """Allreduce a list of tensors (tf.IndexedSlices allowed) in one engine batch."""
    if not tensors:
        return tensors
    op = _check_op(_common.resolve_op(op, average), "grouped_allreduce")
    ps = _process_set(process_set)
    tensors = list(tensors)
    if any(isinstance(t, tf.IndexedSlices) for t in tensors):
        _sparse_check(op, prescale_factor, postscale_factor)
        return reduce_batch(tensors, op, prescale_factor, postscale_factor, ps, compression,
                            name)
    dense = [_dense(t, "grouped_allreduce") for t in tensors]
    pairs = [compression.compress(t) for t in dense]
    for c, _ in pairs:
        _tensors.check_dtype(c, "grouped_allreduce")
    outs = _allreduce_dense([c for c, _ in pairs], _names(name, len(dense)), op,
                            prescale_factor, postscale_factor, ps)
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, pairs)]


def reduce_batch(tensors, op, prescale, postscale, ps, compression=Compression.none,
                 name=None, gradient_scaling=False):
    """Dense tensors allreduced and tf.IndexedSlices allgathered, all in ONE engine
    batch (one py-call in a graph). Not differentiable: for reducing gradients.
    gradient_scaling: the scale factors only split an Average (gradient_predivide_factor),
    so sparse tensors are simply averaged instead of refused."""
    names = _names(name, len(tensors))
    reqs, inputs, dtypes, shapes, plan = [], [], [], [], []
    for t, n in zip(tensors, names):
        if isinstance(t, tf.IndexedSlices):
            if gradient_scaling:
                _sparse_check(op, 1.0, 1.0)
            else:
                _sparse_check(op, prescale, postscale)
            v = _dense(t.values, "allreduce (IndexedSlices values)")
            i = _dense(t.indices, "allreduce (IndexedSlices indices)")
            for part, suffix in ((v, "values"), (i, "indices")):
                reqs.append(_kernels.Request("allgather", name=n and f"{n}.{suffix}",
                                             process_set=ps))
                inputs.append(part)
                dtypes.append(part.dtype)
                shapes.append((None,) + (_shape(part) or (None,))[1:])
            plan.append(("sparse", t, None))
        else:
            d = _dense(t, "allreduce")
            c, ctx = compression.compress(d)
            _tensors.check_dtype(c, "allreduce")
            reqs.append(_kernels.Request("allreduce", name=n, reduce_op=op, prescale=prescale,
                                         postscale=postscale, process_set=ps))
            inputs.append(c)
            dtypes.append(c.dtype)
            shapes.append(_shape(c))
            plan.append(("dense", t, ctx))
    outs = iter(_run(reqs, inputs, dtypes, shapes, "allreduce"))
    result = []
    for kind, t, ctx in plan:
        if kind == "dense":
            result.append(compression.decompress(next(outs), ctx))
        else:
            v, i = next(outs), next(outs)
            result.extend(_finish_sparse([t], [v], [i], op, ps))
    return result


# ---------------------------------------------------------------- allgather

def _allgather(tensors, names, ps):
    for t in tensors:
        if t.shape.rank == 0:
            raise ValueError("allgather needs tensors with at least one dimension to "
                             "concatenate on; got a scalar (reshape it to [1])")
    reqs = [_kernels.Request("allgather", name=n, process_set=ps, raw=_raw(t))
            for t, n in zip(tensors, names)]

    def forward(xs):
        return _run(reqs, xs, [x.dtype for x in xs],
                    [(None,) + (_shape(x) or (None,))[1:] if _shape(x) is not None else None
                     for x in xs], "allgather")

    def backward(xs, ys, dys):
        want = [i for i, x in enumerate(xs) if _differentiable(x.dtype)]
        dys = _allreduce_dense([dys[i] for i in want], [None] * len(want), Average, 1.0,
                               1.0, ps)
        sizes = _allgather([tf.shape(xs[i], out_type=tf.int64)[:1] for i in want],
                           [None] * len(want), ps)
        me = ps.rank()
        out = [None] * len(xs)
        for i, dy, n in zip(want, dys, sizes):
            start = tf.reduce_sum(n[:me])
            out[i] = dy[start:start + n[me]]
        return out
    return _with_gradient(forward, backward, tensors)


@_graph.entry_point
def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Concatenate every rank's tensor on the first dimension (which may differ)."""
    t = _dense(tensor, "allgather", movement=True)
    return _allgather([t], [name], _process_set(process_set))[0]


@_graph.entry_point
def grouped_allgather(tensors, name=None, ignore_name_scope=False,
                      process_set=global_process_set):
    """Allgather a list of tensors in one engine batch."""
    if not tensors:
        return tensors
    ts = [_dense(t, "grouped_allgather", movement=True) for t in tensors]
    return _allgather(ts, _names(name, len(ts)), _process_set(process_set))


# ---------------------------------------------------------------- broadcast

def _broadcast(tensors, names, root_rank, ps):
    reqs = [_kernels.Request("broadcast", name=n, root_rank=root_rank, process_set=ps,
                             raw=_raw(t)) for t, n in zip(tensors, names)]

    def forward(xs):
        return _run(reqs, xs, [x.dtype for x in xs], [_shape(x) for x in xs], "broadcast")

    def backward(xs, ys, dys):
        dys = _allreduce_dense(dys, [None] * len(dys), Average, 1.0, 1.0, ps)
        return dys if ps.rank() == root_rank else [d * 0 for d in dys]
    return _with_gradient(forward, backward, tensors)


@_graph.entry_point
def broadcast(tensor, root_rank, name=None, ignore_name_scope=False,
              process_set=global_process_set):
    """root_rank's value of tensor, on every rank."""
    ps = _process_set(process_set)
    root = _check_root(root_rank, ps, "broadcast")
    t = _dense(tensor, "broadcast", movement=True)
    return _broadcast([t], [name], root, ps)[0]


@_graph.entry_point
def grouped_broadcast(tensors, root_rank, name=None, process_set=global_process_set):
    """Broadcast a list of tensors in one engine batch (a horovodlike addition)."""
    if not tensors:
        return tensors
    ps = _process_set(process_set)
    root = _check_root(root_rank, ps, "broadcast")
    ts = [_dense(t, "broadcast", movement=True) for t in tensors]
    return _broadcast(ts, _names(name, len(ts)), root, ps)


# ----------------------------------------------------------------- alltoall

@_graph.entry_point
def alltoall(tensor, splits=None, name=None, ignore_name_scope=False,
             process_set=global_process_set):
    """Send splits[j] rows to member j (even split without splits). Returns the output,
    and the received splits too when splits were given."""
    ps = _process_set(process_set)
    t = _dense(tensor, "alltoall", movement=True)
    if t.shape.rank == 0:
        raise ValueError("alltoall needs a tensor with at least one dimension to split on")
    given = splits is not None
    if given:
        if isinstance(splits, (list, tuple)) and any(not isinstance(v, numbers.Integral)
                                                     for v in splits):
            raise TypeError(f"alltoall: splits must be integers, got {splits!r}")
        splits = tf.reshape(tf.cast(tf.convert_to_tensor(splits), tf.int64), [-1])
    out, rsplits = _alltoall(t, splits, name, ps)
    return (out, rsplits) if given else out


def _alltoall(t, splits, name, ps):
    req = _kernels.Request("alltoall", name=name, process_set=ps, raw=_raw(t),
                           splits_input=splits is not None)
    shape = _shape(t)
    out_shape = None if shape is None else (None,) + shape[1:]

    def forward(xs):
        inputs = [xs[0]] + ([splits] if splits is not None else [])
        return _run([req], inputs, [xs[0].dtype, tf.int32], [out_shape, (ps.size(),)],
                    "alltoall")

    def backward(xs, ys, dys):
        return [_alltoall(dys[0], tf.cast(ys[1], tf.int64), None, ps)[0]]
    return _with_gradient(forward, backward, [t])


# ------------------------------------------------------------ reducescatter

def _reducescatter(tensors, names, op, prescale, postscale, ps):
    for t in tensors:
        if t.shape.rank == 0:
            raise ValueError("reducescatter needs tensors with at least one dimension")
    reqs = [_kernels.Request("reducescatter", name=n, reduce_op=op, prescale=prescale,
                             postscale=postscale, process_set=ps) for n in names]

    def out_shape(x):
        s = _shape(x)
        if s is None:
            return None
        rows = None if s[0] is None else _common.reducescatter_rows(s[0], ps)
        return (rows,) + s[1:]

    def forward(xs):
        return _run(reqs, xs, [x.dtype for x in xs], [out_shape(x) for x in xs],
                    "reducescatter")

    def backward(xs, ys, dys):
        if op == Sum:
            dys = [d * tf.cast(ps.size(), d.dtype) for d in dys]
        return _allgather(dys, [None] * len(dys), ps)
    return _with_gradient(forward, backward, tensors)


def _rs_op(op):
    op = Average if op is None else op
    if op not in (Sum, Average):
        raise ValueError("reducescatter supports only hvd.Sum and hvd.Average")
    return op


@_graph.entry_point
def reducescatter(tensor, device_dense='', compression=Compression.none, op=Average,
                  name=None, process_set=global_process_set, ignore_name_scope=False,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduce over all ranks, then give each rank its share of the first dimension
    (lower ranks take the remainder)."""
    op = _rs_op(op)
    ps = _process_set(process_set)
    t = _dense(tensor, "reducescatter")
    c, ctx = compression.compress(t)
    (out,) = _reducescatter([c], [name], op, prescale_factor, postscale_factor, ps)
    return compression.decompress(out, ctx)


@_graph.entry_point
def grouped_reducescatter(tensors, device_dense='', compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0, name=None):
    """Reducescatter a list of tensors in one engine batch."""
    if not tensors:
        return tensors
    op = _rs_op(op)
    ps = _process_set(process_set)
    pairs = [compression.compress(_dense(t, "grouped_reducescatter")) for t in tensors]
    outs = _reducescatter([c for c, _ in pairs], _names(name, len(pairs)), op,
                          prescale_factor, postscale_factor, ps)
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, pairs)]


# ------------------------------------------------------------ barrier, join

def _scalar_call(fn, what):
    """Run fn() -> int now (eager) or when the graph runs; returns an int32 scalar."""
    import numpy as np
    if tf.executing_eagerly():
        return tf.constant(fn(), tf.int32)
    _graph.check_xla(what)
    call = tf.autograph.experimental.do_not_convert(lambda: np.int32(fn()))
    out = tf.numpy_function(call, [], tf.int32, stateful=True,
                            name="horovodlike_" + what)
    out.set_shape(())
    return out


@_graph.entry_point
def barrier(process_set=global_process_set):
    """Wait until every rank of the set has reached this point."""
    ps = _process_set(process_set)
    return _scalar_call(lambda: _common.barrier(ps) or 0, "barrier")


@_graph.entry_point
def join():
    """This rank is out of data: it contributes zeros to the others' allreduces until
    every rank has joined. Returns the last rank to join (an int32 tensor)."""
    return _scalar_call(_common.join, "join")


# ------------------------------------------------- topology as tensors

def size_op(process_set_id=0, name=None):
    return tf.constant(basics.size() if process_set_id == 0 else
                       _set_by_id(process_set_id).size(), tf.int32, name=name)


def rank_op(name=None):
    return tf.constant(basics.rank(), tf.int32, name=name)


def local_size_op(name=None):
    return tf.constant(basics.local_size(), tf.int32, name=name)


def local_rank_op(name=None):
    return tf.constant(basics.local_rank(), tf.int32, name=name)


def process_set_included_op(process_set_id=0, name=None):
    included = True if process_set_id == 0 else _set_by_id(process_set_id).included()
    return tf.constant(int(included), tf.int32, name=name)


def _set_by_id(process_set_id):
    from horovodlike.common import process_sets
    try:
        return process_sets._sets[process_set_id]
    except KeyError:
        raise ValueError(f"no process set with id {process_set_id}") from None
