"""ShardedDistributedOptimizer: sharded data parallelism (ZeRO stage 1 and 2) with
partition groups, so that a job can shard inside a node and replicate across nodes
(MiCS, also called hybrid sharding or ZeRO-2D).

The ranks of the process set (n of them) are split into n / S partition groups of
S = shard_size consecutive ranks; rank i of every partition group belongs to replica
group i. With S = n there is one partition group (plain ZeRO); with S = hvd.local_size()
a partition group is a node.

Layout. The trainable parameters are kept in one flat buffer per dtype (each parameter's
.data becomes a view into it). A buffer is a run of buckets of whole parameters, in the
reverse of the optimizer's order (the order backward produces gradients); each bucket is
padded to a multiple of S, and member m of a partition group owns the m-th contiguous
1/S of every bucket (with one bucket, a contiguous 1/S of the whole buffer). The wrapped
optimizer is rebuilt over the owned slices, so its state holds 1/S of the elements.

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

Only element-wise optimizers can be split by slice (the update of an element depends on
that element's gradient and state alone); the others are refused by name.
"""
import inspect
import itertools
import json
import math
from contextlib import contextmanager

import torch

from horovodlike.common import arguments, basics
from horovodlike.common import ops as _ops
from horovodlike.common import request
from horovodlike.common import dynamic_sets
from horovodlike.common import process_sets as _sets

from . import _collectives as C
from . import _tensors
from ._process_sets import global_process_set, resolve
from .compression import Compression
from .optimizer import (_IN_FLIGHT_MSG, _TOO_MANY_MSG, _DistributedOptimizer,
                        check_named_parameters)

# Optimizers whose update of every element reads only that element's gradient and state
# (plus per-tensor scalars such as the step count, equal over a tensor's slices).
ELEMENTWISE_OPTIMIZERS = tuple(getattr(torch.optim, n) for n in (
    "SGD", "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad", "Adadelta",
    "Rprop", "ASGD") if hasattr(torch.optim, n))

FORMAT = "horovodlike.ShardedDistributedOptimizer/1"
DEFAULT_BUCKET_CAP_MB = 4.0
_MAX_META_BYTES = 64 << 20        # the most JSON a peer may send us in one state exchange
_MAX_DEPTH = 32                   # nesting allowed in that JSON

_instances = itertools.count()     # numbers optimizers in creation order, same on all ranks


# ------------------------------------------------------------------ process sets

def partition_ranks(ranks, shard_size):
    """([partition groups], [replica groups]) of a sorted list of global ranks: partition
    group g is ranks[g*S:(g+1)*S]; replica group m holds the m-th rank of every partition
    group. Register these sets yourself (hvd.init(process_sets=...)) to use
    ShardedDistributedOptimizer without dynamic process sets."""
    ranks = list(ranks)
    n = len(ranks)
    if not isinstance(shard_size, int) or isinstance(shard_size, bool) or shard_size < 1:
        raise ValueError(f"shard_size must be a positive int, got {shard_size!r}")
    if n % shard_size:
        raise ValueError(f"shard_size={shard_size} does not divide the process set's size "
                         f"{n}; pick a divisor of {n} (hvd.local_size() for one partition "
                         f"group per node)")
    parts = [ranks[g:g + shard_size] for g in range(0, n, shard_size)]
    replicas = [ranks[m::shard_size] for m in range(shard_size)]
    return parts, replicas


def _set_of(ranks, base, base_ranks):
    """The registered process set with exactly these ranks (registering it when sets are
    the optimizer spans every rank: it may, with or without dynamic sets); None for one rank, which needs no
    collective. Every rank calls this for the same groups in the same order."""
    if len(ranks) == 1:
        return None
    if list(ranks) == base_ranks:
        return base
    if list(ranks) == list(range(basics.size())):
        return global_process_set
    found = _sets.find(ranks)
    if found is not None:
        return found
    if base_ranks == list(range(basics.size())):
        # every rank builds the optimizer: it registers its groups itself
        return dynamic_sets.add_for_library(list(ranks))
    raise ValueError(
        f"ShardedDistributedOptimizer over a process set needs a process set with ranks "
        f"{list(ranks)}: register the sets from horovodlike.torch.sharded.partition_ranks() "
        f"on every rank (hvd.init(process_sets=...)), or start with "
        f"hvd.init(process_sets='dynamic')")


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


# ------------------------------------------------------------------ layout

class _Bucket:
    """Whole parameters of one dtype reduced together. Coordinates are in elements,
    relative to the bucket's start in its dtype's flat buffer."""

    def __init__(self, index, dtype, base, entries, shard_size):
        self.index, self.dtype, self.base = index, dtype, base
        self.entries = entries                     # [(param, j, offset, numel)]
        self.numel = sum(e[3] for e in entries)
        self.padded = -(-self.numel // shard_size) * shard_size
        self.chunk = self.padded // shard_size
        self.shard_off = 0                         # where its chunk sits in the shard
        self.staging = None                        # this pass's gradients, once started
        self.staged = set()                        # params staged in this pass
        self.pending = None                        # (handle, ctx, input) of the reduction
        self.allreduce = None                      # (shard, ctx, input, handle) across replicas
        self.passes = 0                            # passes reduced into the shard


def _dtype_name(dtype):
    return str(dtype).rsplit(".", 1)[-1]


_DTYPES = {_dtype_name(d): d for d in (
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
    torch.complex128, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.bool)}


# ------------------------------------------------------------------ state transport

def _pack(tree):
    """A state tree (dicts, lists, tuples, JSON scalars, tensors) as (JSON bytes, one
    uint8 tensor of every tensor's bytes). Never pickled: peers' data is not code."""
    chunks, size = [], 0

    def enc(v):
        nonlocal size
        if isinstance(v, torch.Tensor):
            t = v.detach().cpu().contiguous().reshape(-1)
            if _dtype_name(t.dtype) not in _DTYPES:
                raise TypeError(f"cannot save a {t.dtype} tensor in optimizer state")
            raw = t.view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
            chunks.append(raw)
            size += raw.numel()
            return {"t": [_dtype_name(t.dtype), list(v.shape), size - raw.numel(),
                          raw.numel()]}
        if isinstance(v, dict):
            return {"d": [[enc(k), enc(x)] for k, x in v.items()]}
        if isinstance(v, tuple):
            return {"u": [enc(x) for x in v]}
        if isinstance(v, list):
            return [enc(x) for x in v]
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        raise TypeError(f"cannot save a {type(v).__name__} in optimizer state")

    meta = json.dumps(enc(tree)).encode()
    data = torch.cat(chunks) if chunks else torch.empty(0, dtype=torch.uint8)
    return meta, data


def _unpack(meta, data):
    """Inverse of _pack, checking every length and offset against what arrived."""
    if len(meta) > _MAX_META_BYTES:
        raise ValueError(f"optimizer state description of {len(meta)} bytes exceeds the "
                         f"limit of {_MAX_META_BYTES}")
    nbytes = data.numel()

    def dec(v, depth):
        if depth > _MAX_DEPTH:
            raise ValueError("optimizer state nested too deeply")
        if isinstance(v, list):
            return [dec(x, depth + 1) for x in v]
        if not isinstance(v, dict):
            return v
        if "t" in v:
            name, shape, off, n = v["t"]
            dtype = _DTYPES.get(name)
            if dtype is None or not all(isinstance(s, int) and s >= 0 for s in shape):
                raise ValueError(f"bad tensor in optimizer state: {v['t']!r}")
            numel = math.prod(shape)
            itemsize = torch.empty(0, dtype=dtype).element_size()
            if n != numel * itemsize or off < 0 or off + n > nbytes:
                raise ValueError(f"bad tensor in optimizer state: {v['t']!r} with "
                                 f"{nbytes} bytes received")
            return data[off:off + n].clone().view(dtype).reshape(shape)
        if "u" in v:
            return tuple(dec(x, depth + 1) for x in v["u"])
        return {dec(k, depth + 1): dec(x, depth + 1) for k, x in v["d"]}

    return dec(json.loads(meta.decode()), 0)


def _blob(tree):
    meta, data = _pack(tree)
    head = torch.tensor([len(meta), data.numel()], dtype=torch.int64).view(torch.uint8)
    return torch.cat([head, torch.frombuffer(bytearray(meta), dtype=torch.uint8)
                      if meta else torch.empty(0, dtype=torch.uint8), data])


def _unblob(blob):
    if blob.numel() < 16:
        raise ValueError("truncated optimizer state")
    m, d = blob[:16].clone().view(torch.int64).tolist()
    if m < 0 or d < 0 or 16 + m + d != blob.numel():
        raise ValueError(f"optimizer state lengths {m} + {d} do not match the "
                         f"{blob.numel() - 16} bytes received")
    return _unpack(blob[16:16 + m].numpy().tobytes(), blob[16 + m:])


def _gather_blobs(blob, root, ps, index, name):
    """Every member's blob at the set member `root` (an index into the set), by
    alltoall; [blob per member] there, None elsewhere."""
    n = ps.size()
    splits = [blob.numel() if j == root else 0 for j in range(n)]
    out, received = C.synchronize(C.alltoall_async(blob, splits=splits, name=name,
                                                   process_set=ps))
    if index != root:
        return None
    return list(torch.split(out, received.tolist()))


def _broadcast_blob(blob, root_rank, ps, name):
    size = torch.tensor([blob.numel() if blob is not None else 0], dtype=torch.int64)
    C.synchronize(C.broadcast_async_(size, root_rank, name=f"{name}.sz", process_set=ps))
    buf = blob if blob is not None else torch.empty(int(size[0]), dtype=torch.uint8)
    C.synchronize(C.broadcast_async_(buf, root_rank, name=f"{name}.t", process_set=ps))
    return buf


# ------------------------------------------------------------------ the optimizer

class ShardedDistributedOptimizer(torch.optim.Optimizer):
    """Wrap an element-wise torch.optim optimizer so that its state (stage 1) and the
    reduced gradients (stage 2) are sharded over partition groups of shard_size ranks,
    and replicated across them.

    optimizer: SGD, Adam, AdamW, Adamax, NAdam, RAdam, RMSprop, Adagrad, Adadelta, Rprop
        or ASGD (others are refused: their updates need whole tensors).
    named_parameters: (name, parameter) pairs, usually model.named_parameters().
    stage: 1 shards the optimizer state and leaves the averaged gradients in p.grad after
        synchronize(); 2 (default) keeps only this rank's reduced gradient shard.
    shard_size: ranks per partition group; must divide the set's size. Default: the whole
        set (ZeRO). hvd.local_size() shards inside each node and replicates across nodes.
    compression: hvd.Compression.none or .fp16 for the gradients' transfers.
    op: hvd.Average (default) or hvd.Sum over all the set's ranks.
    backward_passes_per_step: backward passes to accumulate before each step.
    process_set: the ranks that train together (every one of them must build it).
    bucket_cap_mb: gradients reduced per bucket (megabytes).

    The model's parameters must be the same on every rank when it is built (broadcast
    them first); the optimizer's existing state, if any, is kept. Partition and replica
    groups are process sets, added when sets are dynamic (hvd.init(process_sets=
    'dynamic')); otherwise register partition_ranks()'s sets at init.
    """

    def __init__(self, optimizer, named_parameters=None, stage=2, shard_size=None,
                 compression=Compression.none, op=C.Average, backward_passes_per_step=1,
                 process_set=global_process_set, bucket_cap_mb=DEFAULT_BUCKET_CAP_MB):
        _check_optimizer(optimizer)
        if stage not in (1, 2) or isinstance(stage, bool):
            raise ValueError(f"stage must be 1 (shard optimizer state) or 2 (also "
                             f"gradients), got {stage!r}")
        args = arguments.gradient_args(op, compression,
                                       backward_passes_per_step=backward_passes_per_step,
                                       sum_or_average=True)
        op = args.op
        if not isinstance(bucket_cap_mb, (int, float)) or not bucket_cap_mb > 0:
            raise ValueError(f"bucket_cap_mb must be a positive number, got "
                             f"{bucket_cap_mb!r}")
        ps, _ = resolve(process_set)
        base_ranks = list(ps.ranks) if ps.process_set_id != 0 else list(range(basics.size()))
        if not ps.included():
            raise ValueError(f"ShardedDistributedOptimizer: rank {basics.rank()} is not a "
                             f"member of {ps!r}")
        n = len(base_ranks)
        shard_size = n if shard_size is None else shard_size
        parts, replicas = partition_ranks(base_ranks, shard_size)

        groups = [dict(g) for g in optimizer.param_groups]
        super().__init__(groups, optimizer.defaults)
        self.optimizer_class = type(optimizer)
        self.stage, self.shard_size, self.op = stage, shard_size, op
        self.compression = compression
        self.backward_passes_per_step = args.backward_passes_per_step
        self.process_set = ps
        named = check_named_parameters(named_parameters, self.param_groups)
        self._names = {id(p): k for k, p in named}

        # Partition groups first, then replica groups: the same order on every rank.
        me = basics.rank()
        part_sets = [_set_of(g, ps, base_ranks) for g in parts]
        replica_sets = [_set_of(g, ps, base_ranks) for g in replicas]
        self.partition_index = base_ranks.index(me) // shard_size
        self.shard_rank = base_ranks.index(me) % shard_size
        self.partition_set = part_sets[self.partition_index]
        self.replica_set = replica_sets[self.shard_rank]
        self.replicas = n // shard_size
        self._uid = f"sharded.{next(_instances)}"

        self._params = [p for g in self.param_groups for p in g["params"]]
        self._group_of = {id(p): gi for gi, g in enumerate(self.param_groups)
                          for p in g["params"]}
        for p in self._params:
            if p.device.type != "cpu" or p.is_sparse:
                raise ValueError(f"ShardedDistributedOptimizer: parameter {self._name(p)!r} "
                                 f"is not a dense CPU tensor")
        self._build_buckets(int(bucket_cap_mb * (1 << 20)))
        self._pieces = self._pieces_for(self.shard_rank)
        self._shard_grad = {d: torch.zeros(sum(b.chunk for b in self._buckets
                                               if b.dtype == d), dtype=d)
                            for d in self._flat}
        self._inner = self._make_inner(optimizer)

        self._passes = 0                  # backward passes reduced since the last step
        self._in_pass = False             # a backward pass is running (callback queued)
        self._launched = set()            # buckets reduced in the running pass
        self._synchronized = False
        self._should_synchronize = True
        self._hook_handles = [p.register_post_accumulate_grad_hook(self._make_hook(p))
                              for b in self._buckets for p, *_ in b.entries]
        if optimizer.state:               # e.g. loaded from a checkpoint before wrapping
            self.load_state_dict(optimizer.state_dict())

    # ------------------------------------------------------------- set-up

    def _name(self, p):
        return self._names.get(id(p), f"param.{self._group_of.get(id(p))}")

    def _build_buckets(self, cap_bytes):
        """Buckets of whole trainable parameters per dtype, in reverse optimizer order;
        every parameter's .data becomes a view into its dtype's flat buffer."""
        by_dtype = {}
        for j in reversed(range(len(self._params))):
            p = self._params[j]
            if p.requires_grad:
                by_dtype.setdefault(p.dtype, []).append(j)
        self._buckets, self._flat, self._bucket_of = [], {}, {}
        for dtype, js in by_dtype.items():
            itemsize = torch.empty(0, dtype=dtype).element_size()
            runs, run, run_bytes = [], [], 0
            for j in js:
                nbytes = self._params[j].numel() * itemsize
                if run and run_bytes + nbytes > cap_bytes:
                    runs.append(run)
                    run, run_bytes = [], 0
                run.append(j)
                run_bytes += nbytes
            runs.append(run)
            base, shard_off = 0, 0
            for run in runs:
                entries, off = [], 0
                for j in run:
                    p = self._params[j]
                    entries.append((p, j, off, p.numel()))
                    off += p.numel()
                b = _Bucket(len(self._buckets), dtype, base, entries, self.shard_size)
                b.shard_off = shard_off
                self._buckets.append(b)
                base += b.padded
                shard_off += b.chunk
            flat = torch.zeros(base, dtype=dtype)
            with torch.no_grad():
                for b in (b for b in self._buckets if b.dtype == dtype):
                    for p, j, off, numel in b.entries:
                        view = flat[b.base + off:b.base + off + numel]
                        view.copy_(p.detach().reshape(-1))
                        p.data = view.view(p.shape)
                        self._bucket_of[id(p)] = (b, off)
            self._flat[dtype] = flat

    def _pieces_for(self, m):
        """Member m's slices of the buffers, one per (bucket, param group) it touches, in
        the inner optimizer's order (group, then bucket). A piece is a dict with its
        group, bucket and bucket range, and segments [j, offset in param j, offset in
        the piece, length]."""
        pieces = []
        for b in self._buckets:
            own0, own1 = m * b.chunk, min((m + 1) * b.chunk, b.numel)
            runs = {}
            for p, j, off, numel in b.entries:
                runs.setdefault(self._group_of[id(p)], []).append((j, off, numel))
            for g, entries in runs.items():
                lo = max(own0, entries[0][1])
                hi = min(own1, entries[-1][1] + entries[-1][2])
                if lo >= hi:
                    continue
                segs = [[j, max(lo, off) - off, max(lo, off) - lo,
                         min(hi, off + numel) - max(lo, off)]
                        for j, off, numel in entries if off < hi and off + numel > lo]
                pieces.append({"group": g, "bucket": b.index, "start": lo, "end": hi,
                               "dtype": _dtype_name(b.dtype), "segments": segs})
        pieces.sort(key=lambda pc: (pc["group"], pc["bucket"]))
        return pieces

    def _make_inner(self, optimizer):
        """The wrapped optimizer's class over this rank's slices, with its hyperparams."""
        groups = [dict(g, params=[]) for g in self.param_groups]
        for pc in self._pieces:
            b = self._buckets[pc["bucket"]]
            t = self._flat[b.dtype][b.base + pc["start"]:b.base + pc["end"]]
            g0 = b.shard_off + pc["start"] - self.shard_rank * b.chunk
            t.grad = self._shard_grad[b.dtype][g0:g0 + pc["end"] - pc["start"]]
            groups[pc["group"]]["params"].append(t)
        if not any(g["params"] for g in groups):
            # This rank owns only padding: give the optimizer something to hold.
            groups[0]["params"].append(torch.zeros(0))
        cls = type(optimizer)
        accepted = inspect.signature(cls.__init__).parameters
        return cls(groups, **{k: v for k, v in optimizer.defaults.items() if k in accepted})

    # ------------------------------------------------------------- gradients

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
        for other in self._buckets:       # free the staging of reductions already done
            if other.pending is not None and (other.pending[0] is None
                                              or C.poll(other.pending[0])):
                self._collect(other)

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

    # ------------------------------------------------------------- optimizer API

    @contextmanager
    def skip_synchronize(self):
        """Make step() skip its synchronize(), after an explicit one."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        """Finish the reductions (unless synchronize() or clip_grad_norm_() already
        did), step the wrapped optimizer on this rank's shard, and all-gather the updated
        parameters."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._should_synchronize and not self._synchronized:
            self.synchronize()
        elif not self._synchronized:
            raise AssertionError("step() inside skip_synchronize() needs an explicit "
                                 "optimizer.synchronize() first")
        self._synchronized = False
        if self.stage == 1:
            self._shard_from_grads()
        for outer, inner in zip(self.param_groups, self._inner.param_groups):
            inner.update({k: v for k, v in outer.items() if k != "params"})
        self._inner.step()
        if self.partition_set is not None:
            # every bucket's owned chunk is gathered straight into the flat parameters
            handles = []
            for b in self._buckets:
                full = self._flat[b.dtype][b.base:b.base + b.padded]
                own = full[self.shard_rank * b.chunk:(self.shard_rank + 1) * b.chunk]
                handles.append(_allgather_into(own, full, f"{self._uid}.params.{b.index}",
                                               self.partition_set))
            request.wait_all(handles, _ops.synchronize)
        return loss

    def zero_grad(self, set_to_none=True):
        if self._passes or self._launched or self._in_pass:
            raise AssertionError(_IN_FLIGHT_MSG)
        return super().zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group):
        if getattr(self, "_inner", None) is not None:
            raise NotImplementedError("ShardedDistributedOptimizer cannot add parameter "
                                      "groups after it is built; build a new one")
        return super().add_param_group(param_group)

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = arguments.backward_passes(passes)

    def state_bytes(self):
        """Bytes of optimizer state held by this rank."""
        return sum(v.numel() * v.element_size() for s in self._inner.state.values()
                   for v in s.values() if isinstance(v, torch.Tensor))

    def gradient_bytes(self):
        """Bytes of gradients this rank keeps between steps: the reduced shard, and
        p.grad (stage 1)."""
        grads = [g for g in self._shard_grad.values()] + [p.grad for p in self._params
                                                         if p.grad is not None]
        return sum(g.numel() * g.element_size() for g in grads)

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
        dtype = next(iter(self._flat), torch.float32)
        return total.to(dtype)

    # ------------------------------------------------------------- state dicts

    def _layout(self):
        return {"shard_size": self.shard_size, "set_size": self.replicas * self.shard_size,
                "shard_rank": self.shard_rank, "stage": self.stage,
                "param_shapes": [list(p.shape) for p in self._params],
                "param_names": [self._name(p) for p in self._params],
                "pieces": self._pieces}

    def _groups_out(self):
        out, j = [], 0
        for g in self.param_groups:
            d = {k: v for k, v in g.items() if k != "params"}
            d["params"] = list(range(j, j + len(g["params"])))
            j += len(g["params"])
            out.append(d)
        return out

    def state_dict(self):
        """This rank's shard of the optimizer state, with the layout it was cut by:
        load it back into the same layout, or pass every member's (of one partition
        group) to load_state_dict() to reshard."""
        inner = self._inner.state_dict()
        return {"format": FORMAT, "layout": self._layout(),
                "state": {i: s for i, s in inner["state"].items() if i < len(self._pieces)},
                "param_groups": self._groups_out()}

    def consolidated_state_dict(self, root_rank=0):
        """A plain torch optimizer state dict (what the wrapped optimizer's state_dict()
        would be, loadable into it) on root_rank (a global rank), gathered from its
        partition group; None on the other ranks. Every rank of the set calls it."""
        ps = self.process_set
        base = list(ps.ranks) if ps.process_set_id != 0 else list(range(basics.size()))
        if root_rank not in base:
            raise ValueError(f"consolidated_state_dict: root rank {root_rank} is not a "
                             f"member of {ps!r}")
        root_partition = base.index(root_rank) // self.shard_size
        if root_partition != self.partition_index:
            return None
        mine = self.state_dict()
        if self.partition_set is None:
            shards = [mine]
        else:
            root = base.index(root_rank) % self.shard_size
            blobs = _gather_blobs(_blob({"layout": mine["layout"], "state": mine["state"]}),
                                  root, self.partition_set, self.shard_rank,
                                  f"{self._uid}.consolidate")
            if blobs is None:
                return None
            shards = [_unblob(x) for x in blobs]
        return {"state": _consolidate(shards, self._params),
                "param_groups": self._groups_out()}

    def load_state_dict(self, state_dict):
        """Load a consolidated (plain torch) state dict, this layout's own state_dict(),
        or a list of the state_dict()s of every member of one partition group saved
        with any shard size or world size (resharded here)."""
        if self._passes or self._launched or self._in_pass:
            raise AssertionError("load_state_dict() while gradients are being reduced; "
                                 "call it before backward or after step()")
        if isinstance(state_dict, (list, tuple)):
            for sd in state_dict:
                _check_sharded(sd)
            groups = state_dict[0]["param_groups"] if state_dict else None
            state_dict = {"state": _consolidate(list(state_dict), self._params),
                          "param_groups": groups}
        elif isinstance(state_dict, dict) and state_dict.get("format") == FORMAT:
            _check_sharded(state_dict)
            if state_dict["layout"]["pieces"] != self._pieces:
                lay = state_dict["layout"]
                raise ValueError(
                    f"this shard was cut for shard_size={lay['shard_size']} of "
                    f"{lay['set_size']} ranks (member {lay['shard_rank']}); this "
                    f"optimizer is member {self.shard_rank} with shard_size="
                    f"{self.shard_size} of {self.replicas * self.shard_size}. To reshard, "
                    f"pass the list of state_dict()s of every member of one partition "
                    f"group, or a consolidated_state_dict()")
            self._load({i: {k: v.clone() if isinstance(v, torch.Tensor) else v
                            for k, v in s.items()} for i, s in state_dict["state"].items()},
                       state_dict["param_groups"])
            return
        if not isinstance(state_dict, dict) or "state" not in state_dict \
                or "param_groups" not in state_dict:
            raise ValueError("load_state_dict expects a torch optimizer state dict, a "
                             "ShardedDistributedOptimizer.state_dict() or a list of them")
        self._load(self._slice(state_dict["state"]), state_dict["param_groups"])

    def _check_groups(self, groups):
        if groups is None:
            return
        if len(groups) != len(self.param_groups) or any(
                len(g["params"]) != len(o["params"]) for g, o in zip(groups,
                                                                     self.param_groups)):
            raise ValueError("loaded state dict has a different number of parameter groups "
                             "or parameters than this optimizer")

    def _load(self, piece_state, groups):
        self._check_groups(groups)
        if groups is not None:
            for outer, g in zip(self.param_groups, groups):
                outer.update({k: v for k, v in g.items() if k != "params"})
        inner_groups = []
        i = 0
        for outer, inner in zip(self.param_groups, self._inner.param_groups):
            d = {k: v for k, v in outer.items() if k != "params"}
            d["params"] = list(range(i, i + len(inner["params"])))
            i += len(inner["params"])
            inner_groups.append(d)
        self._inner.load_state_dict({"state": dict(piece_state), "param_groups": inner_groups})

    def _slice(self, state):
        """This rank's pieces of a consolidated state ({param index: {key: value}})."""
        out = {}
        for i, pc in enumerate(self._pieces):
            have = [(seg, state[seg[0]]) for seg in pc["segments"] if seg[0] in state]
            if not have:
                continue
            piece = {}
            for key in dict.fromkeys(k for _, s in have for k in s):
                sample_seg, sample = next((seg, s[key]) for seg, s in have if key in s)
                p = self._params[sample_seg[0]]
                if _elementwise(key, sample, p.shape):
                    parts = []
                    for j, poff, _, n in pc["segments"]:
                        v = state.get(j, {}).get(key)
                        if v is None:
                            parts.append(torch.zeros(n, dtype=sample.dtype))
                        else:
                            if tuple(v.shape) != tuple(self._params[j].shape):
                                raise ValueError(
                                    f"state {key!r} of parameter {j} "
                                    f"({self._name(self._params[j])}) has shape "
                                    f"{tuple(v.shape)}; the parameter has "
                                    f"{tuple(self._params[j].shape)}")
                            parts.append(v.detach().reshape(-1)[poff:poff + n])
                    piece[key] = torch.cat(parts).clone()
                else:
                    piece[key] = sample.clone() if isinstance(sample, torch.Tensor) \
                        else sample
            out[i] = piece
        return out

    def broadcast_state(self, root_rank):
        """hvd.broadcast_optimizer_state for a sharded optimizer: the hyperparameters of
        root_rank, and every rank's shard from the member of root_rank's partition group
        that holds the same slice (over the replica group)."""
        ps = self.process_set
        base = list(ps.ranks) if ps.process_set_id != 0 else list(range(basics.size()))
        if root_rank not in base:
            raise ValueError(f"broadcast_optimizer_state: root rank {root_rank} is not a "
                             f"member of {ps!r}")
        hyper = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
        is_root = basics.rank() == root_rank
        blob = _broadcast_blob(_blob(hyper) if is_root else None, root_rank, ps,
                               f"{self._uid}.bcast.hyper")
        groups = _unblob(blob)
        state = None
        if self.replica_set is not None:
            src = base[(base.index(root_rank) // self.shard_size) * self.shard_size
                       + self.shard_rank]
            mine = self.state_dict()["state"] if basics.rank() == src else None
            blob = _broadcast_blob(_blob(mine) if mine is not None else None, src,
                                   self.replica_set, f"{self._uid}.bcast.state")
            state = _unblob(blob)
        self._load(state if state is not None else self.state_dict()["state"],
                   [dict(g, params=o["params"]) for g, o in zip(groups, self.param_groups)])

    def __repr__(self):
        return (f"ShardedDistributedOptimizer({self.optimizer_class.__name__}, "
                f"stage={self.stage}, shard_size={self.shard_size}, "
                f"replicas={self.replicas})")


# ------------------------------------------------------------------ helpers

def _check_optimizer(optimizer):
    if isinstance(optimizer, (_DistributedOptimizer, ShardedDistributedOptimizer)):
        raise ValueError("ShardedDistributedOptimizer wraps a plain torch.optim optimizer, "
                         "not one already wrapped by horovodlike")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"ShardedDistributedOptimizer expects a torch.optim.Optimizer, "
                        f"got {type(optimizer).__name__}")
    if type(optimizer) not in ELEMENTWISE_OPTIMIZERS:
        names = ", ".join(c.__name__ for c in ELEMENTWISE_OPTIMIZERS)
        raise ValueError(
            f"ShardedDistributedOptimizer cannot shard {type(optimizer).__name__}: it "
            f"splits every parameter into slices, which is exact only for element-wise "
            f"optimizers ({names}). {type(optimizer).__name__} is not one of them (its "
            f"update may need whole tensors, as LBFGS, Adafactor, Muon and trust-ratio "
            f"optimizers do); use hvd.DistributedOptimizer for it")


def _check_sharded(sd):
    if not isinstance(sd, dict) or sd.get("format") != FORMAT or "layout" not in sd:
        raise ValueError("expected ShardedDistributedOptimizer.state_dict()s")


def _elementwise(key, value, shape):
    """Whether a state entry holds one value per element of its parameter (or piece)."""
    return isinstance(value, torch.Tensor) and key != "step" \
        and tuple(value.shape) == tuple(shape)


def _consolidate(shards, params):
    """{param index: {key: value}} (a plain optimizer's 'state') from the shard states
    of every member of one partition group, each {'layout': ..., 'state': ...}."""
    if not shards:
        raise ValueError("no shards to load")
    lay0 = shards[0]["layout"]
    shapes = [list(p.shape) for p in params]
    if lay0["param_shapes"] != shapes:
        raise ValueError(f"the shards were saved for parameters of shapes "
                         f"{lay0['param_shapes']}, this optimizer has {shapes}")
    members = sorted(s["layout"]["shard_rank"] for s in shards)
    if members != list(range(lay0["shard_size"])) or any(
            s["layout"]["shard_size"] != lay0["shard_size"] or
            s["layout"]["param_shapes"] != shapes for s in shards):
        raise ValueError(f"need the state of every member 0..{lay0['shard_size'] - 1} of "
                         f"one partition group, saved together; got members {members}")
    state, filled = {}, {}
    for sd in shards:
        for i, pc in enumerate(sd["layout"]["pieces"]):
            ps = sd["state"].get(i)
            if not ps:
                continue
            for key, v in ps.items():
                elem = _elementwise(key, v, (pc["end"] - pc["start"],))
                for j, poff, off, n in pc["segments"]:
                    if not 0 <= j < len(params) or poff < 0 or off < 0 or n <= 0 or \
                            poff + n > params[j].numel():
                        raise ValueError(f"bad segment {[j, poff, off, n]} in a shard")
                    st = state.setdefault(j, {})
                    if not elem:
                        st.setdefault(key, v.clone() if isinstance(v, torch.Tensor) else v)
                        continue
                    if key not in st:
                        st[key] = torch.zeros(params[j].numel(), dtype=v.dtype)
                    st[key][poff:poff + n] = v[off:off + n]
                    filled[(j, key)] = filled.get((j, key), 0) + n
    for (j, key), n in filled.items():
        if n != params[j].numel():
            raise ValueError(f"the shards cover {n} of {params[j].numel()} elements of "
                             f"state {key!r} of parameter {j}")
        state[j][key] = state[j][key].view(params[j].shape)
    return state
