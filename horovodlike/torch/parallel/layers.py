"""Tensor-parallel layers (Megatron-LM's design) over a horovodlike process set.

    ColumnParallelLinear   W [out, in] split by rows: rank r holds out/t outputs.
                           forward f(x) @ W_r^T + b_r  (optionally gathered)
    RowParallelLinear      W [out, in] split by columns: rank r holds in/t inputs.
                           forward g(x_r @ W_r^T) + b  (b replicated, added once)
    VocabParallelEmbedding the table split by rows (vocabulary ranges); ids outside
                           this rank's range look up zeros, g sums the ranks.
    ParallelMultiheadAttention
                           nn.MultiheadAttention with its fused in_proj split per head
                           (column) and out_proj row-parallel; heads split across ranks.

A column layer followed by a row layer costs one allreduce forward (g) and one backward
(f) of the activation, b·s·h elements (_comm). Each layer, constructed fresh, first builds
the unsharded torch layer with the same arguments and keeps its own slice, so with the
same seed its full weight equals the unsharded layer's (and the RNG advances the same).

Sharded parameters carry their layout in the module's `tp_spec` {name: (dim, fused)}:
the split dimension, and how many equal blocks (fused=3 for q, k, v) are each split
separately, so that rank r holds heads r·H/t .. of q, of k and of v alike. Loading a
state dict whose tensor has the full shape shards it (a full checkpoint loads straight
into a sharded model); one with the local shape loads as it is.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from . import _comm


def shard(full, dim, fused, size, rank):
    """This rank's part of a full tensor: each of `fused` equal blocks along dim split
    in `size` parts, rank's part of each, concatenated."""
    blocks = full.chunk(fused, dim) if fused > 1 else [full]
    return torch.cat([b.chunk(size, dim)[rank] for b in blocks], dim).contiguous()


def unshard(parts, dim, fused):
    """The full tensor from every rank's part (shard's inverse)."""
    if fused == 1:
        return torch.cat(parts, dim)
    per_rank = [p.chunk(fused, dim) for p in parts]
    return torch.cat([torch.cat([pr[f] for pr in per_rank], dim) for f in range(fused)], dim)


def _check_divisible(what, n, parts, reason):
    if n % parts:
        raise ValueError(f"{what}: {reason} {n} is not divisible by {parts}")


class TensorParallelModule(nn.Module):
    """Base of the layers: the process set, this rank's place in it, and loading full
    tensors by sharding them."""

    tp_spec = {}

    def _init_tp(self, process_set):
        self.process_set = process_set
        self.tp_size = _comm.set_size(process_set)
        self.tp_rank = _comm.set_rank(process_set, type(self).__name__)

    def full_shape(self, name):
        dim, _ = self.tp_spec[name]
        shape = list(getattr(self, name).shape)
        shape[dim] *= self.tp_size
        return tuple(shape)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        for name, (dim, fused) in self.tp_spec.items():
            key = prefix + name
            t = state_dict.get(key)
            if (t is not None and getattr(self, name, None) is not None and self.tp_size > 1
                    and tuple(t.shape) == self.full_shape(name)):
                state_dict[key] = shard(t, dim, fused, self.tp_size, self.tp_rank)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def _param(t):
    return nn.Parameter(t.detach().clone(), requires_grad=t.requires_grad)


class ColumnParallelLinear(TensorParallelModule):
    """nn.Linear(in_features, out_features) with the outputs split across the set.

    The output is this rank's out/t features unless gather_output=True. fused=k treats
    the outputs as k equal blocks (a fused q/k/v projection: k=3), each split alike."""

    tp_spec = {"weight": (0, 1), "bias": (0, 1)}

    def __init__(self, in_features, out_features, bias=True, gather_output=False,
                 process_set=None, fused=1, device=None, dtype=None, _full=None):
        super().__init__()
        self._init_tp(process_set)
        _check_divisible(type(self).__name__, out_features, fused * self.tp_size,
                         f"out_features (in {fused} fused block(s) × tensor-parallel "
                         f"size {self.tp_size}):")
        self.in_features, self.out_features = in_features, out_features
        self.gather_output, self.fused = gather_output, fused
        self.tp_spec = {"weight": (0, fused), "bias": (0, fused)}
        full = _full if _full is not None else nn.Linear(in_features, out_features, bias,
                                                         device=device, dtype=dtype)
        self.weight = _param(shard(full.weight, 0, fused, self.tp_size, self.tp_rank))
        self.bias = (None if full.bias is None else
                     _param(shard(full.bias, 0, fused, self.tp_size, self.tp_rank)))

    @classmethod
    def from_linear(cls, linear, process_set=None, gather_output=False, fused=1):
        return cls(linear.in_features, linear.out_features, linear.bias is not None,
                   gather_output, process_set, fused, _full=linear)

    def forward(self, x):
        y = F.linear(_comm.copy_to_tp(x, self.process_set), self.weight, self.bias)
        if not self.gather_output or self.tp_size == 1:
            return y
        y = _comm.gather_from_tp(y, self.process_set)
        if self.fused > 1:          # [t blocks of (fused, n)] -> [fused blocks of (t, n)]
            n = self.out_features // (self.fused * self.tp_size)
            y = y.unflatten(-1, (self.tp_size, self.fused, n)).transpose(-3, -2).flatten(-3)
        return y

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features} "
                f"(this rank {self.weight.shape[0]}), tp={self.tp_size}, fused={self.fused}, "
                f"gather_output={self.gather_output}")


class RowParallelLinear(TensorParallelModule):
    """nn.Linear(in_features, out_features) with the inputs split across the set.

    input_is_parallel=True takes this rank's in/t features (a column layer's output);
    False takes the full input and keeps this rank's slice. The bias is replicated and
    added once, after the sum."""

    tp_spec = {"weight": (1, 1)}

    def __init__(self, in_features, out_features, bias=True, input_is_parallel=True,
                 process_set=None, device=None, dtype=None, _full=None):
        super().__init__()
        self._init_tp(process_set)
        _check_divisible(type(self).__name__, in_features, self.tp_size,
                         "in_features")
        self.in_features, self.out_features = in_features, out_features
        self.input_is_parallel = input_is_parallel
        full = _full if _full is not None else nn.Linear(in_features, out_features, bias,
                                                         device=device, dtype=dtype)
        self.weight = _param(shard(full.weight, 1, 1, self.tp_size, self.tp_rank))
        self.bias = None if full.bias is None else _param(full.bias)

    @classmethod
    def from_linear(cls, linear, process_set=None, input_is_parallel=True):
        return cls(linear.in_features, linear.out_features, linear.bias is not None,
                   input_is_parallel, process_set, _full=linear)

    def forward(self, x):
        if not self.input_is_parallel:
            x = _comm.scatter_to_tp(x, self.process_set)
        y = _comm.reduce_from_tp(F.linear(x, self.weight), self.process_set)
        return y if self.bias is None else y + self.bias

    def extra_repr(self):
        return (f"in_features={self.in_features} (this rank {self.weight.shape[1]}), "
                f"out_features={self.out_features}, tp={self.tp_size}, "
                f"input_is_parallel={self.input_is_parallel}")


class VocabParallelEmbedding(TensorParallelModule):
    """nn.Embedding(num_embeddings, embedding_dim) with the vocabulary split across the
    set: rank r holds rows r·V/t .. (r+1)·V/t. Output: the full embedding, replicated."""

    tp_spec = {"weight": (0, 1)}

    def __init__(self, num_embeddings, embedding_dim, process_set=None, device=None,
                 dtype=None, _full=None):
        super().__init__()
        self._init_tp(process_set)
        _check_divisible(type(self).__name__, num_embeddings, self.tp_size,
                         "num_embeddings")
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        full = _full if _full is not None else nn.Embedding(num_embeddings, embedding_dim,
                                                            device=device, dtype=dtype)
        self.weight = _param(shard(full.weight, 0, 1, self.tp_size, self.tp_rank))
        self.vocab_start = self.tp_rank * (num_embeddings // self.tp_size)

    @classmethod
    def from_embedding(cls, emb, process_set=None, name="embedding"):
        bad = [k for k in ("padding_idx", "max_norm") if getattr(emb, k) is not None] + \
            [k for k in ("scale_grad_by_freq", "sparse") if getattr(emb, k)]
        if bad:
            raise ValueError(f"{name}: VocabParallelEmbedding does not support "
                             f"nn.Embedding's {', '.join(bad)}")
        return cls(emb.num_embeddings, emb.embedding_dim, process_set, _full=emb)

    def forward(self, ids):
        if self.tp_size == 1:
            return F.embedding(ids, self.weight)
        n = self.weight.shape[0]
        outside = (ids < self.vocab_start) | (ids >= self.vocab_start + n)
        local = (ids - self.vocab_start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return _comm.reduce_from_tp(out, self.process_set)

    def extra_repr(self):
        return (f"{self.num_embeddings} (this rank {self.weight.shape[0]} from "
                f"{self.vocab_start}), {self.embedding_dim}, tp={self.tp_size}")


class ParallelMultiheadAttention(TensorParallelModule):
    """nn.MultiheadAttention with heads split across the set, for self- and cross-
    attention: in_proj (q, k, v fused) is column-parallel per head, out_proj row-
    parallel. Its parameters keep nn.MultiheadAttention's names, so state dicts are
    interchangeable. Built from an existing one with from_mha (the plan does this).

    Not supported, with an error: separate q/k/v projection weights (kdim/vdim),
    add_bias_kv, add_zero_attn, and need_weights=True (averaged attention weights over
    all heads would need a gather: pass need_weights=False, as TransformerEncoderLayer
    does)."""

    tp_spec = {"in_proj_weight": (0, 3), "in_proj_bias": (0, 3)}
    # Tells TransformerEncoderLayer to take its regular path: its fused inference
    # kernel would read in_proj_weight as the whole projection.
    _qkv_same_embed_dim = False

    def __init__(self, mha, process_set=None, name="self_attn"):
        super().__init__()
        self._init_tp(process_set)
        if not mha._qkv_same_embed_dim:
            raise ValueError(f"{name}: nn.MultiheadAttention with kdim/vdim different from "
                             f"embed_dim (separate q/k/v weights) is not supported")
        if mha.bias_k is not None or mha.add_zero_attn:
            raise ValueError(f"{name}: nn.MultiheadAttention with add_bias_kv or "
                             f"add_zero_attn is not supported")
        if mha.num_heads % self.tp_size:
            raise ValueError(f"{name}: {mha.num_heads} heads are not divisible by the "
                             f"tensor-parallel size {self.tp_size}")
        self.embed_dim, self.batch_first, self.dropout = mha.embed_dim, mha.batch_first, \
            mha.dropout
        self.num_heads = mha.num_heads // self.tp_size           # this rank's heads
        self.head_dim = mha.head_dim
        t, r = self.tp_size, self.tp_rank
        self.in_proj_weight = _param(shard(mha.in_proj_weight, 0, 3, t, r))
        self.in_proj_bias = (None if mha.in_proj_bias is None else
                             _param(shard(mha.in_proj_bias, 0, 3, t, r)))
        self.out_proj = RowParallelLinear.from_linear(mha.out_proj, process_set)

    @classmethod
    def from_mha(cls, mha, process_set=None, name="self_attn"):
        return cls(mha, process_set, name)

    def _mask(self, attn_mask, key_padding_mask, b, s_q, s_k, dtype):
        """One additive float mask [b, heads, s_q, s_k] (or None), as
        nn.MultiheadAttention reads them: True or -inf means masked."""
        def as_float(m):
            if m.dtype == torch.bool:
                return torch.zeros(m.shape, dtype=dtype).masked_fill(m, float("-inf"))
            return m.to(dtype)
        mask = None
        if attn_mask is not None:
            mask = as_float(attn_mask)
            if mask.dim() == 3:                       # [b · all heads, s_q, s_k]
                h0 = self.tp_rank * self.num_heads
                mask = mask.view(b, -1, s_q, s_k)[:, h0:h0 + self.num_heads]
        if key_padding_mask is not None:
            kp = as_float(key_padding_mask).view(b, 1, 1, s_k)
            mask = kp if mask is None else mask + kp
        return mask

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                attn_mask=None, average_attn_weights=True, is_causal=False):
        if need_weights:
            raise NotImplementedError(
                "ParallelMultiheadAttention: need_weights=True is not supported (the "
                "weights of every head would have to be gathered); pass need_weights=False")
        if not self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        b, s_q, s_k = query.shape[0], query.shape[1], key.shape[1]
        w = self.in_proj_weight.chunk(3)
        bias = self.in_proj_bias.chunk(3) if self.in_proj_bias is not None else (None,) * 3
        ps = self.process_set
        if query is key and key is value:
            x = _comm.copy_to_tp(query, ps)
            q, k, v = F.linear(x, self.in_proj_weight, self.in_proj_bias).chunk(3, -1)
        else:
            q, k, v = (F.linear(_comm.copy_to_tp(t, ps), wi, bi)
                       for t, wi, bi in zip((query, key, value), w, bias))
        q, k, v = (t.unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)
                   for t in (q, k, v))
        mask = self._mask(attn_mask, key_padding_mask, b, s_q, s_k, q.dtype)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0,
            is_causal=bool(is_causal and mask is None))
        out = self.out_proj(out.transpose(1, 2).flatten(-2))
        return (out if self.batch_first else out.transpose(0, 1)), None

    def extra_repr(self):
        return (f"embed_dim={self.embed_dim}, heads on this rank={self.num_heads}, "
                f"tp={self.tp_size}, batch_first={self.batch_first}")


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross entropy over logits split by vocabulary: two small allreduces (the max, then
    the target logit and the sum of exponentials together, b·s elements each), never the
    b·s·V logits."""

    @staticmethod
    def forward(ctx, logits, target, process_set):
        n = logits.shape[-1]
        start = _comm.set_rank(process_set) * n
        lmax = _comm.allreduce_max(logits.detach().amax(-1), process_set)
        shifted = logits.detach() - lmax.unsqueeze(-1)
        outside = (target < start) | (target >= start + n)
        local = (target - start).masked_fill(outside, 0)
        picked = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        exp = shifted.exp()
        both = _comm.allreduce_sum(torch.stack([picked, exp.sum(-1)]), process_set)
        loss = both[1].log() - both[0]
        ctx.save_for_backward(exp.div_(both[1].unsqueeze(-1)), local, outside)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, local, outside = ctx.saved_tensors
        grad = softmax.clone()
        grad.scatter_add_(-1, local.unsqueeze(-1), -(~outside).to(grad.dtype).unsqueeze(-1))
        return grad * grad_loss.unsqueeze(-1), None, None


def vocab_parallel_cross_entropy(logits, target, process_set=None, reduction="mean"):
    """F.cross_entropy(full_logits.flatten(0, -2), target.flatten(), reduction=...) from
    this rank's vocabulary slice of the logits [..., V/t] (a ColumnParallelLinear LM
    head without gather_output); the full vocabulary is never gathered. Every rank of
    the set gets the same loss."""
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"vocab_parallel_cross_entropy: reduction must be 'mean', 'sum' "
                         f"or 'none', got {reduction!r}")
    if tuple(target.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"vocab_parallel_cross_entropy: target shape {tuple(target.shape)} "
                         f"must be the logits' shape without the vocabulary dimension "
                         f"{tuple(logits.shape[:-1])}")
    vocab = logits.shape[-1] * _comm.set_size(process_set)
    if target.numel() and (int(target.min()) < 0 or int(target.max()) >= vocab):
        raise ValueError(f"vocab_parallel_cross_entropy: targets must lie in [0, {vocab}), "
                         f"got {int(target.min())}..{int(target.max())} (ignore_index is "
                         f"not supported)")
    loss = _VocabParallelCrossEntropy.apply(logits, target, process_set)
    if reduction == "mean":
        return loss.mean()
    return loss.sum() if reduction == "sum" else loss
