"""The differentiable collectives: allreduce, allgather, broadcast, alltoall,
reducescatter and their grouped forms, each a torch.autograd.Function whose backward is
the collective Horovod defines for it:

    allreduce(op)            backward: allreduce of the gradient with the same op and scales
    allgather                backward: Average-allreduce of the gradient, then this
                                       rank's rows
    broadcast(root)          backward: Average-allreduce of the gradient on the root,
                                       zeros elsewhere
    alltoall(splits)         backward: alltoall of the gradient with the received splits
    reducescatter(op)        backward: allgather of the gradient, times the set size for
                                       Sum, times prescale * postscale

Gradients flow only where the input requires them; integer and bool tensors simply go
through without a graph.
"""
import torch

from horovodlike.common import ops as _ops

from . import _collectives as C
from . import _tensors
from ._process_sets import global_process_set, member_index, resolve
from .compression import Compression


def _compressed(tensors, compression):
    pairs = [compression.compress(t) for t in tensors]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _now(start, *args, **kwargs):
    """start(...), an *_async op, then wait for it: the engine is told this thread waits
    at once, so on one node the thread starts the op itself (common/ops.py, waiting)."""
    with _ops.waiting:
        handle = start(*args, **kwargs)
    return C.synchronize(handle)


# ------------------------------------------------------------------ allreduce

class HorovodAllreduce(torch.autograd.Function):
    """allreduce as an autograd function."""

    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):
        ctx.op, ctx.process_set = op, process_set
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        return _now(C.allreduce_async, tensor, name=name, op=op, prescale_factor=prescale_factor,
                    postscale_factor=postscale_factor, process_set=process_set)

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output, op=ctx.op, prescale_factor=ctx.prescale_factor,
                         postscale_factor=ctx.postscale_factor, process_set=ctx.process_set)
        return grad, None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Reduce `tensor` over all ranks (Average unless op= says otherwise) and return the
    result as a new tensor; differentiable. `compression` is applied around the transfer."""
    op = C.reduce_op(op, average, "allreduce")
    if (type(tensor) is torch.Tensor and compression is Compression.none
            and not (tensor.requires_grad and torch.is_grad_enabled())):
        # No graph to record: the autograd Function (some 5 us of a 4 KiB op) would
        # return the same tensor. _allreduce makes every other check made below.
        return C._allreduce(tensor, False, None, name, op, prescale_factor,
                            postscale_factor, process_set, "allreduce", now=True)
    _tensors.check_tensor(tensor, "allreduce", staged=True)
    compressed, ctx = compression.compress(tensor)
    reduced = HorovodAllreduce.apply(compressed, name, op, prescale_factor, postscale_factor,
                                     process_set)
    return compression.decompress(reduced, ctx)


class HorovodGroupedAllreduce(torch.autograd.Function):
    """grouped_allreduce as an autograd function."""

    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.op, ctx.process_set = op, process_set
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        return tuple(_now(C.grouped_allreduce_async, list(tensors), name=name, op=op,
                          prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                          process_set=process_set))

    @staticmethod
    def backward(ctx, *grad_outputs):
        grads = grouped_allreduce(list(grad_outputs), op=ctx.op,
                                  prescale_factor=ctx.prescale_factor,
                                  postscale_factor=ctx.postscale_factor,
                                  process_set=ctx.process_set)
        return (None, None, None, None, None, *grads)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none,
                      op=None, prescale_factor=1.0, postscale_factor=1.0,
                      process_set=global_process_set):
    """allreduce of a list of tensors as one group; returns a list; differentiable."""
    op = C.reduce_op(op, average, "grouped_allreduce")
    tensors = C._tensor_list(tensors, "grouped_allreduce")
    for t in tensors:
        _tensors.check_tensor(t, "grouped_allreduce", staged=True)
    compressed, ctxs = _compressed(tensors, compression)
    reduced = HorovodGroupedAllreduce.apply(name, op, prescale_factor, postscale_factor,
                                            process_set, *compressed)
    return [compression.decompress(t, c) for t, c in zip(reduced, ctxs)]


# ------------------------------------------------------------------ allgather

def _my_rows(grad, first_dims, process_set):
    """This rank's block of a gradient concatenated over the set."""
    idx = member_index(process_set, "allgather backward")
    offset = int(first_dims[:idx].sum()) if idx else 0
    return grad.narrow(0, offset, int(first_dims[idx]))


class HorovodAllgather(torch.autograd.Function):
    """allgather as an autograd function."""

    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.dim, ctx.process_set = int(tensor.shape[0]) if tensor.dim() else 0, process_set
        return _now(C.allgather_async, tensor, name=name, process_set=process_set)

    @staticmethod
    def backward(ctx, grad_output):
        ps, _ = resolve(ctx.process_set)
        grad = allreduce(grad_output, op=C.Average, process_set=ps)
        dims = allgather(torch.tensor([ctx.dim], dtype=torch.int64), process_set=ps)
        return _my_rows(grad, dims, ps), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenate every rank's `tensor` along the first dimension; differentiable."""
    _tensors.check_tensor(tensor, "allgather", staged=True)
    return HorovodAllgather.apply(tensor, name, process_set)


class HorovodGroupedAllgather(torch.autograd.Function):
    """grouped_allgather as an autograd function."""

    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.dims = [int(t.shape[0]) if t.dim() else 0 for t in tensors]
        ctx.process_set = process_set
        return tuple(_now(C.grouped_allgather_async, list(tensors), name=name,
                          process_set=process_set))

    @staticmethod
    def backward(ctx, *grad_outputs):
        ps, _ = resolve(ctx.process_set)
        grads = grouped_allreduce(list(grad_outputs), op=C.Average, process_set=ps)
        dims = allgather(torch.tensor([ctx.dims], dtype=torch.int64), process_set=ps)
        return (None, None, *[_my_rows(g, dims[:, k], ps) for k, g in enumerate(grads)])


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """allgather of a list of tensors as one group; returns a list; differentiable."""
    tensors = C._tensor_list(tensors, "grouped_allgather")
    for t in tensors:
        _tensors.check_tensor(t, "grouped_allgather", staged=True)
    return list(HorovodGroupedAllgather.apply(name, process_set, *tensors))


# ------------------------------------------------------------------ broadcast

class HorovodBroadcast(torch.autograd.Function):
    """broadcast as an autograd function."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return _now(C.broadcast_async, tensor, root_rank, name=name,
                    process_set=process_set)

    @staticmethod
    def backward(ctx, grad_output):
        from horovodlike.common import basics
        grad = allreduce(grad_output, op=C.Average, process_set=ctx.process_set)
        if basics.rank() != ctx.root_rank:
            grad = grad * 0
        return grad, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Return root_rank's `tensor` on every rank (a new tensor); differentiable."""
    _tensors.check_tensor(tensor, "broadcast", staged=True)
    return HorovodBroadcast.apply(tensor, root_rank, name, process_set)


# ------------------------------------------------------------------ alltoall

class HorovodAlltoall(torch.autograd.Function):
    """alltoall as an autograd function."""

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received = _now(C.alltoall_async, tensor, splits, name=name,
                                process_set=process_set)
        ctx.process_set, ctx.received = process_set, received
        if splits is None:
            return output
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, *unused):
        grad, _ = alltoall(grad_output, splits=ctx.received, process_set=ctx.process_set)
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Send splits[j] rows of `tensor` to the j-th rank of the set (evenly without
    splits) and return what was received: the output alone when splits is None, else
    (output, received_splits); differentiable."""
    _tensors.check_tensor(tensor, "alltoall", staged=True)
    return HorovodAlltoall.apply(tensor, splits, name, process_set)


# ------------------------------------------------------------------ reducescatter

def _reducescatter_grad(grad, op, prescale, postscale, process_set):
    ps, _ = resolve(process_set)
    if op == C.Sum:
        grad = grad * ps.size()
    if prescale * postscale != 1.0:
        grad = grad * (prescale * postscale)
    return grad


class HorovodReducescatter(torch.autograd.Function):
    """reducescatter as an autograd function."""

    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.op, ctx.process_set = op, process_set
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        return _now(C.reducescatter_async, tensor, name=name, op=op, process_set=process_set,
                    prescale_factor=prescale_factor, postscale_factor=postscale_factor)

    @staticmethod
    def backward(ctx, grad_output):
        grad = allgather(grad_output, process_set=ctx.process_set)
        grad = _reducescatter_grad(grad, ctx.op, ctx.prescale_factor, ctx.postscale_factor,
                                   ctx.process_set)
        return grad, None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=C.Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reduce `tensor` over the ranks (Average or Sum) and return this rank's share of
    the first dimension (lower ranks get the remainder rows); differentiable."""
    op = C.reduce_op(op, None, "reducescatter")
    _tensors.check_tensor(tensor, "reducescatter", staged=True)
    compressed, ctx = compression.compress(tensor)
    out = HorovodReducescatter.apply(compressed, name, op, process_set, prescale_factor,
                                     postscale_factor)
    return compression.decompress(out, ctx)


class HorovodGroupedReducescatter(torch.autograd.Function):
    """grouped_reducescatter as an autograd function."""

    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        ctx.op, ctx.process_set = op, process_set
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        return tuple(_now(C.grouped_reducescatter_async, list(tensors), name=name, op=op,
                          process_set=process_set, prescale_factor=prescale_factor,
                          postscale_factor=postscale_factor))

    @staticmethod
    def backward(ctx, *grad_outputs):
        grads = grouped_allgather(list(grad_outputs), process_set=ctx.process_set)
        grads = [_reducescatter_grad(g, ctx.op, ctx.prescale_factor, ctx.postscale_factor,
                                     ctx.process_set) for g in grads]
        return (None, None, None, None, None, *grads)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=C.Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """reducescatter of a list of tensors as one group; returns a list; differentiable."""
    op = C.reduce_op(op, None, "grouped_reducescatter")
    tensors = C._tensor_list(tensors, "grouped_reducescatter")
    for t in tensors:
        _tensors.check_tensor(t, "grouped_reducescatter", staged=True)
    compressed, ctxs = _compressed(tensors, compression)
    outs = HorovodGroupedReducescatter.apply(name, op, process_set, prescale_factor,
                                             postscale_factor, *compressed)
    return [compression.decompress(t, c) for t, c in zip(outs, ctxs)]
