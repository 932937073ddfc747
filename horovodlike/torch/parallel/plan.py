"""Applying tensor parallelism to a model you already have.

    model = hvd.parallel.tensor_parallel(model, hvd.parallel.GPT_BLOCK_PLAN,
                                         process_set=topo.tp_set)

A plan maps glob patterns over qualified module names (fnmatch, anchored, `*` also
crosses dots: "blocks.*.attn.qkv", "*mlp.fc1") to what the matched module becomes:

    "column"  or Column(gather_output=False, fused=1)   nn.Linear -> ColumnParallelLinear
    "row"     or Row(input_is_parallel=True)            nn.Linear -> RowParallelLinear
    "vocab"   or Vocab()                                nn.Embedding -> VocabParallelEmbedding
    "attention" or Attention()                          nn.MultiheadAttention ->
                                                        ParallelMultiheadAttention
    Heads("n_head")                                     any module: its head-count
                                                        attribute becomes heads / t

The existing weights are sharded (no re-initialisation), so the model computes what it
computed before. Everything is checked before anything changes, and a plan that cannot
apply raises naming the module and the reason: a dimension or head count not divisible
by the set size, a module of a type the entry does not take, an entry matching nothing,
a module matched by two entries.

consolidated_state_dict() is the inverse: the full, unsharded state dict (the keys of
the original model), gathered over each layer's set. A full state dict loads straight
into the parallel model (each layer shards what it is given, layers.TensorParallelModule).
"""
import fnmatch

import torch.nn as nn

from . import _comm
from .layers import (ColumnParallelLinear, ParallelMultiheadAttention, RowParallelLinear,
                     TensorParallelModule, VocabParallelEmbedding, unshard)


class _Spec:
    takes = ()

    def check(self, module, name, size):
        if self.takes and not isinstance(module, self.takes):
            raise TypeError(f"{name}: plan entry {self!r} needs "
                            f"{' or '.join('nn.' + t.__name__ for t in self.takes)}, "
                            f"got {type(module).__name__}")


class Column(_Spec):
    takes = (nn.Linear,)

    def __init__(self, gather_output=False, fused=1):
        self.gather_output, self.fused = gather_output, fused

    def check(self, module, name, size):
        super().check(module, name, size)
        if module.out_features % (self.fused * size):
            raise ValueError(f"{name}: out_features {module.out_features} is not divisible "
                             f"by {self.fused} fused block(s) × tensor-parallel size {size}")

    def apply(self, module, name, ps):
        return ColumnParallelLinear.from_linear(module, ps, self.gather_output, self.fused)

    def __repr__(self):
        return f"Column(gather_output={self.gather_output}, fused={self.fused})"


class Row(_Spec):
    takes = (nn.Linear,)

    def __init__(self, input_is_parallel=True):
        self.input_is_parallel = input_is_parallel

    def check(self, module, name, size):
        super().check(module, name, size)
        if module.in_features % size:
            raise ValueError(f"{name}: in_features {module.in_features} is not divisible by "
                             f"the tensor-parallel size {size}")

    def apply(self, module, name, ps):
        return RowParallelLinear.from_linear(module, ps, self.input_is_parallel)

    def __repr__(self):
        return f"Row(input_is_parallel={self.input_is_parallel})"


class Vocab(_Spec):
    takes = (nn.Embedding,)

    def check(self, module, name, size):
        super().check(module, name, size)
        if module.num_embeddings % size:
            raise ValueError(f"{name}: num_embeddings {module.num_embeddings} is not "
                             f"divisible by the tensor-parallel size {size}")

    def apply(self, module, name, ps):
        return VocabParallelEmbedding.from_embedding(module, ps, name)

    def __repr__(self):
        return "Vocab()"


class Attention(_Spec):
    takes = (nn.MultiheadAttention,)

    def check(self, module, name, size):
        super().check(module, name, size)
        if module.num_heads % size:
            raise ValueError(f"{name}: {module.num_heads} heads are not divisible by the "
                             f"tensor-parallel size {size}")

    def apply(self, module, name, ps):
        return ParallelMultiheadAttention.from_mha(module, ps, name)

    def __repr__(self):
        return "Attention()"


class Heads(_Spec):
    """The module's head-count attribute `attr` becomes heads / t: its forward must take
    the head count from that attribute and its widths from the tensors (GPTBlock's
    attention does)."""

    def __init__(self, attr="n_head"):
        self.attr = attr

    def check(self, module, name, size):
        heads = getattr(module, self.attr, None)
        if not isinstance(heads, int):
            raise TypeError(f"{name}: plan entry {self!r} needs an int attribute "
                            f"'{self.attr}' on {type(module).__name__}")
        if heads % size:
            raise ValueError(f"{name}: {heads} heads are not divisible by the "
                             f"tensor-parallel size {size}")

    def apply(self, module, name, ps):
        setattr(module, self.attr, getattr(module, self.attr) // _comm.set_size(ps))
        return module

    def __repr__(self):
        return f"Heads({self.attr!r})"


_NAMED = {"column": Column, "row": Row, "vocab": Vocab, "attention": Attention}


def _spec(value, pattern):
    if isinstance(value, _Spec):
        return value
    if isinstance(value, str) and value in _NAMED:
        return _NAMED[value]()
    raise ValueError(f"plan entry {pattern!r}: {value!r} is not one of {sorted(_NAMED)} "
                     f"or a Column/Row/Vocab/Attention/Heads spec")


def _match(model, plan):
    specs = {p: _spec(v, p) for p, v in plan.items()}
    hits = {p: 0 for p in specs}
    todo = []
    for name, module in model.named_modules():
        if not name:
            continue
        matched = [p for p in specs if fnmatch.fnmatchcase(name, p)]
        if len(matched) > 1:
            raise ValueError(f"{name}: matched by more than one plan entry: {matched}")
        if matched:
            hits[matched[0]] += 1
            todo.append((name, module, specs[matched[0]]))
    missing = [p for p, n in hits.items() if n == 0]
    if missing:
        raise ValueError(f"plan entries matched no module of {type(model).__name__}: "
                         f"{missing}")
    return todo


def tensor_parallel(model, plan, process_set=None):
    """Replace the modules `plan` names by their tensor-parallel forms over process_set
    (the tensor-parallel group; every rank of it calls this with the same model and
    plan), sharding their existing weights. Returns the model, changed in place."""
    size = _comm.set_size(process_set)
    _comm.set_rank(process_set, "tensor_parallel")
    todo = _match(model, plan)
    for name, module, spec in todo:
        spec.check(module, name, size)
    for name, module, spec in todo:
        new = spec.apply(module, name, process_set)
        if new is not module:
            parent, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, leaf, new)
    return model


def _gather_full(model, tensors):
    """{key: tensor} with every sharded key (a TensorParallelModule's tp_spec) replaced
    by the full tensor gathered over its layer's set; a collective over each set."""
    out = dict(tensors)
    for prefix, module in model.named_modules():
        if not isinstance(module, TensorParallelModule) or module.tp_size == 1:
            continue
        for pname, (dim, fused) in module.tp_spec.items():
            key = f"{prefix}.{pname}" if prefix else pname
            if getattr(module, pname, None) is None or out.get(key) is None:
                continue
            gathered = _comm.allgather_dim(out[key].detach(), dim, module.process_set)
            out[key] = unshard(list(gathered.chunk(module.tp_size, dim)), dim, fused)
    return out


def _on_root(state, root_rank):
    from horovodlike.common import basics
    return None if root_rank is not None and basics.rank() != root_rank else state


def consolidated_state_dict(model, root_rank=None):
    """The full state dict of the unsharded model: every sharded tensor gathered over its
    layer's set, under the original keys (loadable into the model before
    tensor_parallel). On every rank when root_rank is None; else on that global rank,
    None elsewhere. Every rank calls it (in the same order: it is a collective)."""
    return _on_root(_gather_full(model, model.state_dict()), root_rank)


def consolidated_grads(model, root_rank=None):
    """{parameter name: full gradient} (None where a parameter has none), gathered like
    consolidated_state_dict: what the unsharded model's .grad would be."""
    grads = {n: p.grad for n, p in model.named_parameters()}
    return _on_root(_gather_full(model, grads), root_rank)
