"""Helpers for training scripts: broadcast a model's parameters, an optimizer's state or
any picklable object from one rank, and allgather objects.
"""
import torch

from horovodlike.common import basics, objects, request

from . import _collectives as C
from ._process_sets import global_process_set


# ------------------------------------------------------------------ parameters

def broadcast_parameters(params, root_rank, process_set=global_process_set):
    """Copy root_rank's parameters into every rank's, in place.

    params: model.state_dict(), model.named_parameters(), model.parameters(), or a dict /
    list of tensors or (name, tensor) pairs. Named entries are broadcast under their
    names (sorted for a dict), so every rank must pass the same names.
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, (list, tuple)) or hasattr(params, "__iter__") \
            and not isinstance(params, torch.Tensor):
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError(f"invalid params of type: {type(params).__name__}; pass a "
                         f"state_dict, named_parameters() or a list of tensors")
    for name, p in items:
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"broadcast_parameters: entry {name!r} is a "
                            f"{type(p).__name__}, not a tensor; broadcast it with "
                            f"broadcast_object()")
    handles = []
    try:
        for name, p in items:
            handles.append(C.broadcast_async_(p, root_rank, name=name, process_set=process_set))
    finally:
        request.wait_all(handles, C.synchronize)


# ------------------------------------------------------------------ optimizer state

def _base_step(optimizer):
    """The wrapped optimizer's own step(), never DistributedOptimizer's (which would
    allreduce and needs every rank)."""
    return getattr(optimizer, "_local_step", optimizer.step)


def _sparse_params(model):
    """Parameters of `model`'s sparse embeddings (their gradients are sparse)."""
    if model is None:
        return set()
    return {id(p) for m in model.modules()
            if isinstance(m, torch.nn.Embedding) and m.sparse for p in m.parameters()}


def _zero_grad_like(p, optimizer, sparse):
    if isinstance(optimizer, torch.optim.SparseAdam) or id(p) in sparse:
        return torch.sparse_coo_tensor(torch.empty((p.dim(), 0), dtype=torch.int64),
                                       torch.empty((0,) + tuple(p.shape[p.dim():]),
                                                   dtype=p.dtype), p.shape,
                                       check_invariants=False)
    return torch.zeros_like(p)


def _initialize_state(optimizer, sparse):
    """Create the state a fresh optimizer would have after its first step, as Horovod
    does, by stepping once with zero gradients. Parameter values are restored afterwards,
    so weight decay and the like leave no trace; gradients a parameter had are restored,
    and one that had none keeps the zero gradient, as in Horovod."""
    params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    saved = [(p, p.detach().clone(), p.grad) for p in params]
    try:
        for p in params:
            p.grad = _zero_grad_like(p, optimizer, sparse)
        step = _base_step(optimizer)
        step(lambda: torch.zeros(()))
    finally:
        with torch.no_grad():
            for p, value, grad in saved:
                p.copy_(value)
                if grad is not None:
                    p.grad = grad


def _skeleton(value, tensors):
    """The structure of a state_dict with every tensor replaced by a placeholder (its
    index in `tensors`, shape, dtype and whether it is on a GPU); non-tensor leaves stay
    as they are."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return _TensorSlot(len(tensors) - 1, tuple(value.shape), value.dtype,
                           value.device.type == "cuda")
    if isinstance(value, dict):
        return {k: _skeleton(v, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_skeleton(v, tensors) for v in value)
    return value


class _TensorSlot:
    __slots__ = ("index", "shape", "dtype", "cuda")

    def __init__(self, index, shape, dtype, cuda=False):
        self.index, self.shape, self.dtype, self.cuda = index, shape, dtype, cuda

    def __reduce__(self):
        return (_TensorSlot, (self.index, self.shape, self.dtype, self.cuda))


def _receiving_device(slot, optimizer):
    """Where a non-root rank receives a state tensor: on a GPU when the root's is (a CUDA
    tensor is staged in pieces, named apart from a CPU tensor's op), on the GPU of the
    optimizer's first CUDA parameter, else the current one."""
    if not slot.cuda:
        return torch.device("cpu")
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.device.type == "cuda":
                return p.device
    return torch.device("cuda", torch.cuda.current_device())


def _fill(value, tensors):
    if isinstance(value, _TensorSlot):
        return tensors[value.index]
    if isinstance(value, dict):
        return {k: _fill(v, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_fill(v, tensors) for v in value)
    return value


def broadcast_optimizer_state(optimizer, root_rank, model=None,
                              process_set=global_process_set):
    """Make every rank's optimizer state (per-parameter state, scalars and tensors, and
    the param-group options such as lr) equal to root_rank's.

    A fresh optimizer gets its state created first, as in Horovod, by a step with zero
    gradients (sparse ones for SparseAdam, and for the sparse embeddings of `model`, as
    Horovod's model= argument says); parameters that had no gradient keep the zeros.
    Works for every torch.optim optimizer, LBFGS included: the state's structure and
    scalars travel pickled, its tensors by in-place broadcast.
    """
    if model is not None and not isinstance(model, torch.nn.Module):
        raise TypeError(f"broadcast_optimizer_state: model must be a torch.nn.Module, got "
                        f"{type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"broadcast_optimizer_state expects a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    from .sharded import ShardedDistributedOptimizer
    if isinstance(optimizer, ShardedDistributedOptimizer):   # each rank holds a shard
        return optimizer.broadcast_state(root_rank)
    is_root = basics.rank() == root_rank
    if not optimizer.state:
        # Every rank, as in Horovod (each is left with zero gradients); the others then
        # take root's state.
        _initialize_state(optimizer, _sparse_params(model))
    tensors = []
    skeleton = _skeleton(optimizer.state_dict(), tensors) if is_root else None
    skeleton = broadcast_object(skeleton, root_rank, name="broadcast_optimizer_state",
                                process_set=process_set)
    if not is_root:
        tensors = []
        _collect_slots(skeleton, tensors)
        tensors = [torch.empty(s.shape, dtype=s.dtype, device=_receiving_device(s, optimizer))
                   for s in sorted(tensors, key=lambda s: s.index)]
    broadcast_parameters([(f"optimizer_state.{i}", t) for i, t in enumerate(tensors)],
                         root_rank, process_set=process_set)
    if not is_root:
        optimizer.load_state_dict(_fill(skeleton, tensors))


def _collect_slots(value, out):
    if isinstance(value, _TensorSlot):
        out.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            _collect_slots(v, out)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _collect_slots(v, out)


# ------------------------------------------------------------------ objects

def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Pickle `obj` on root_rank and return it on every rank (root's object on root).
    root_rank is a global rank, also with a process set.

    name: optional; ranks must agree on it. The default is the same on every rank, so
    ranks may pass different placeholder objects (e.g. None) where root passes data.
    """
    return objects.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj, name=None, process_set=global_process_set):
    """Pickle `obj` on every rank; return the list of every rank's object, in rank
    order (of the process set)."""
    return objects.allgather_object(obj, name, process_set)
