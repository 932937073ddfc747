"""Stage 3: the parameters themselves are sharded. Each unit's parameters live in one
flat buffer that exists in full only while the unit computes; between times each member
of a partition group keeps only its own contiguous 1/S of it (its shard).

Units. By default every module that holds parameters of its own is a unit; units=[...]
names modules instead (one per transformer block, say), and a unit then holds every
parameter under its module that no nested named unit holds; outside the named units,
each module holding parameters of its own is a unit, as by default. A parameter reachable from two units (tied weights)
merges them into one unit, gathered whenever either module runs.

One step, for a unit of B bytes in a partition group of S ranks:

  forward   before the unit's forward its buffer is all-gathered from the members'
            shards ((S-1)/S * B received per rank) and after it freed;
  backward  when the gradient of the unit's output arrives (a hook on the output,
            which autograd runs before the unit's own backward) it is all-gathered
            again; once every parameter's gradient has been accumulated, the gradients
            are reduce-scattered as stage 2 does (gradients.py) and the buffer freed;
  step      the wrapped optimizer updates the shards; nothing is gathered (the next
            forward gathers what it needs).

So a rank holds P/S parameter bytes between steps, plus, while a unit computes, that
unit in full: at most the two largest units during forward, and in backward the unit
whose gradients are being reduced besides the one computing. Traffic per step is 3 (S-1)/S
* P per rank inside the partition group (two gathers, one reduce-scatter), against 2
(S-1)/S * P for stage 2; across partition groups (MiCS) only the shard's allreduce, as
stage 2.

The full buffer is freed by shrinking its storage to nothing and refilled in place, so
the parameters stay views of it and what autograd saved in forward sees the gathered
values again in backward; the engine writes the gathered bytes straight into it.
"""
import contextlib

import torch
import torch.utils._pytree as pytree

from horovodlike.common import ops as _ops
from horovodlike.common.exceptions import HorovodInternalError

from . import materialize
from .gradients import _allgather_into
from .layout import Bucket, Layout


def find_units(model, units):
    """[(name, [modules], [params])] in module order: the units of `model` (module
    docstring), tied parameters merged, each parameter in exactly one unit."""
    names = {m: n for n, m in model.named_modules()}
    if units is None:
        chosen = [m for m in model.modules()
                  if any(p.requires_grad for p in m.parameters(recurse=False))]
    else:
        chosen = list(units)
        for m in chosen:
            if not isinstance(m, torch.nn.Module) or m not in names:
                raise ValueError(f"units: {m!r} is not a module of the model")
        # what no named unit holds: each module holding parameters of its own outside
        # them is a unit, as by default (so that no unit spans the whole forward)
        under = {d for u in chosen for d in u.modules()}
        chosen += [m for m in model.modules() if m not in under and
                   any(p.requires_grad for p in m.parameters(recurse=False))]
    chosen_set = set(chosen)
    order = [m for m in model.modules() if m in chosen_set]

    def claimed(m):
        """m's parameters that no nested unit holds."""
        out = [p for p in m.parameters(recurse=False) if p.requires_grad]
        for c in m.children():
            if c not in chosen_set:
                out += claimed(c)
        return out

    # one group per unit module; a parameter two of them claim (tied) joins their groups
    group = list(range(len(order)))

    def root(i):
        while group[i] != i:
            i = group[i]
        return i

    first, params_of = {}, {}
    for i, m in enumerate(order):
        for p in claimed(m):
            if id(p) in first:
                a, b = root(first[id(p)]), root(i)
                group[max(a, b)] = min(a, b)
            else:
                first[id(p)] = i
                params_of.setdefault(i, []).append(p)
    out = {}
    for i, m in enumerate(order):
        mods, ps = out.setdefault(root(i), ([], []))
        mods.append(m)
        ps.extend(params_of.get(i, []))
    return [(" + ".join(names[m] or "<model>" for m in mods), mods, ps)
            for _, (mods, ps) in sorted(out.items()) if ps]


class Unit(Bucket):
    """A bucket (layout.py) that is one unit: its own flat buffer (`full`), freed
    between uses, and the modules whose forwards need it."""

    def __init__(self, index, dtype, name, modules, entries, shard_size):
        super().__init__(index, dtype, 0, entries, shard_size)
        self.name, self.modules = name, modules
        self.full = None                  # made at its first filling (UnitLayout.refill)
        self.gathered = False
        self.fetching = None              # its all-gather's handle while in flight
        self.users = 0                    # forwards of its modules under way


class UnitLayout(Layout):
    """Layout's fields (buckets, bucket_of, pieces) with one bucket per unit and dtype,
    each over a buffer of its own; the owned chunks live in `shard` (per dtype, laid out
    as the gradient shard: bucket after bucket). Units are filled one at a time, from
    the parameters' values or, for a model built on the meta device, by initialising
    them (materialize.py), so that at most a unit is in full at once."""

    def __init__(self, model, units, params, group_of, shard_size, shard_rank, name_of,
                 init=None):
        self.params, self.group_of, self.shard_size = params, group_of, shard_size
        self.shard_rank = shard_rank
        index = {id(p): j for j, p in enumerate(params)}
        self.buckets, self.bucket_of, self.flat = [], {}, {}
        for name, mods, ps in find_units(model, units):
            for p in ps:
                if id(p) not in index:
                    raise ValueError(f"stage 3: parameter {name_of(p)!r} of unit {name!r} "
                                     f"is not in the optimizer; give the optimizer every "
                                     f"trainable parameter of the model")
            by_dtype = {}
            for p in ps:
                by_dtype.setdefault(p.dtype, []).append(p)
            for dtype, dps in by_dtype.items():
                entries, off = [], 0
                for p in dps:
                    entries.append((p, index[id(p)], off, p.numel()))
                    off += p.numel()
                self.buckets.append(Unit(len(self.buckets), dtype, name, mods, entries,
                                         shard_size))
        held = {id(e[0]) for b in self.buckets for e in b.entries}
        missing = [name_of(p) for p in params if p.requires_grad and id(p) not in held]
        if missing:
            raise ValueError(f"stage 3: parameters {missing} belong to no module of the "
                             f"model; stage 3 shards the model's own parameters")
        offs = {}
        for b in self.buckets:
            b.shard_off = offs.get(b.dtype, 0)
            offs[b.dtype] = b.shard_off + b.chunk
        self.shard = {d: torch.zeros(n, dtype=d) for d, n in offs.items()}
        self.replaced = materialize.fill(model, self, init)  # {id(meta param): new}
        for b in self.buckets:
            for p, j, off, numel in b.entries:
                self.bucket_of[id(p)] = (b, off)

    def own(self, b):
        """Bucket b's chunk of this layout's shard."""
        return self.shard[b.dtype][b.shard_off:b.shard_off + b.chunk]

    def refill(self, b):
        """b's buffer in full again (its contents undefined), the same tensor each time
        so that the parameters stay views of it."""
        if b.full is None:
            b.full = torch.empty(b.padded, dtype=b.dtype)
        else:
            b.full.untyped_storage().resize_(b.padded * b.full.element_size())
        b.gathered = True

    def drop(self, b):
        b.full.untyped_storage().resize_(0)
        b.gathered = False

    @torch.no_grad()
    def keep_own(self, b):
        """The unit is filled: keep this member's chunk of it, and free it."""
        r = self.shard_rank
        self.own(b).copy_(b.full[r * b.chunk:(r + 1) * b.chunk])
        b.full.untyped_storage().resize_(0)
        b.gathered = False


class Stage3:
    """Methods of ShardedDistributedOptimizer for stage 3: the units' hooks, gathering
    and freeing (a mixin; it uses _units_layout, _buckets, partition_set, shard_rank, _uid)."""

    def _setup_units(self):
        self._unit_of_module = {}
        for b in self._buckets:
            for m in b.modules:
                self._unit_of_module.setdefault(m, []).append(b)
        for m in self._unit_of_module:
            self._hook_handles.append(m.register_forward_pre_hook(self._before_forward))
            self._hook_handles.append(m.register_forward_hook(self._after_forward))
        # Prefetch: the order units ran in (indices), recorded in each forward and
        # followed in the next: while unit k computes, unit k+1's gather runs on the
        # engine's thread (in backward, unit k-1's).
        self._order, self._seen, self._new_pass = [], [], False
        self._prefetching = True

    @contextlib.contextmanager
    def full_parameters(self, writeback=True):
        """Every unit gathered in full for the block (evaluation, reading or saving the
        model); with writeback, changes made to the parameters inside it are kept (each
        member takes its own chunk back). Every member of the set must enter it."""
        if self.stage != 3:
            yield
            return
        for b in self._buckets:
            self._gather_unit(b)
            b.users += 1
        try:
            yield
        finally:
            for b in self._buckets:
                b.users -= 1
                if writeback:
                    with torch.no_grad():
                        self._units_layout.own(b).copy_(b.full[self.shard_rank * b.chunk:
                                                         (self.shard_rank + 1) * b.chunk])
                self._free_unit(b)

    def _gathered_bytes(self):
        return sum(b.full.untyped_storage().nbytes() for b in self._buckets
                   if b.full is not None)

    def parameter_bytes(self):
        """Parameter bytes this rank holds now: its shards, and the units in full."""
        return sum(s.numel() * s.element_size() for s in self._units_layout.shard.values()) + \
            self._gathered_bytes()

    def _start_gather(self, b):
        """Refill b's storage and start its all-gather, unless it is there or coming."""
        if b.gathered:
            return
        self._units_layout.refill(b)
        if self.partition_set is None:     # a partition group of one: the shard is all
            with torch.no_grad():
                b.full.copy_(self._units_layout.own(b))
            return
        b.fetching = _allgather_into(self._units_layout.own(b), b.full,
                                     f"{self._uid}.unit.{b.name}.{b.index}", self.partition_set)

    def _wait_gather(self, b):
        if b.fetching is None:
            return
        handle, b.fetching = b.fetching, None
        try:
            _ops.synchronize(handle)
        except HorovodInternalError as e:
            if "deadlock" not in str(e):
                raise
            raise HorovodInternalError(
                f"ShardedDistributedOptimizer (stage 3), gathering unit {b.name!r}: {e} "
                f"Every rank of the partition group must run the same units in the same "
                f"order: a forward that skips a unit on some ranks, or runs them in "
                f"another order, cannot be sharded") from e

    def _gather_unit(self, b):
        self._start_gather(b)
        self._wait_gather(b)

    def _free_unit(self, b):
        if not b.gathered or b.users:
            return
        self._wait_gather(b)           # the engine may be writing into it: let it finish
        b.full.untyped_storage().resize_(0)
        b.gathered = False

    def _prefetch(self, k):
        """Start gathering the unit at position k of the recorded forward order."""
        if self._prefetching and 0 <= k < len(self._order):
            b = self._buckets[self._order[k]]
            if b.index not in self._launched:
                self._start_gather(b)

    def _pass_ended(self):
        """A backward pass has ended: the next forward records the order afresh."""
        self._new_pass = True

    def _before_forward(self, module, args):
        if self._new_pass:                # the previous pass's order is the one to follow
            self._new_pass = False
            self._order, self._seen = self._seen or self._order, []
        for b in self._unit_of_module[module]:
            if b.index not in self._seen:
                self._seen.append(b.index)
            self._gather_unit(b)
            b.users += 1
        if self._order[:len(self._seen)] == self._seen:   # the order holds so far
            self._prefetch(len(self._seen))

    def _after_forward(self, module, args, output):
        units = self._unit_of_module[module]
        for b in units:
            b.users -= 1
            self._free_unit(b)
        if torch.is_grad_enabled():
            flat, _ = pytree.tree_flatten(output)
            for t in flat:
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(self._before_backward(units))
        return output

    def _before_backward(self, units):
        def hook(grad):
            for b in units:
                if b.index not in self._launched:
                    self._gather_unit(b)
            # backward runs the forward order backwards: the unit before comes next
            at = min(self._order.index(b.index) for b in units
                     if b.index in self._order) if self._order else -1
            self._prefetch(at - 1)
            return grad
        return hook
