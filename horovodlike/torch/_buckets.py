"""Gradient buckets for DistributedOptimizer, the way DDP forms them.

Parameters are taken in reverse registration order (roughly the order backward produces
their gradients) and packed, per dtype and device, into flat buckets: a small first bucket so the
first reduction starts as early as possible, then buckets up to a cap. When the last
gradient of a bucket is ready, the bucket goes to the engine as ONE allreduce of one
flat tensor.

Cost model, per step with G gradients in B buckets: per-tensor reduction costs G engine
ops (G negotiation entries, G completions, G waits in Python) plus the engine's fusion
copies; bucketing costs B ops and the same two copies (gradient -> bucket, bucket ->
gradient), done here instead of in the engine's fusion buffer. With B ~ G/20 for a
ResNet, the per-op overheads (tens of microseconds each) mostly disappear, and the
engine wakes a few times per step instead of once per gradient.

Caps: HOROVODLIKE_BUCKET_BYTES (default 25 MiB, as DDP; never above
HOROVOD_FUSION_THRESHOLD, whose meaning for the engine is unchanged) and
HOROVODLIKE_FIRST_BUCKET_BYTES (default 1 MiB). HOROVODLIKE_BUCKET_BYTES=0 turns
bucketing off: one allreduce per gradient, as Horovod does.
"""
import os

import torch

from ._tensors import cuda_enabled

DEFAULT_CAP = 25 << 20
DEFAULT_FIRST = 1 << 20
DEFAULT_FUSION = 64 << 20


def _env_bytes(name, default):
    text = os.environ.get(name)
    if text in (None, ""):
        return default
    try:
        value = int(float(text))
    except ValueError:
        raise ValueError(f"{name} must be a number of bytes, got {text!r}") from None
    if value < 0:
        raise ValueError(f"{name} must not be negative, got {text!r}")
    return value


def caps():
    """(first bucket cap, bucket cap) in bytes; a cap of 0 means no bucketing."""
    cap = _env_bytes("HOROVODLIKE_BUCKET_BYTES", DEFAULT_CAP)
    fusion = _env_bytes("HOROVOD_FUSION_THRESHOLD", DEFAULT_FUSION)
    if fusion > 0:
        cap = min(cap, fusion)
    first = min(_env_bytes("HOROVODLIKE_FIRST_BUCKET_BYTES", DEFAULT_FIRST), cap)
    return first, cap


class Bucket:
    """Some parameters' gradients laid end to end in one flat tensor."""

    def __init__(self, index, params, name_of):
        self.params = list(params)
        self.offsets, n = [], 0
        for p in self.params:
            self.offsets.append(n)
            n += p.numel()
        first = self.params[0]
        self.flat = torch.zeros(n, dtype=first.dtype, device=first.device)
        # Same name on every rank: the bucket's place and its first parameter's name.
        self.name = f"bucket.{index}.{name_of(self.params[0])}"
        self.done = set()      # slots filled this step
        self.skip = set()      # parameters reduced on their own this step (sparse)

    def reset(self):
        self.done.clear()
        self.skip.clear()

    def put(self, i, p):
        """Copy p's gradient into its slot (zeros when this rank computed none, or when
        it is sparse and reduced on its own); True once every slot is filled."""
        view = self.flat[self.offsets[i]:self.offsets[i] + p.numel()]
        if p.grad is None or p.grad.is_sparse:
            view.zero_()
        else:
            view.copy_(p.grad.reshape(-1))
        self.done.add(i)
        return len(self.done) == len(self.params)

    def take(self, out):
        """Copy the reduced bucket back into each gradient."""
        for p, off in zip(self.params, self.offsets):
            if p in self.skip:
                continue
            src = out[off:off + p.numel()].view_as(p)
            if p.grad is None or p.grad.is_sparse or p.grad.shape != p.shape:
                p.grad = src.clone()
            else:
                p.grad.copy_(src)


def _bucketed(p):
    """Dense parameters on the CPU, or on a CUDA device when CUDA tensors are accepted
    (a CUDA bucket is staged as one op, see _staging.py)."""
    if p.layout != torch.strided:
        return False
    return p.device.type == "cpu" or (p.device.type == "cuda" and cuda_enabled())


def plan(params, name_of, first_cap, cap):
    """Buckets over `params` (in registration order): reverse order, per dtype and
    device; returns (buckets, {param: (bucket, slot)})."""
    buckets, where, open_ = [], {}, {}
    for p in reversed(params):
        if not _bucketed(p):
            continue
        nbytes = p.numel() * p.element_size()
        key = (p.dtype, p.device)
        cur = open_.get(key)               # [members, bytes, this bucket's cap]
        if cur is None or (cur[1] and cur[1] + nbytes > cur[2]):
            cur = [[], 0, first_cap if not buckets else cap]
            open_[key] = cur
            buckets.append(cur)
        cur[0].append(p)
        cur[1] += nbytes
    out = []
    for i, (members, _, _) in enumerate(buckets):
        b = Bucket(i, members, name_of)
        for slot, p in enumerate(members):
            where[p] = (b, slot)
        out.append(b)
    return out, where
