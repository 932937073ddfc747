"""Asynchronous collectives on torch tensors, and the handles they return.

Every `*_async` function checks its arguments, hands the engine the addresses of
contiguous CPU buffers (no copy when the tensor already is one) and returns at once with
an integer handle; `poll(handle)` says whether the engine has finished, and
`synchronize(handle)` waits and returns the output. The tensors involved are kept alive
by horovodlike.common.ops until then.

In-place variants (trailing underscore) write into the caller's tensor; a non-contiguous
tensor is reduced in a contiguous copy that is copied back at synchronize().

Grouped ops submit one engine request per tensor and return one handle for the group: a
negative integer, so it can never collide with an engine handle.
"""
import itertools
import threading

import torch

from horovodlike.common import engine
from horovodlike.common import ops as _ops

from . import _tensors
from ._process_sets import global_process_set, member_index, resolve, root_index

Average, Sum, Adasum, Min, Max, Product = (_ops.Average, _ops.Sum, _ops.Adasum, _ops.Min,
                                           _ops.Max, _ops.Product)
_OP_NAMES = {Average: "Average", Sum: "Sum", Min: "Min", Max: "Max", Product: "Product",
             Adasum: "Adasum"}

_groups = {}                 # negative handle -> list of member handles
_group_ids = itertools.count(1)
_group_lock = threading.Lock()
_set_counters = {}           # (kind, set id, ranks) -> next unnamed op number in that set


# ------------------------------------------------------------------ arguments

def reduce_op(op, average=None, what="allreduce"):
    """Resolve Horovod's op=/average= pair into an engine reduce op."""
    op = _ops.resolve_op(op, average, what)
    if op == Adasum:
        raise NotImplementedError(f"{what}: op=hvd.Adasum is not implemented in horovodlike; "
                                  f"use op=hvd.Average (the default) or op=hvd.Sum")
    if op not in _OP_NAMES:
        raise ValueError(f"{what}: unknown reduction op {op!r}; use one of hvd.Average, "
                         f"hvd.Sum, hvd.Min, hvd.Max, hvd.Product")
    return op


def _scale(value, what, which):
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{what}: {which} must be a number, got {value!r}") from None


def _tensor_list(tensors, what):
    if isinstance(tensors, torch.Tensor) or not hasattr(tensors, "__iter__"):
        raise TypeError(f"{what} expects a list of tensors, got {type(tensors).__name__}")
    tensors = list(tensors)
    if not tensors:
        raise ValueError(f"{what} needs at least one tensor")
    return tensors


def _member_name(base, i):
    return f"{base}.{i}"


def op_name(kind, name, process_set=None):
    """The engine name of an op (common.ops.op_name: Horovod's naming, unnamed ops
    numbered per process set; names are scoped per set when submitted)."""
    _, sid = resolve(process_set)
    return _ops.op_name(kind, name, sid)


# ------------------------------------------------------------------ handles

def _new_group(handles):
    with _group_lock:
        gid = -next(_group_ids)
        _groups[gid] = list(handles)
    return gid


def _submit_group(kind, name, process_set, tensors, submit_one):
    """Submit one request per tensor and return one handle for all of them. If a member
    is refused, the error is raised at once; members already queued stay alive in the
    engine (their buffers are kept) and complete when the other ranks submit them."""
    base = op_name(kind, name, process_set)
    handles = [submit_one(t, _member_name(base, i)) for i, t in enumerate(tensors)]
    return _new_group(handles)


def poll(handle):
    """True once the operation behind `handle` has finished; never blocks."""
    if callable(handle):
        return all(poll(h) for h in getattr(handle, "handles", ()))
    if isinstance(handle, int) and handle < 0:
        members = _groups.get(handle)
        if members is None:
            raise ValueError(f"unknown or already synchronized handle {handle}")
        return all(_ops.poll(h) for h in members)
    return _ops.poll(handle)


def synchronize(handle):
    """Wait for the operation behind `handle` and return its output (a tensor, a list of
    tensors for grouped ops, (output, received_splits) for alltoall_async); raises the
    operation's error if it failed."""
    if callable(handle):
        return handle()
    if isinstance(handle, int) and handle < 0:
        with _group_lock:
            members = _groups.pop(handle, None)
        if members is None:
            raise ValueError(f"unknown or already synchronized handle {handle}")
        outputs, error = [], None
        for h in members:
            try:
                outputs.append(_ops.synchronize(h))
            except Exception as e:  # noqa: BLE001 - wait for every member, then raise
                error = error or e
        if error is not None:
            raise error
        return outputs
    return _ops.synchronize(handle)


# ------------------------------------------------------------------ allreduce

def _same_shape_op(tensor, inplace, what, **request):
    """Submit an op whose output has the input's shape: in place (written back into the
    caller's tensor, even a non-contiguous one) or into a new tensor."""
    code = _tensors.check_tensor(tensor, what)
    buf = _tensors.contiguous(tensor)
    out = buf if inplace else torch.empty_like(buf)

    def finish(_):
        return _tensors.write_back(tensor, buf) if inplace else out
    return _ops.submit((tensor, buf, out), finish, dtype=code, shape=tuple(buf.shape),
                       input_ptr=buf.data_ptr(), output_ptr=out.data_ptr(), **request)


def _allreduce_one(tensor, output_same, name, op, prescale, postscale, sid, what):
    return _same_shape_op(tensor, output_same, what, op=engine.ALLREDUCE, name=name,
                          reduce_op=op, prescale=prescale, postscale=postscale,
                          process_set=sid)


def _allreduce_args(average, op, prescale_factor, postscale_factor, process_set, what):
    op = reduce_op(op, average, what)
    _, sid = resolve(process_set)
    return (op, _scale(prescale_factor, what, "prescale_factor"),
            _scale(postscale_factor, what, "postscale_factor"), sid)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Start reducing `tensor` over the ranks (Average by default) into a new tensor;
    the input is not modified. Returns a handle for poll()/synchronize()."""
    op, pre, post, sid = _allreduce_args(average, op, prescale_factor, postscale_factor,
                                         process_set, "allreduce")
    return _allreduce_one(tensor, False, op_name("allreduce", name, process_set), op, pre,
                          post, sid, "allreduce")


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """In-place allreduce_async: the result is written into `tensor`."""
    op, pre, post, sid = _allreduce_args(average, op, prescale_factor, postscale_factor,
                                         process_set, "allreduce_")
    return _allreduce_one(tensor, True, op_name("allreduce", name, process_set), op, pre,
                          post, sid, "allreduce_")


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """In-place allreduce; returns `tensor`."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


def _grouped_allreduce(tensors, inplace, average, name, op, prescale_factor,
                       postscale_factor, process_set, what):
    tensors = _tensor_list(tensors, what)
    op, pre, post, sid = _allreduce_args(average, op, prescale_factor, postscale_factor,
                                         process_set, what)
    for t in tensors:
        _tensors.check_tensor(t, what)
    return _submit_group("grouped_allreduce", name, process_set, tensors,
                         lambda t, n: _allreduce_one(t, inplace, n, op, pre, post, sid, what))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    """Start allreducing a list of tensors as one group; synchronize() returns a list."""
    return _grouped_allreduce(tensors, False, average, name, op, prescale_factor,
                              postscale_factor, process_set, "grouped_allreduce")


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    """In-place grouped_allreduce_async."""
    return _grouped_allreduce(tensors, True, average, name, op, prescale_factor,
                              postscale_factor, process_set, "grouped_allreduce_")


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    """In-place grouped allreduce; returns the list of (updated) tensors."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Reduce a sparse COO tensor by allgathering its indices and values (Horovod's
    method); returns a callable handle that synchronize() (or calling it) resolves into
    the reduced sparse tensor. Duplicate indices add up, so Average and Sum are the
    only ops."""
    op = reduce_op(op, None, "sparse_allreduce")
    if op not in (Average, Sum):
        raise ValueError("sparse_allreduce supports op=hvd.Average or op=hvd.Sum only")
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise TypeError("sparse_allreduce_async expects a sparse COO tensor")
    ps, _ = resolve(process_set)
    t = tensor.coalesce()
    base = name if name is not None else op_name("sparse_allreduce", None, process_set)
    indices_handle = allgather_async(t.indices().t().contiguous(), name=f"{base}.indices",
                                     process_set=process_set)
    values_handle = allgather_async(t.values().contiguous(), name=f"{base}.values",
                                    process_set=process_set)

    def handle():
        values = synchronize(values_handle)
        indices = synchronize(indices_handle)
        if op == Average:
            values = values / ps.size()
        return torch.sparse_coo_tensor(indices.t(), values, t.size(),
                                       check_invariants=False).coalesce()

    handle.handles = (indices_handle, values_handle)
    return handle


# ------------------------------------------------------------------ allgather

def _allgather_one(tensor, name, sid, what):
    code = _tensors.check_tensor(tensor, what)
    if tensor.dim() == 0:
        raise ValueError(f"{what} needs a tensor with at least one dimension to "
                         f"concatenate on; got a scalar (use tensor.reshape(1))")
    buf = _tensors.contiguous(tensor)
    dtype, tail = buf.dtype, tuple(buf.shape[1:])
    return _ops.submit((tensor, buf), lambda res: _tensors.from_engine(res, dtype, tail),
                       op=engine.ALLGATHER, name=name, dtype=code, shape=tuple(buf.shape),
                       input_ptr=buf.data_ptr(), process_set=sid)


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Start concatenating every rank's `tensor` along the first dimension (which may
    differ between ranks). Returns a handle."""
    _, sid = resolve(process_set)
    return _allgather_one(tensor, op_name("allgather", name, process_set), sid, "allgather")


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Start allgathering a list of tensors as one group; synchronize() returns a list."""
    tensors = _tensor_list(tensors, "grouped_allgather")
    _, sid = resolve(process_set)
    return _submit_group("grouped_allgather", name, process_set, tensors,
                         lambda t, n: _allgather_one(t, n, sid, "grouped_allgather"))


# ------------------------------------------------------------------ broadcast

def _broadcast_one(tensor, root_rank, inplace, name, process_set, what):
    ps, sid = resolve(process_set)
    _tensors.check_tensor(tensor, what)
    root = root_index(ps, root_rank, what)
    return _same_shape_op(tensor, inplace, what, op=engine.BROADCAST, name=name,
                          root_rank=root, process_set=sid)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Start copying root_rank's `tensor` to every rank, into a new tensor. root_rank is
    a global rank (also with a process set, as in Horovod)."""
    return _broadcast_one(tensor, root_rank, False, op_name("broadcast", name, process_set),
                          process_set, "broadcast")


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """In-place broadcast_async: root_rank's values are written into `tensor`."""
    return _broadcast_one(tensor, root_rank, True, op_name("broadcast", name, process_set),
                          process_set, "broadcast_")


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """In-place broadcast; returns `tensor`."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# ------------------------------------------------------------------ alltoall

def _splits_list(splits, rows, n, what):
    if isinstance(splits, torch.Tensor):
        if splits.is_floating_point() or splits.is_complex() or splits.dtype == torch.bool:
            raise TypeError(f"{what}: splits must hold integers, got {splits.dtype}")
        values = splits.detach().cpu().reshape(-1).tolist()
    else:
        try:
            values = list(splits)
        except TypeError:
            raise TypeError(f"{what}: splits must be a list or tensor of integers, got "
                            f"{type(splits).__name__}") from None
    out = []
    for v in values:
        if isinstance(v, bool) or isinstance(v, float) or not hasattr(v, "__index__"):
            raise TypeError(f"{what}: splits must be integers, got {v!r}")
        out.append(int(v))
    if len(out) != n:
        raise ValueError(f"{what}: {len(out)} splits given for a process set of {n} ranks; "
                         f"give one split per rank")
    if any(v < 0 for v in out):
        raise ValueError(f"{what}: splits must not be negative, got {out}")
    if sum(out) != rows:
        raise ValueError(f"{what}: splits add up to {sum(out)} rows but the tensor's first "
                         f"dimension is {rows}")
    return out


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Start sending splits[j] rows of `tensor` (first dimension) to the j-th rank of the
    set and receiving theirs. Without splits, the rows are split evenly. synchronize()
    returns (output, received_splits) — an int32 tensor of rows from each rank."""
    what = "alltoall"
    ps, sid = resolve(process_set)
    code = _tensors.check_tensor(tensor, what)
    if tensor.dim() == 0:
        raise ValueError(f"{what} needs a tensor with at least one dimension to split on")
    member_index(ps, what)
    n, rows = ps.size(), int(tensor.shape[0])
    if splits is None:
        if rows % n:
            raise ValueError(f"{what}: the first dimension ({rows}) cannot be split evenly "
                             f"over {n} ranks; pass splits=")
        split_list = [rows // n] * n
    else:
        split_list = _splits_list(splits, rows, n, what)
    buf = _tensors.contiguous(tensor)
    dtype, tail = buf.dtype, tuple(buf.shape[1:])

    def finish(res):
        out = _tensors.from_engine(res, dtype, tail)
        received = res.recv_splits if res.recv_splits is not None else []
        return out, torch.tensor(received, dtype=torch.int32)

    return _ops.submit((tensor, buf), finish, op=engine.ALLTOALL,
                       name=op_name(what, name, process_set), dtype=code, shape=tuple(buf.shape),
                       input_ptr=buf.data_ptr(), splits=split_list, process_set=sid)


# ------------------------------------------------------------------ reducescatter

def _reducescatter_one(tensor, name, op, pre, post, ps, sid, what):
    code = _tensors.check_tensor(tensor, what)
    if tensor.dim() == 0:
        raise ValueError(f"{what} needs a tensor with at least one dimension to scatter on")
    n, i = ps.size(), member_index(ps, what)
    rows = int(tensor.shape[0])
    mine = rows // n + (1 if i < rows % n else 0)
    buf = _tensors.contiguous(tensor)
    out = _tensors.empty_rows(buf, mine)
    return _ops.submit((tensor, buf, out), lambda _: out, op=engine.REDUCESCATTER, name=name,
                       dtype=code, shape=tuple(buf.shape), input_ptr=buf.data_ptr(),
                       output_ptr=_tensors.address(out), reduce_op=op, prescale=pre,
                       postscale=post, process_set=sid)


def _reducescatter_args(op, prescale_factor, postscale_factor, process_set, what):
    op = reduce_op(op, None, what)
    if op not in (Average, Sum):
        raise ValueError(f"{what} supports op=hvd.Average and op=hvd.Sum only, "
                         f"got hvd.{_OP_NAMES[op]}")
    ps, sid = resolve(process_set)
    return (op, _scale(prescale_factor, what, "prescale_factor"),
            _scale(postscale_factor, what, "postscale_factor"), ps, sid)


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Start reducing `tensor` over the ranks and scattering the result along the first
    dimension: rank i of n gets rows // n rows, plus one if i < rows % n."""
    op, pre, post, ps, sid = _reducescatter_args(op, prescale_factor, postscale_factor,
                                                 process_set, "reducescatter")
    return _reducescatter_one(tensor, op_name("reducescatter", name, process_set), op, pre,
                              post, ps, sid, "reducescatter")


def grouped_reducescatter_async(tensors, name=None, op=Average,
                                process_set=global_process_set, prescale_factor=1.0,
                                postscale_factor=1.0):
    """Start reducescattering a list of tensors as one group; synchronize() returns a
    list."""
    what = "grouped_reducescatter"
    tensors = _tensor_list(tensors, what)
    op, pre, post, ps, sid = _reducescatter_args(op, prescale_factor, postscale_factor,
                                                 process_set, what)
    for t in tensors:
        _tensors.check_tensor(t, what)
    return _submit_group("grouped_reducescatter", name, process_set, tensors,
                         lambda t, n: _reducescatter_one(t, n, op, pre, post, ps, sid, what))


# ------------------------------------------------------------------ the rest

def barrier(process_set=global_process_set):
    """Block until every rank of the set has called barrier()."""
    _, sid = resolve(process_set)
    synchronize(_ops.submit((), lambda _: None, op=engine.BARRIER,
                            name=op_name("barrier", None, process_set), process_set=sid))


def join(device=-1):
    """Say this rank has no more data: until every rank has joined, it takes part in the
    other ranks' allreduces with zeros. Blocks until all have joined; returns the rank
    that joined last. `device` is accepted for Horovod compatibility (CPU only)."""
    join_fn = getattr(_ops, "join", None)
    if join_fn is None:
        raise NotImplementedError("join() needs engine support that this build of "
                                  "horovodlike does not have")
    return int(join_fn())
