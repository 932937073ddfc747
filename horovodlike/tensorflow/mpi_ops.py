"""Collectives on TensorFlow tensors, eager and inside tf.function, with gradients.

Each public function maps its tensors to dtypes and shapes, asks the common request
builder (horovodlike.common.request) for checked, named requests at call (or trace)
time, and runs them as one batch (`_graph.run`). Unnamed ops traced into a graph are
named when traced (see _graph). Gradients follow Horovod's registered gradients:

  allreduce      -> allreduce of the gradient with the same op and scale factors
  allgather      -> Average-allreduce of the gradient, then this rank's rows
  broadcast      -> Average-allreduce of the gradient on the root, zeros elsewhere
  alltoall       -> alltoall of the gradient with the received splits
  reducescatter  -> allgather of the gradient (times the set size for Sum)

Errors carry Horovod's tf.errors types (see _errors).
"""
import tensorflow as tf

from horovodlike.common import basics, process_sets, request
# Horovod's tensorflow.mpi_ops carries the basics too; scripts import them from here.
from horovodlike.common.api import (ccl_built, cross_rank, cross_size,  # noqa: F401
                                    cuda_built, ddl_built, gloo_built, gloo_enabled, init,
                                    is_homogeneous, is_initialized, local_rank,
                                    local_size, mpi_built, mpi_enabled,
                                    mpi_threads_supported, nccl_built, rank, rocm_built,
                                    shutdown, size, start_timeline, stop_timeline)
from horovodlike.common.dynamic_sets import (add_process_set,  # noqa: F401
                                             remove_process_set)
from horovodlike.common.process_sets import (ProcessSet, get_process_sets,  # noqa: F401
                                             global_process_set)

from . import _graph, _kernels, _tensors
from .compression import Compression

Average, Sum, Adasum = request.Average, request.Sum, request.Adasum
Min, Max, Product = request.Min, request.Max, request.Product


# ------------------------------------------------------------------ helpers

def _shape(t):
    return _tensors.static_shape(t.shape)


def _ndim(t):
    return t.shape.rank


def _rows(t):
    s = _shape(t)
    return None if not s else s[0]


def _run(items, inputs, out_dtypes, out_shapes, what):
    return _graph.run(items, inputs, out_dtypes, out_shapes, what)


def _build(builder, name, n, *args, grouped=None, **kwargs):
    """Requests from a request.py builder: one op, or the n members of a group (grouped,
    by default when n > 1). Unnamed ops are numbered by this context's namer."""
    kwargs["namer"] = _graph.namer()
    if grouped or (grouped is None and n != 1):
        return builder(*args, name=name, members=n, **kwargs)
    return [builder(*args, name=name, **kwargs)]


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


def _process_set(process_set):
    return request.resolve_set(process_set)[0]


# ---------------------------------------------------------------- allreduce

def _allreduce_dense(tensors, reqs):
    items = [_kernels.Item(r) for r in reqs]
    r0 = reqs[0]

    def forward(xs):
        return _run(items, xs, [x.dtype for x in xs], [_shape(x) for x in xs], "allreduce")

    def backward(xs, ys, dys):
        back = _build(request.allreduce, None, len(dys), op=r0.reduce_op,
                      prescale_factor=r0.prescale, postscale_factor=r0.postscale,
                      process_set=r0.process_set, what="allreduce gradient")
        return _allreduce_dense(dys, back)
    return _with_gradient(forward, backward, tensors)


def _sparse_check(op, prescale, postscale):
    if op not in (Sum, Average):
        raise NotImplementedError("Only Sum and Average ops are supported with tf.IndexedSlices")
    if prescale != 1.0 or postscale != 1.0:
        raise NotImplementedError("Pre/postscale_factor are not supported with tf.IndexedSlices")


def _finish_sparse(s, values, indices, op, ps):
    if op == Average:
        values = values / tf.cast(ps.size(), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=s.dense_shape)


@_graph.entry_point
def allreduce(tensor, average=None, device_dense='', device_sparse='',
              compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, name=None, process_set=global_process_set,
              ignore_name_scope=False):
    """Reduce a tf.Tensor, tf.Variable or tf.IndexedSlices over all ranks (op defaults
    to Average). IndexedSlices are allgathered (values and indices) instead."""
    op = request.reduce_op(op, average, "allreduce")
    if isinstance(tensor, tf.IndexedSlices):
        _sparse_check(op, prescale_factor, postscale_factor)
        values, indices = grouped_allgather([tensor.values, tensor.indices], name=name,
                                            process_set=process_set)
        return _finish_sparse(tensor, values, indices, op, _process_set(process_set))
    t = _dense(tensor, "allreduce")
    c, ctx = compression.compress(t)
    _tensors.check_dtype(c, "allreduce")
    reqs = _build(request.allreduce, name, 1, op=op, prescale_factor=prescale_factor,
                  postscale_factor=postscale_factor, process_set=process_set)
    (out,) = _allreduce_dense([c], reqs)
    return compression.decompress(out, ctx)


@_graph.entry_point
def grouped_allreduce(tensors, average=None, device_dense='', device_sparse='',
                      compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set,
                      ignore_name_scope=False, name=None):
    """Allreduce a list of tensors (tf.IndexedSlices allowed) in one engine batch."""
    if not tensors:
        return tensors
    op = request.reduce_op(op, average, "grouped_allreduce")
    tensors = list(tensors)
    if any(isinstance(t, tf.IndexedSlices) for t in tensors):
        return reduce_batch(tensors, op, prescale_factor, postscale_factor, process_set,
                            compression, name)
    dense = [_dense(t, "grouped_allreduce") for t in tensors]
    pairs = [compression.compress(t) for t in dense]
    for c, _ in pairs:
        _tensors.check_dtype(c, "grouped_allreduce")
    reqs = _build(request.allreduce, name, len(pairs), op=op, prescale_factor=prescale_factor,
                  postscale_factor=postscale_factor, process_set=process_set,
                  what="grouped_allreduce", grouped=True)
    outs = _allreduce_dense([c for c, _ in pairs], reqs)
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, pairs)]


def reduce_batch(tensors, op, prescale, postscale, process_set, compression=Compression.none,
                 name=None, gradient_scaling=False):
    """Dense tensors allreduced and tf.IndexedSlices allgathered, all in ONE engine
    batch (one py-call in a graph). Not differentiable: for reducing gradients.
    gradient_scaling: the scale factors only split an Average (gradient_predivide_factor),
    so sparse tensors are simply averaged instead of refused."""
    ps = _process_set(process_set)
    plan, inputs, dtypes, shapes, builds = [], [], [], [], []
    for t in tensors:
        if isinstance(t, tf.IndexedSlices):
            _sparse_check(op, *((1.0, 1.0) if gradient_scaling else (prescale, postscale)))
            v = _dense(t.values, "allreduce (IndexedSlices values)")
            i = _dense(t.indices, "allreduce (IndexedSlices indices)")
            for part in (v, i):
                builds.append((request.allgather, dict(ndim=_ndim(part))))
                inputs.append(part)
                dtypes.append(part.dtype)
                shapes.append((None,) + (_shape(part) or (None,))[1:])
            plan.append(("sparse", t, None))
        else:
            d = _dense(t, "allreduce")
            c, ctx = compression.compress(d)
            _tensors.check_dtype(c, "allreduce")
            builds.append((request.allreduce, dict(op=op, prescale_factor=prescale,
                                                   postscale_factor=postscale)))
            inputs.append(c)
            dtypes.append(c.dtype)
            shapes.append(_shape(c))
            plan.append(("dense", t, ctx))
    # Every check has passed: name them now (a group when named, each alone if not).
    namer = _graph.namer()
    names = [None] * len(builds) if name is None else \
        request.member_names(str(name), len(builds))
    items = [_kernels.Item(build(name=n, process_set=ps, namer=namer, **kw))
             for (build, kw), n in zip(builds, names)]
    outs = iter(_run(items, inputs, dtypes, shapes, "allreduce"))
    result = []
    for kind, t, ctx in plan:
        if kind == "dense":
            result.append(compression.decompress(next(outs), ctx))
        else:
            v, i = next(outs), next(outs)
            result.append(_finish_sparse(t, v, i, op, ps))
    return result


# ---------------------------------------------------------------- allgather

def _allgather(tensors, reqs):
    items = [_kernels.Item(r, raw=_raw(t)) for t, r in zip(tensors, reqs)]
    ps = reqs[0].process_set

    def forward(xs):
        return _run(items, xs, [x.dtype for x in xs],
                    [(None,) + (_shape(x) or (None,))[1:] if _shape(x) is not None else None
                     for x in xs], "allgather")

    def backward(xs, ys, dys):
        want = [i for i, x in enumerate(xs) if _differentiable(x.dtype)]
        n = len(want)
        dys = _allreduce_dense([dys[i] for i in want],
                               _build(request.allreduce, None, n, op=Average, process_set=ps,
                                      what="allgather gradient"))
        firsts = [tf.shape(xs[i], out_type=tf.int64)[:1] for i in want]
        sizes = _allgather(firsts, _build(request.allgather, None, n, process_set=ps,
                                          what="allgather gradient"))
        me = reqs[0].index
        out = [None] * len(xs)
        for i, dy, rows in zip(want, dys, sizes):
            start = tf.reduce_sum(rows[:me])
            out[i] = dy[start:start + rows[me]]
        return out
    return _with_gradient(forward, backward, tensors)


@_graph.entry_point
def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Concatenate every rank's tensor on the first dimension (which may differ)."""
    t = _dense(tensor, "allgather", movement=True)
    reqs = _build(request.allgather, name, 1, process_set=process_set, ndim=_ndim(t))
    return _allgather([t], reqs)[0]


@_graph.entry_point
def grouped_allgather(tensors, name=None, ignore_name_scope=False,
                      process_set=global_process_set):
    """Allgather a list of tensors in one engine batch."""
    if not tensors:
        return tensors
    ts = [_dense(t, "grouped_allgather", movement=True) for t in tensors]
    reqs = _build(request.allgather, name, len(ts), process_set=process_set,
                  ndim=[_ndim(t) for t in ts], what="grouped_allgather", grouped=True)
    return _allgather(ts, reqs)


# ---------------------------------------------------------------- broadcast

def _broadcast(tensors, reqs, what="broadcast"):
    items = [_kernels.Item(r, raw=_raw(t)) for t, r in zip(tensors, reqs)]
    r0 = reqs[0]

    def forward(xs):
        return _run(items, xs, [x.dtype for x in xs], [_shape(x) for x in xs], what)

    def backward(xs, ys, dys):
        dys = _allreduce_dense(dys, _build(request.allreduce, None, len(dys), op=Average,
                                           process_set=r0.process_set,
                                           what="broadcast gradient"))
        return dys if r0.is_root else [d * 0 for d in dys]
    return _with_gradient(forward, backward, tensors)


@_graph.entry_point
def broadcast(tensor, root_rank, name=None, ignore_name_scope=False,
              process_set=global_process_set):
    """root_rank's value of tensor, on every rank. root_rank is a global rank, also
    with a process set (as in Horovod)."""
    t = _dense(tensor, "broadcast", movement=True)
    reqs = _build(request.broadcast, name, 1, root_rank, process_set=process_set)
    return _broadcast([t], reqs)[0]


@_graph.entry_point
def grouped_broadcast(tensors, root_rank, name=None, process_set=global_process_set):
    """Broadcast a list of tensors in one engine batch (a horovodlike addition)."""
    if not tensors:
        return tensors
    ts = [_dense(t, "broadcast", movement=True) for t in tensors]
    reqs = _build(request.broadcast, name, len(ts), root_rank, process_set=process_set,
                  what="grouped_broadcast", grouped=True)
    return _broadcast(ts, reqs)


# ----------------------------------------------------------------- alltoall

def _static_splits(splits):
    """splits when they are known now (a list, a numpy array, an eager or constant
    tensor), or None when they only exist when the graph runs."""
    if isinstance(splits, tf.Variable):
        splits = tf.convert_to_tensor(splits)
    if tf.is_tensor(splits):
        if not splits.dtype.is_integer:
            raise TypeError(f"alltoall: splits must be integers, got {splits.dtype.name}")
        return tf.get_static_value(splits)
    return splits


@_graph.entry_point
def alltoall(tensor, splits=None, name=None, ignore_name_scope=False,
             process_set=global_process_set):
    """Send splits[j] rows to member j (even split without splits). Returns the output,
    and the received splits too when splits were given."""
    t = _dense(tensor, "alltoall", movement=True)
    given = splits is not None
    static = _static_splits(splits) if given else None
    runtime = given and static is None
    if runtime:
        splits_t = tf.reshape(tf.cast(splits, tf.int64), [-1])
        req = request.alltoall(None, None, name, process_set, _ndim(t), namer=_graph.namer())
    else:
        splits_t = None
        req = request.alltoall(static, _rows(t), name, process_set, _ndim(t),
                               namer=_graph.namer())
    out, rsplits = _alltoall(t, req, splits_t)
    return (out, rsplits) if given else out


def _alltoall(t, req, splits):
    item = _kernels.Item(req, raw=_raw(t), splits_input=splits is not None)
    shape = _shape(t)
    out_shape = None if shape is None else (None,) + shape[1:]

    def forward(xs):
        inputs = [xs[0]] + ([splits] if splits is not None else [])
        return _run([item], inputs, [xs[0].dtype, tf.int32], [out_shape, (req.set_size,)],
                    "alltoall")

    def backward(xs, ys, dys):
        back = request.alltoall(None, None, None, req.process_set, what="alltoall gradient",
                                namer=_graph.namer())
        return [_alltoall(dys[0], back, tf.cast(ys[1], tf.int64))[0]]
    return _with_gradient(forward, backward, [t])


# ------------------------------------------------------------ reducescatter

def _reducescatter(tensors, reqs):
    items = [_kernels.Item(r) for r in reqs]
    r0 = reqs[0]

    def out_shape(x):
        s = _shape(x)
        if s is None:
            return None
        rows = None if s[0] is None else r0.rows(s[0])
        return (rows,) + s[1:]

    def forward(xs):
        return _run(items, xs, [x.dtype for x in xs], [out_shape(x) for x in xs],
                    "reducescatter")

    def backward(xs, ys, dys):
        if r0.reduce_op == Sum:
            dys = [d * tf.cast(r0.set_size, d.dtype) for d in dys]
        return _allgather(dys, _build(request.allgather, None, len(dys),
                                      process_set=r0.process_set,
                                      what="reducescatter gradient"))
    return _with_gradient(forward, backward, tensors)


@_graph.entry_point
def reducescatter(tensor, device_dense='', compression=Compression.none, op=Average,
                  name=None, process_set=global_process_set, ignore_name_scope=False,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduce over all ranks, then give each rank its share of the first dimension
    (lower ranks take the remainder)."""
    t = _dense(tensor, "reducescatter")
    c, ctx = compression.compress(t)
    reqs = _build(request.reducescatter, name, 1, op=op, prescale_factor=prescale_factor,
                  postscale_factor=postscale_factor, process_set=process_set, ndim=_ndim(c))
    (out,) = _reducescatter([c], reqs)
    return compression.decompress(out, ctx)


@_graph.entry_point
def grouped_reducescatter(tensors, device_dense='', compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0, name=None):
    """Reducescatter a list of tensors in one engine batch."""
    if not tensors:
        return tensors
    pairs = [compression.compress(_dense(t, "grouped_reducescatter")) for t in tensors]
    reqs = _build(request.reducescatter, name, len(pairs), op=op,
                  prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                  process_set=process_set, ndim=[_ndim(c) for c, _ in pairs],
                  what="grouped_reducescatter", grouped=True)
    outs = _reducescatter([c for c, _ in pairs], reqs)
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, pairs)]


# ------------------------------------------------------------ barrier, join

def _scalar(req, what):
    """Run a barrier or join now (eager) or when the graph runs: an int32 scalar."""
    (out,) = _run([_kernels.Item(req)], [], [tf.int32], [()], what)
    return out


@_graph.entry_point
def barrier(process_set=global_process_set):
    """Wait until every rank of the set has reached this point."""
    return _scalar(request.barrier(process_set, namer=_graph.namer()), "barrier")


@_graph.entry_point
def join():
    """This rank is out of data: it contributes zeros to the others' allreduces until
    every rank has joined. Returns the last rank to join (an int32 tensor)."""
    return _scalar(request.join(), "join")


# ------------------------------------------------- topology as tensors

def size_op(process_set_id=0, name=None):
    return tf.constant(process_sets.by_id(process_set_id).size(), tf.int32, name=name)


def rank_op(name=None):
    return tf.constant(basics.rank(), tf.int32, name=name)


def local_size_op(name=None):
    return tf.constant(basics.local_size(), tf.int32, name=name)


def local_rank_op(name=None):
    return tf.constant(basics.local_rank(), tf.int32, name=name)


def process_set_included_op(process_set_id=0, name=None):
    return tf.constant(int(process_sets.by_id(process_set_id).included()), tf.int32,
                       name=name)
