"""Which rank owns what: the partition and replica groups, the buckets of the flat
parameter buffers, and the pieces of them each member of a partition group owns.

The ranks of the process set (n of them) are split into n / S partition groups of
S = shard_size consecutive ranks; rank i of every partition group belongs to replica
group i (partition_ranks, set_of).

Layout. The trainable parameters are kept in one flat buffer per dtype (each parameter's
.data becomes a view into it). A buffer is a run of buckets of whole parameters, in the
reverse of the optimizer's order (the order backward produces gradients); each bucket is
padded to a multiple of S, and member m of a partition group owns the m-th contiguous
1/S of every bucket (with one bucket, a contiguous 1/S of the whole buffer). The wrapped
optimizer is rebuilt over the owned slices, so its state holds 1/S of the elements.
"""
import torch

from horovodlike.common import basics, dynamic_sets
from horovodlike.common import process_sets as _sets

from .._process_sets import global_process_set


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


def set_of(ranks, base, base_ranks):
    """The registered process set with exactly these ranks; None for one rank, which
    needs no collective. A set not registered yet is added when the optimizer spans
    every rank (which may add sets, with or without dynamic sets). Every rank calls
    this for the same groups in the same order."""
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


# ------------------------------------------------------------------ buckets

class Bucket:
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


def dtype_name(dtype):
    return str(dtype).rsplit(".", 1)[-1]


class Layout:
    """The flat buffers and their buckets (built once, from the parameters)."""

    def __init__(self, params, group_of, shard_size, cap_bytes):
        """Buckets of whole trainable parameters per dtype, in reverse optimizer order;
        every parameter's .data becomes a view into its dtype's flat buffer.
        params: the optimizer's parameters in order; group_of: id(param) -> its
        param group's index."""
        self.params, self.group_of, self.shard_size = params, group_of, shard_size
        by_dtype = {}
        for j in reversed(range(len(self.params))):
            p = self.params[j]
            if p.requires_grad:
                by_dtype.setdefault(p.dtype, []).append(j)
        self.buckets, self.flat, self.bucket_of = [], {}, {}
        for dtype, js in by_dtype.items():
            itemsize = torch.empty(0, dtype=dtype).element_size()
            runs, run, run_bytes = [], [], 0
            for j in js:
                nbytes = self.params[j].numel() * itemsize
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
                    p = self.params[j]
                    entries.append((p, j, off, p.numel()))
                    off += p.numel()
                b = Bucket(len(self.buckets), dtype, base, entries, self.shard_size)
                b.shard_off = shard_off
                self.buckets.append(b)
                base += b.padded
                shard_off += b.chunk
            flat = torch.zeros(base, dtype=dtype)
            with torch.no_grad():
                for b in (b for b in self.buckets if b.dtype == dtype):
                    for p, j, off, numel in b.entries:
                        view = flat[b.base + off:b.base + off + numel]
                        view.copy_(p.detach().reshape(-1))
                        p.data = view.view(p.shape)
                        self.bucket_of[id(p)] = (b, off)
            self.flat[dtype] = flat

    def pieces(self, m):
        """Member m's slices of the buffers, one per (bucket, param group) it touches, in
        the inner optimizer's order (group, then bucket). A piece is a dict with its
        group, bucket and bucket range, and segments [j, offset in param j, offset in
        the piece, length]."""
        pieces = []
        for b in self.buckets:
            own0, own1 = m * b.chunk, min((m + 1) * b.chunk, b.numel)
            runs = {}
            for p, j, off, numel in b.entries:
                runs.setdefault(self.group_of[id(p)], []).append((j, off, numel))
            for g, entries in runs.items():
                lo = max(own0, entries[0][1])
                hi = min(own1, entries[-1][1] + entries[-1][2])
                if lo >= hi:
                    continue
                segs = [[j, max(lo, off) - off, max(lo, off) - lo,
                         min(hi, off + numel) - max(lo, off)]
                        for j, off, numel in entries if off < hi and off + numel > lo]
                pieces.append({"group": g, "bucket": b.index, "start": lo, "end": hi,
                               "dtype": dtype_name(b.dtype), "segments": segs})
        pieces.sort(key=lambda pc: (pc["group"], pc["bucket"]))
        return pieces
