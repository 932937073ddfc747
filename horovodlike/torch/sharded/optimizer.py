"""The ShardedDistributedOptimizer class: its arguments, its set-up (the groups' process
sets, the layout, the wrapped optimizer rebuilt over this rank's slices) and the
torch.optim.Optimizer API. The gradient pipeline and the state dicts are its mixins
(gradients.py, state.py); the layout is layout.py's.

Only element-wise optimizers can be split by slice (the update of an element depends on
that element's gradient and state alone); the others are refused by name.
"""
import inspect
import itertools
from contextlib import contextmanager

import torch

from horovodlike.common import arguments, basics

from .. import _collectives as C
from .._process_sets import global_process_set, resolve
from ..compression import Compression
from ..optimizer import (_IN_FLIGHT_MSG, _DistributedOptimizer, check_named_parameters,
                         mark_reduced)
from .gradients import GradientPipeline
from .layout import Layout, partition_ranks, set_of
from .state import StateDicts
from .units import Stage3, UnitLayout

# Optimizers whose update of every element reads only that element's gradient and state
# (plus per-tensor scalars such as the step count, equal over a tensor's slices).
ELEMENTWISE_OPTIMIZERS = tuple(getattr(torch.optim, n) for n in (
    "SGD", "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad", "Adadelta",
    "Rprop", "ASGD") if hasattr(torch.optim, n))

DEFAULT_BUCKET_CAP_MB = 4.0

_instances = itertools.count()     # numbers optimizers in creation order, same on all ranks


class ShardedDistributedOptimizer(Stage3, GradientPipeline, StateDicts, torch.optim.Optimizer):
    """Wrap an element-wise torch.optim optimizer so that its state (stage 1) and the
    reduced gradients (stage 2) are sharded over partition groups of shard_size ranks,
    and replicated across them.

    optimizer: SGD, Adam, AdamW, Adamax, NAdam, RAdam, RMSprop, Adagrad, Adadelta, Rprop
        or ASGD (others are refused: their updates need whole tensors).
    named_parameters: (name, parameter) pairs, usually model.named_parameters().
    stage: 1 shards the optimizer state and leaves the averaged gradients in p.grad after
        synchronize(); 2 (default) keeps only this rank's reduced gradient shard; 3 also
        shards the parameters: each unit of `model` is gathered only while it computes
        (units.py).
    model: stage 3 only, the module whose parameters these are (it gets the hooks).
    units: stage 3 only, the modules to gather as one (default: every module holding
        parameters of its own), e.g. one per transformer block.
    init: stage 3 only, for a model built on the meta device: a function initialising a
        module, as model.apply(init) would (default: each module's reset_parameters());
        each rank initialises one unit at a time and keeps its shard (materialize.py).
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
                 process_set=global_process_set, bucket_cap_mb=DEFAULT_BUCKET_CAP_MB,
                 model=None, units=None, init=None):
        _check_optimizer(optimizer)
        if stage not in (1, 2, 3) or isinstance(stage, bool):
            raise ValueError(f"stage must be 1 (shard optimizer state), 2 (also "
                             f"gradients) or 3 (also parameters), got {stage!r}")
        if stage == 3 and not isinstance(model, torch.nn.Module):
            raise ValueError("stage=3 needs model=, the nn.Module whose parameters the "
                             "optimizer holds: its units are gathered around their forwards")
        if stage != 3 and (model is not None or units is not None or init is not None):
            raise ValueError("model=, units= and init= are for stage=3 only")
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
        part_sets = [set_of(g, ps, base_ranks) for g in parts]
        replica_sets = [set_of(g, ps, base_ranks) for g in replicas]
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
            if (p.device.type != "cpu" and not (stage == 3 and p.is_meta)) or p.is_sparse:
                raise ValueError(f"ShardedDistributedOptimizer: parameter {self._name(p)!r} "
                                 f"is not a dense CPU tensor")
        if stage == 3:
            layout = UnitLayout(model, units, self._params, self._group_of, shard_size,
                                self.shard_rank, self._name, init)
            self._adopt(layout.replaced)
        else:
            layout = Layout(self._params, self._group_of, shard_size,
                            int(bucket_cap_mb * (1 << 20)))
        self._units_layout = layout
        self._buckets, self._flat, self._bucket_of = layout.buckets, layout.flat, \
            layout.bucket_of
        self._pieces = layout.pieces(self.shard_rank)   # this rank's slices, in order
        self._shard_grad = {d: torch.zeros(sum(b.chunk for b in self._buckets
                                               if b.dtype == d), dtype=d)
                            for d in {b.dtype for b in self._buckets}}
        self._inner = self._make_inner(optimizer)

        self._passes = 0                  # backward passes reduced since the last step
        self._in_pass = False             # a backward pass is running (callback queued)
        self._launched = set()            # buckets reduced in the running pass
        self._synchronized = False
        self._should_synchronize = True
        self._hook_handles = [p.register_post_accumulate_grad_hook(self._make_hook(p))
                              for b in self._buckets for p, *_ in b.entries]
        mark_reduced([p for b in self._buckets for p, *_ in b.entries], self)
        if stage == 3:
            self._setup_units()
        if optimizer.state:               # e.g. loaded from a checkpoint before wrapping
            self.load_state_dict(optimizer.state_dict())

    # ------------------------------------------------------------- set-up

    def _name(self, p):
        return self._names.get(id(p), f"param.{self._group_of.get(id(p))}")

    def _adopt(self, replaced):
        """Stage 3 built the parameters of a meta model: they take the meta ones' place
        in the param groups, the names and the group map."""
        if not replaced:
            return
        for g in self.param_groups:
            g["params"] = [replaced.get(id(p), p) for p in g["params"]]
        for old, new in replaced.items():
            self._names[id(new)] = self._names.pop(old, None) or self._name(new)
            self._group_of[id(new)] = self._group_of.pop(old)

    def _make_inner(self, optimizer):
        """The wrapped optimizer's class over this rank's slices, with its hyperparams."""
        groups = [dict(g, params=[]) for g in self.param_groups]
        for pc in self._pieces:
            b = self._buckets[pc["bucket"]]
            g0 = b.shard_off + pc["start"] - self.shard_rank * b.chunk
            t = self._units_layout.shard[b.dtype][g0:g0 + pc["end"] - pc["start"]] \
                if self.stage == 3 else self._flat[b.dtype][b.base + pc["start"]:
                                                           b.base + pc["end"]]
            t.grad = self._shard_grad[b.dtype][g0:g0 + pc["end"] - pc["start"]]
            groups[pc["group"]]["params"].append(t)
        if not any(g["params"] for g in groups):
            # This rank owns only padding: give the optimizer something to hold.
            groups[0]["params"].append(torch.zeros(0))
        cls = type(optimizer)
        accepted = inspect.signature(cls.__init__).parameters
        return cls(groups, **{k: v for k, v in optimizer.defaults.items() if k in accepted})

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
        if self.stage != 3:               # stage 3 gathers each unit when it runs
            self._gather_parameters()
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

    def __repr__(self):
        return (f"ShardedDistributedOptimizer({self.optimizer_class.__name__}, "
                f"stage={self.stage}, shard_size={self.shard_size}, "
                f"replicas={self.replicas})")


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
