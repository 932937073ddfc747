"""Megatron's conjugate collectives over a tensor-parallel process set.

A tensor-parallel layer pair splits one matrix product across the t ranks of a set: a
column-parallel layer gives each rank out/t of the outputs, a row-parallel layer takes
those and produces partial sums that one allreduce completes. Every rank of the set
holds the same (replicated) activations outside the pair, so the gradients there must
be the same on every rank too. Two autograd functions make that so (Megatron's f and g):

    copy_to_tp       f   forward: identity           backward: allreduce(Sum) of the grad
    reduce_from_tp   g   forward: allreduce(Sum)     backward: identity
    gather_from_tp       forward: allgather (a dim)  backward: this rank's slice
    scatter_to_tp        forward: this rank's slice  backward: allgather (a dim)

Horovod's own differentiable allreduce (torch/_autograd.py) is data-parallel calculus:
each rank's loss differs and the backward allreduces again. Here the loss is replicated,
so g's backward is the identity; f and g are therefore functions of their own, built on
the same engine ops (_collectives, waited at once through _autograd._now).

Cost: one allreduce of the activation per f or g, b·s·h elements for a transformer's
hidden state, so a block (attention + MLP) pays 2 allreduces forward and 2 backward. On
a set of one rank every function is the identity and no collective runs.
"""
import torch

from .. import _collectives as C
from .._autograd import _now
from .._process_sets import member_index, resolve


def set_size(process_set):
    return resolve(process_set)[0].size()


def set_rank(process_set, what="tensor parallelism"):
    return member_index(resolve(process_set)[0], what)


def allreduce_sum(x, process_set):
    """Sum of x over the set (a new tensor); no graph."""
    return _now(C.allreduce_async, x.contiguous(), op=C.Sum, process_set=process_set)


def allreduce_max(x, process_set):
    return _now(C.allreduce_async, x.contiguous(), op=C.Max, process_set=process_set)


def allgather_dim(x, dim, process_set):
    """Every rank's x concatenated along `dim` (set order); no graph."""
    dim = dim % x.dim()
    if dim == 0:
        return _now(C.allgather_async, x.contiguous(), process_set=process_set)
    moved = x.movedim(dim, 0).contiguous()
    out = _now(C.allgather_async, moved, process_set=process_set)
    return out.movedim(0, dim).contiguous()


def my_slice(x, dim, process_set):
    n = set_size(process_set)
    if x.shape[dim] % n:
        raise ValueError(f"tensor parallelism: dimension {dim} of size {x.shape[dim]} is "
                         f"not divisible by the tensor-parallel size {n}")
    return x.chunk(n, dim)[set_rank(process_set)].contiguous()


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, process_set):
        ctx.process_set = process_set
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return allreduce_sum(grad, ctx.process_set), None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, process_set):
        return allreduce_sum(x, process_set)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, process_set):
        ctx.dim, ctx.process_set = dim, process_set
        return allgather_dim(x, dim, process_set)

    @staticmethod
    def backward(ctx, grad):
        return my_slice(grad, ctx.dim, ctx.process_set), None, None


class _ScatterToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, process_set):
        ctx.dim, ctx.process_set = dim, process_set
        return my_slice(x, dim, process_set)

    @staticmethod
    def backward(ctx, grad):
        return allgather_dim(grad, ctx.dim, ctx.process_set), None, None


def copy_to_tp(x, process_set):
    """f: identity forward, gradient summed over the set backward."""
    return x if set_size(process_set) == 1 else _CopyToTP.apply(x, process_set)


def reduce_from_tp(x, process_set):
    """g: sum over the set forward, identity backward."""
    return x if set_size(process_set) == 1 else _ReduceFromTP.apply(x, process_set)


def gather_from_tp(x, process_set, dim=-1):
    """Concatenate the set's slices along dim; backward keeps this rank's slice."""
    return x if set_size(process_set) == 1 else _GatherFromTP.apply(x, dim, process_set)


def scatter_to_tp(x, process_set, dim=-1):
    """This rank's slice along dim; backward gathers the gradient."""
    return x if set_size(process_set) == 1 else _ScatterToTP.apply(x, dim, process_set)
