"""The gradient pipeline of ShardedDistributedOptimizer: each bucket's gradients are
reduce-scattered inside the partition group during backward, the owned shard all-reduced
across the replica group, and the updated parameters all-gathered back (a mixin of the
optimizer, which holds the layout's buffers and the groups' process sets).

One step, for a bucket of B bytes:

  1. backward: when every gradient of a bucket has been accumulated, the bucket is
     copied into a staging buffer and reduce-scattered inside the partition group
     (moves (S-1)/S * B per rank, inside the node for MiCS), overlapping the rest of
     backward; the gradients are then dropped (p.grad is None). Gradients this rank did
     not compute count as zeros, as with DistributedOptimizer. With
     backward_passes_per_step > 1 this happens on every pass and the reduced shards add
     up.
  2. at the accumulation boundary (the last pass's reduce-scatter of the bucket, or
     step()/synchronize() for the buckets still in flight): the owned shard is
     all-reduced across the replica group (2 (R-1)/R * B/S per rank with R = n / S
     replicas; the only traffic between nodes for MiCS).
  3. the wrapped optimizer steps on the shard.
  4. the updated shards are all-gathered inside the partition group back into the flat
     buffers ((S-1)/S * B per rank).

Plain data parallelism moves 2 (n-1)/n * B per rank, all of it across nodes in a ring;
ZeRO-2 here moves the same inside a partition group and 2/S of it across. Stage 1 keeps
the full averaged gradients in p.grad after synchronize() (one more all-gather of
(S-1)/S * B), so code that reads or clips p.grad keeps working; stage 2 keeps only the
reduced gradient shard.
"""
import math

import torch

from horovodlike.common import ops as _ops
from horovodlike.common import request

from .. import _collectives as C
from .. import _tensors
from ..optimizer import _TOO_MANY_MSG


def _reducescatter_into(tensor, out, name, op, process_set):
    """Reduce-scatter the flat `tensor` straight into `out` (this rank's rows, contiguous):
    no result tensor to allocate and copy from."""
    code = _tensors.check_tensor(tensor, "reducescatter")
    req = request.reducescatter(name, op, 1.0, 1.0, process_set, 1)
    return _ops.submit((tensor, out), lambda _: out,
                       **req.fields(code, tensor.shape, tensor.data_ptr(), out.data_ptr()))


def _allgather_into(chunk, out, name, process_set):
    """All-gather the flat, equal-sized `chunk` of every member straight into `out` (the
    set's size times chunk's elements). chunk may be this rank's own slice of out: the
    engine writes the result in place (it falls back to its own buffer, copied here, only
    if the result does not fit, which equal chunks never cause)."""
    code = _tensors.check_tensor(chunk, "allgather")
    req = request.allgather(name, process_set, 1)

    def finish(res):
        if res.data is not None:
            out.copy_(_tensors.from_engine(res, out.dtype, ()))
        return out
    return _ops.submit((chunk, out), finish,
                       **req.fields(code, chunk.shape, chunk.data_ptr(), out.data_ptr()))


class GradientPipeline:
    """Methods of ShardedDistributedOptimizer that move gradients and parameters. They
    use what the optimizer's set-up made: the layout (_buckets, _flat, _bucket_of,
    _pieces, _params), the gradient shard (_shard_grad), the groups' process sets, the
    wrapped optimizer (_inner), and the pass state (_passes, _in_pass, _launched,
    _synchronized)."""

    def _make_hook(self, p):
        def hook(*_):
            if p.grad is None:
                return
            if self._passes >= self.backward_passes_per_step:
                raise AssertionError(_TOO_MANY_MSG)
            if not self._in_pass:
                self._in_pass = True
                torch.autograd.Variable._execution_engine.queue_callback(self._end_pass)
            b, off = self._bucket_of[id(p)]
            self._stage(b, p, off)
            if len(b.staged) == len(b.entries):
                self._launch(b)
        return hook

    def _stage(self, b, p, off):
        grad = p.grad
        if grad.is_sparse:
            raise ValueError(f"ShardedDistributedOptimizer: parameter {self._name(p)!r} "
                             f"has a sparse gradient; only dense gradients can be sharded")
        if b.staging is None:
            b.staging = torch.empty(b.padded, dtype=b.dtype)
            b.staging[b.numel:].zero_()
        with torch.no_grad():
            b.staging[off:off + p.numel()].copy_(grad.reshape(-1))
        b.staged.add(id(p))
        p.grad = None

    def _launch(self, b):
        """Reduce-scatter bucket b's staged gradients inside the partition group (zeros
        for parameters not staged in this pass)."""
        if b.index in self._launched:
            return
        if b.pending is not None:           # the previous pass's reduction of b
            self._collect(b)
        if b.staging is None:
            b.staging = torch.zeros(b.padded, dtype=b.dtype)
        else:
            for p, j, off, numel in b.entries:
                if id(p) not in b.staged:
                    b.staging[off:off + numel].zero_()
        compressed, ctx = self.compression.compress(b.staging)
        handle = None
        if self.partition_set is not None and (compressed.dtype == b.dtype
                                               and self.backward_passes_per_step == 1):
            # one pass per step: the reduced chunk lands in the gradient shard itself
            handle = _reducescatter_into(compressed, self._shard_grad[b.dtype][
                b.shard_off:b.shard_off + b.chunk], f"{self._uid}.rs.{b.index}", self.op,
                self.partition_set)
        elif self.partition_set is not None:
            handle = C.reducescatter_async(compressed, name=f"{self._uid}.rs.{b.index}",
                                           op=self.op, process_set=self.partition_set)
        b.pending = (handle, ctx, compressed)
        b.staging, b.staged = None, set()
        self._launched.add(b.index)
        if self.stage == 3:               # its gradients have left: the unit goes too
            self._free_unit(b)
        for other in self._buckets:       # free the staging of reductions already done
            if other.pending is not None and (other.pending[0] is None
                                              or C.poll(other.pending[0])):
                self._collect(other)
        if self.stage == 3:               # at most two units' gradients in flight: the
            self._inflight = [x for x in getattr(self, "_inflight", []) if x.pending]
            self._inflight.append(b)      # memory bound of units.py
            while len(self._inflight) > 2:
                self._collect(self._inflight.pop(0))

    def _collect(self, b):
        """Wait for b's reduce-scatter and add its result into the gradient shard."""
        handle, ctx, compressed = b.pending
        b.pending = None
        out = compressed if handle is None else C.synchronize(handle)
        out = self.compression.decompress(out, ctx)
        dst = self._shard_grad[b.dtype][b.shard_off:b.shard_off + b.chunk]
        with torch.no_grad():
            if b.passes:
                dst.add_(out)
            elif out.data_ptr() != dst.data_ptr():
                dst.copy_(out)
        b.passes += 1
        if b.passes == self.backward_passes_per_step:
            self._allreduce_shard(b)      # the last pass: the second hop starts now

    def _allreduce_shard(self, b):
        """All-reduce bucket b's owned shard across the replica group (once per step)."""
        if self.replica_set is None or b.allreduce is not None:
            return
        shard = self._shard_grad[b.dtype][b.shard_off:b.shard_off + b.chunk]
        compressed, ctx = self.compression.compress(shard)
        b.allreduce = (shard, ctx, compressed, C.allreduce_async_(
            compressed, name=f"{self._uid}.ar.{b.index}", op=self.op,
            process_set=self.replica_set))

    def _end_pass(self):
        """At the end of a backward pass: reduce the buckets not reduced yet, so every
        rank reduces every bucket once per pass."""
        self._in_pass = False
        for b in self._buckets:
            self._launch(b)
        self._launched = set()
        self._passes += 1
        if self.stage == 3:
            self._pass_ended()

    def _flush_pass(self):
        """A pass out of p.grad as it stands (no backward ran since the last step, or
        gradients were set by hand)."""
        for b in self._buckets:
            for p, j, off, numel in b.entries:
                if p.grad is not None:
                    self._stage(b, p, off)
        self._end_pass()

    def synchronize(self):
        """Finish the gradient reductions of this step: wait for the reduce-scatters,
        all-reduce the shard across the replica group and (stage 1) all-gather the
        averaged gradients into p.grad."""
        if self._passes == 0:
            self._flush_pass()
        error = None
        for b in self._buckets:
            try:
                if b.pending is not None:
                    self._collect(b)
                self._allreduce_shard(b)  # fewer passes than backward_passes_per_step
            except Exception as e:  # noqa: BLE001 - wait for every handle, then raise
                b.pending, error = None, error or e
            b.passes = 0
        for b in self._buckets:
            if b.allreduce is None:
                continue
            shard, ctx, compressed, handle = b.allreduce
            b.allreduce = None
            try:
                out = self.compression.decompress(C.synchronize(handle), ctx)
                if out.data_ptr() != shard.data_ptr():
                    with torch.no_grad():
                        shard.copy_(out)
            except Exception as e:  # noqa: BLE001
                error = error or e
        self._passes, self._launched, self._in_pass = 0, set(), False
        if error is not None:
            raise error
        if self.stage == 1:
            self._gather_gradients()
        self._synchronized = True

    def _gather(self, source, what, window=2):
        """All-gather every bucket's owned chunk of `source` (flat per dtype, or the
        gradient shard) inside the partition group, yielding (bucket, full bucket) in
        order with at most `window` gathers in flight, so that only that many gathered
        buckets exist at a time."""
        def chunk(b):
            if source is self._shard_grad:
                return source[b.dtype][b.shard_off:b.shard_off + b.chunk]
            at = b.base + self.shard_rank * b.chunk
            return source[b.dtype][at:at + b.chunk]

        if self.partition_set is None:
            yield from ((b, chunk(b)) for b in self._buckets)
            return
        pending = []
        for b in self._buckets + [None] * window:
            if b is not None:
                pending.append((b, C.allgather_async(chunk(b), name=f"{self._uid}.{what}."
                                                     f"{b.index}",
                                                     process_set=self.partition_set)))
            if len(pending) > window or (b is None and pending):
                done, handle = pending.pop(0)
                yield done, C.synchronize(handle)

    def _gather_gradients(self):
        for b, full in self._gather(self._shard_grad, "grad"):
            for p, j, off, numel in b.entries:
                p.grad = full[off:off + numel].view(p.shape)

    @torch.no_grad()
    def _shard_from_grads(self):
        """Stage 1: the gradient shard from p.grad, which the caller may have changed
        since synchronize() (clipped, scaled), as DistributedOptimizer would see it."""
        for pc, t in zip(self._pieces, (t for g in self._inner.param_groups
                                        for t in g["params"])):
            for j, poff, off, n in pc["segments"]:
                g = self._params[j].grad
                dst = t.grad[off:off + n]
                if g is None:
                    dst.zero_()
                elif dst.data_ptr() != g.reshape(-1)[poff:poff + n].data_ptr():
                    dst.copy_(g.reshape(-1)[poff:poff + n])

    def _gather_parameters(self):
        """Step 4: every bucket's owned chunk, updated by the wrapped optimizer, is
        all-gathered inside the partition group straight into the flat parameters."""
        if self.partition_set is None:
            return
        handles = []
        for b in self._buckets:
            full = self._flat[b.dtype][b.base:b.base + b.padded]
            own = full[self.shard_rank * b.chunk:(self.shard_rank + 1) * b.chunk]
            handles.append(_allgather_into(own, full, f"{self._uid}.params.{b.index}",
                                           self.partition_set))
        request.wait_all(handles, _ops.synchronize)

    # ------------------------------------------------------------- clipping

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm, norm_type=2.0, error_if_nonfinite=False):
        """torch.nn.utils.clip_grad_norm_ over the whole model's averaged gradients:
        synchronizes if needed, computes the global norm from the shards (each element
        counted once: summed over the partition group, not the replicas), and scales
        the shard (and p.grad for stage 1). Returns the total norm."""
        norm_type = float(norm_type)
        if not (norm_type > 0 or norm_type == math.inf):
            raise ValueError(f"clip_grad_norm_: norm_type must be positive or inf, got "
                             f"{norm_type}")
        if not self._synchronized:
            self.synchronize()
        if self.stage == 1:
            self._shard_from_grads()
        shards = [g for g in self._shard_grad.values() if g.numel()]
        if norm_type == math.inf:
            local = max((g.abs().max().double() for g in shards),
                        default=torch.zeros((), dtype=torch.float64))
            op = C.Max
        else:
            local = sum((g.double().abs().pow(norm_type).sum() for g in shards),
                        torch.zeros((), dtype=torch.float64))
            op = C.Sum
        total = local.reshape(1)
        if self.partition_set is not None:
            total = C.synchronize(C.allreduce_async(total, name=f"{self._uid}.norm", op=op,
                                                    process_set=self.partition_set))
        total = total[0] if norm_type == math.inf else total[0].pow(1.0 / norm_type)
        if error_if_nonfinite and not torch.isfinite(total):
            raise RuntimeError(f"The total norm of order {norm_type} for gradients from "
                               f"`parameters` is non-finite, so it cannot be clipped. To "
                               f"disable this error and scale the gradients by the "
                               f"non-finite norm anyway, set `error_if_nonfinite=False`")
        coef = torch.clamp(float(max_norm) / (total + 1e-6), max=1.0)
        if self.stage == 1:               # step() takes the shard from p.grad
            for p in self._params:
                if p.grad is not None:
                    p.grad.mul_(coef.to(p.grad.dtype))
        else:
            for g in shards:
                g.mul_(coef.to(g.dtype))
        dtype = next(iter(self._shard_grad), torch.float32)
        return total.to(dtype)
