"""DistributedOptimizer: wrap any torch.optim optimizer so that gradients are averaged
over the ranks before each step, with the reductions overlapping the backward pass.

As in Horovod, the returned object is an instance of a class made on the fly that
derives from the wrapped optimizer's class, so isinstance checks, schedulers and
state_dict() keep working. A hook on each parameter fires when its gradient has been
accumulated and starts that gradient's allreduce at once; step() waits for all of them
and then runs the wrapped optimizer's step.
"""
import warnings
import weakref
from contextlib import contextmanager

import torch

from horovodlike.common import arguments, autotune
from horovodlike.common.exceptions import TensorMismatchError
from horovodlike.common.objects import allgather_object, broadcast_object
from horovodlike.common.request import split_list

from . import _buckets
from . import _collectives as C
from ._process_sets import global_process_set, resolve
from .compression import Compression
from .powersgd import PowerSGD

_IN_FLIGHT_MSG = ("optimizer.zero_grad() was called after loss.backward() but before "
                  "optimizer.step() or optimizer.synchronize(). This is prohibited as it can "
                  "cause a race condition.")
_TOO_MANY_MSG = ("Gradients were computed more than backward_passes_per_step times before "
                 "call to step(). Increase backward_passes_per_step to accumulate gradients "
                 "locally.")


# The attribute by which a parameter names the optimizer whose hooks reduce its gradient
# (a weak reference), so a pipeline schedule given no optimizer= can find it.
_REDUCER_ATTR = "_horovodlike_reducer"


def mark_reduced(params, optimizer):
    """Record on each parameter that `optimizer`'s hooks reduce its gradient."""
    ref = weakref.ref(optimizer)
    for p in params:
        setattr(p, _REDUCER_ATTR, ref)


def reducers_of(params):
    """The live optimizers (DistributedOptimizer, ShardedDistributedOptimizer) whose
    hooks reduce the gradients of `params`, in first-seen order."""
    found = []
    for p in params:
        ref = getattr(p, _REDUCER_ATTR, None)
        opt = ref() if ref is not None else None
        if opt is not None and all(opt is not f for f in found):
            found.append(opt)
    return found


def check_named_parameters(named_parameters, param_groups):
    """The (name, parameter) pairs for `param_groups`: named_parameters checked (pairs,
    unique names, every parameter named), or made up from positions when it is None."""
    if named_parameters is not None:
        named_parameters = list(named_parameters)
    else:
        named_parameters = [(f"allreduce.noname.{i}.{j}", v)
                            for i, group in enumerate(param_groups)
                            for j, v in enumerate(group["params"])]
    if any(not isinstance(p, tuple) or len(p) != 2 for p in named_parameters):
        raise ValueError("named_parameters should be a sequence of tuples (name, "
                         "parameter), usually produced by model.named_parameters().")
    seen, dups = set(), []
    for k, _ in named_parameters:
        if k in seen and k not in dups:
            dups.append(k)
        seen.add(k)
    if dups:
        raise ValueError("Parameter names in named_parameters must be unique. Found "
                         "duplicates: %s" % ", ".join(map(str, dups)))
    named_ids = {id(v) for _, v in named_parameters}
    unnamed = [p for group in param_groups for p in group["params"]
               if id(p) not in named_ids]
    if unnamed:
        raise ValueError("named_parameters was specified, but one or more model "
                         "parameters were not named (shapes: %s). Pass every parameter "
                         "the optimizer updates, e.g. model.named_parameters()."
                         % ", ".join(str(tuple(p.shape)) for p in unnamed))
    return named_parameters


def _is_parameter(p):
    """What groups= may list (arguments.gradient_groups)."""
    return isinstance(p, torch.Tensor)


class _BucketMismatch(Exception):
    """A bucket's mismatch error, to be explained once every handle has finished."""

    def __init__(self, cause):
        super().__init__(str(cause))
        self.cause = cause


class _DistributedOptimizer:
    """Mixed in before the wrapped optimizer's class by DistributedOptimizer()."""

    def __init__(self, params, named_parameters, args, process_set=global_process_set):
        """args: the checked arguments (horovodlike.common.arguments.GradientArgs)."""
        super().__init__(params)
        compression = args.compression
        # PowerSGD is not a per-tensor compressor: it has a path of its own in
        # synchronize(); its warm-up steps reduce as with Compression.none.
        self._powersgd = compression if isinstance(compression, PowerSGD) else None
        self._compression = Compression.none if self._powersgd else compression
        named_parameters = check_named_parameters(named_parameters, self.param_groups)
        self._parameter_names = {v: k for k, v in named_parameters}
        self.backward_passes_per_step = args.backward_passes_per_step
        self._allreduce_delay = {v: args.backward_passes_per_step for _, v in named_parameters}
        self.op = args.op
        self.gradient_predivide_factor = args.gradient_predivide_factor
        self._prescale, self._postscale = args.prescale, args.postscale
        self.sparse_as_dense = args.sparse_as_dense
        self.process_set = process_set

        self._handles = {}
        self._hook_handles = []
        self._requires_update = set()
        self._synchronized = False
        self._should_synchronize = True
        self._groups = args.groups
        self._p_to_group = {}
        self._group_counts = {}
        self._buckets, self._bucket_of = [], {}
        self._densified = set()     # sparse gradients reduced as dense (sparse_as_dense)
        self._tuner = None          # the autotuner, when it counts this optimizer's steps

        ps, _ = resolve(process_set)
        if ps.included() and ps.size() > 1:
            self._register_hooks()

    # ------------------------------------------------------------- set-up

    def _name(self, p):
        return self._parameter_names.get(p)

    def _replan(self, cap):
        """The autotuner's new bucket cap (every rank, between the same two steps)."""
        if self._buckets:
            self._buckets, self._bucket_of = _buckets.plan(
                self._trainable, self._name, min(self._first_cap, cap), cap)

    def _register_hooks(self):
        trainable = [p for group in self.param_groups for p in group["params"]
                     if p.requires_grad]
        if isinstance(self._groups, int):
            # Every rank must form the same groups: order them as rank 0 does.
            names = broadcast_object([self._name(p) for p in trainable], root_rank=0,
                                     name="DistributedOptimizer.groups",
                                     process_set=self.process_set)
            order = {n: i for i, n in enumerate(names)}
            trainable.sort(key=lambda p: order.get(self._name(p), len(order)))
            p_groups = [tuple(g) for g in split_list(trainable, self._groups) if g]
        elif isinstance(self._groups, list):
            ids = {id(p) for p in trainable}
            p_groups = [tuple(p for p in g if id(p) in ids) for g in self._groups]
            p_groups = [g for g in p_groups if g]
        else:
            p_groups = []
        for group in p_groups:
            for p in group:
                self._p_to_group[p] = group
            self._group_counts[id(group)] = 0
        first_cap, cap = _buckets.caps()
        if self._groups is None and cap > 0:
            self._buckets, self._bucket_of = _buckets.plan(trainable, self._name,
                                                           first_cap, cap)
            self._trainable, self._first_cap = trainable, first_cap
        # The autotuner (HOROVOD_AUTOTUNE) counts this optimizer's steps when it reduces
        # over every rank; it may change the bucket cap between two steps.
        if resolve(self.process_set)[1] == 0:
            self._tuner = autotune.tuner(cap if self._buckets else None,
                                         self._replan if self._buckets else None)

        for p in trainable:
            self._requires_update.add(p)
            hook = self._make_hook(p)
            if hasattr(p, "register_post_accumulate_grad_hook"):
                self._hook_handles.append(p.register_post_accumulate_grad_hook(hook))
            else:                                           # pragma: no cover (torch < 2.1)
                grad_acc = p.expand_as(p).grad_fn.next_functions[0][0]
                self._hook_handles.append(grad_acc.register_hook(hook))
                self._hook_handles.append(grad_acc)
        mark_reduced(trainable, self)

    # ------------------------------------------------------------- reductions

    def _scales(self):
        """gradient_predivide_factor split over the engine's two scale factors
        (arguments.predivide_scales)."""
        return self._prescale, self._postscale

    def _allreduce_grad_async(self, p):
        if p.grad is None:
            # Not computed here, but maybe on another rank (a dynamic forward): take part
            # with zeros.
            p.grad = torch.zeros_like(p)
        name = self._name(p)
        if p.grad.is_sparse:
            if self.sparse_as_dense:
                self._densify(p)
            else:
                handle = C.sparse_allreduce_async(p.grad, name=f"sparse.{name}", op=self.op,
                                                  process_set=self.process_set)
                return handle, None
        compressed, ctx = self._compression.compress(p.grad)
        pre, post = self._scales()
        handle = C.allreduce_async_(compressed, name=name, op=self.op, prescale_factor=pre,
                                    postscale_factor=post, process_set=self.process_set)
        return handle, ctx

    def _grouped_allreduce_grad_async(self, group):
        for p in group:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            elif p.grad.is_sparse:
                if not self.sparse_as_dense:
                    raise ValueError("a parameter with a sparse gradient cannot be in a "
                                     "group; pass sparse_as_dense=True or leave it out of "
                                     "groups")
                self._densify(p)
        compressed, ctxs = zip(*[self._compression.compress(p.grad) for p in group])
        pre, post = self._scales()
        handle = C.grouped_allreduce_async_(list(compressed), name=self._name(group[0]),
                                            op=self.op, prescale_factor=pre,
                                            postscale_factor=post, process_set=self.process_set)
        return handle, ctxs

    def _densify(self, p):
        """sparse_as_dense: reduce p's sparse gradient as a dense one; synchronize()
        makes it sparse again, as Horovod does, so sparse-only optimizers still work."""
        p.grad = p.grad.to_dense()
        self._densified.add(p)

    def _bucket_put(self, p):
        """p's gradient is final: put it into its bucket, and start the bucket's
        allreduce once it is full. A sparse gradient is reduced on its own."""
        bucket, slot = self._bucket_of[p]
        self._handles.pop(p, None)       # the (None, None) of an accumulating pass
        if p.grad is not None and p.grad.is_sparse:
            if self.sparse_as_dense:
                self._densify(p)
            else:
                bucket.skip.add(p)
                self._handles[p] = self._allreduce_grad_async(p)
        if bucket.put(slot, p):
            compressed, ctx = self._compression.compress(bucket.flat)
            pre, post = self._scales()
            self._handles[bucket] = (C.allreduce_async_(
                compressed, name=bucket.name, op=self.op, prescale_factor=pre,
                postscale_factor=post, process_set=self.process_set), ctx)

    def _make_hook(self, p):
        def hook(*_):
            if self._allreduce_delay[p] <= 0:
                raise AssertionError(_TOO_MANY_MSG)
            assert not p.grad.requires_grad
            handle, ctx = None, None
            self._allreduce_delay[p] -= 1
            compressing = self._powersgd is not None and self._powersgd.active()
            if self._allreduce_delay[p] == 0 and not compressing and p in self._bucket_of:
                self._bucket_put(p)
                return
            # With PowerSGD compressing, synchronize() reduces every gradient at once.
            if self._allreduce_delay[p] == 0 and not compressing:
                group = self._p_to_group.get(p)
                if group is not None:
                    self._group_counts[id(group)] += 1
                    if self._group_counts[id(group)] == len(group):
                        for gp in group:
                            self._handles.pop(gp, None)
                        self._handles[group] = self._grouped_allreduce_grad_async(group)
                        self._group_counts[id(group)] = 0
                        return
                else:
                    handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx)
        return hook

    def _set_grad(self, p, output, ctx):
        out = self._compression.decompress(output, ctx)
        if out is p.grad:
            return
        if out.is_sparse or p.grad is None or p.grad.is_sparse or p.grad.shape != out.shape:
            p.grad = out
        else:
            with torch.no_grad():
                p.grad.copy_(out)

    def synchronize(self):
        """Finish every gradient's allreduce (starting those not started yet, with zeros
        for gradients this rank did not compute) and put the results into p.grad."""
        ps, _ = resolve(self.process_set)
        if not ps.included():
            self._synchronized = True
            return
        psgd = self._powersgd
        try:
            if psgd is not None and psgd.active():
                self._synchronize_powersgd()
            else:
                self._synchronize_plain()
        finally:
            if psgd is not None:
                psgd.iter += 1
        if self._tuner is not None:
            self._tuner.step()

    def _synchronize_powersgd(self):
        """synchronize() once PowerSGD compresses: sparse gradients on their own,
        every dense one through PowerSGD.reduce (two grouped allreduces)."""
        sparse, dense = {}, []
        for p in sorted(self._requires_update, key=lambda p: str(self._name(p))):
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            if p.grad.is_sparse and not self.sparse_as_dense:
                sparse[p] = self._allreduce_grad_async(p)[0]
                continue
            if p.grad.is_sparse:
                self._densify(p)
            dense.append((self._name(p), p))
        error = None
        try:
            pre, post = self._scales()
            self._powersgd.reduce(dense, self.process_set, pre, post)
        except Exception as e:  # noqa: BLE001 - wait for every handle, then raise
            error = e
        for p, handle in sparse.items():
            try:
                p.grad = C.synchronize(handle)
            except Exception as e:  # noqa: BLE001
                error = error or e
        self._reset_step()
        self._synchronized = True
        if error is not None:
            raise error

    def _synchronize_plain(self):
        for bucket in self._buckets:     # fill what backward did not, then send
            for slot, p in enumerate(bucket.params):
                if slot not in bucket.done:
                    self._bucket_put(p)
        launched = set(self._bucket_of)
        for key, (handle, _) in self._handles.items():
            if handle is not None and not isinstance(key, _buckets.Bucket):
                launched.update(key) if isinstance(key, tuple) else launched.add(key)
        pending = sorted((p for p in self._requires_update if p not in launched),
                         key=lambda p: str(self._name(p)))
        groups, group_ids = [], set()
        for p in pending:
            group = self._p_to_group.get(p)
            if group is None:
                self._handles[p] = self._allreduce_grad_async(p)
            elif id(group) not in group_ids:
                group_ids.add(id(group))
                groups.append(group)
        for group in groups:
            for gp in group:
                self._handles.pop(gp, None)
            self._handles[group] = self._grouped_allreduce_grad_async(group)

        error = None
        for key, (handle, ctx) in list(self._handles.items()):
            try:
                if isinstance(key, _buckets.Bucket):
                    key.take(self._compression.decompress(C.synchronize(handle), ctx))
                elif isinstance(key, tuple):
                    for gp, out, gctx in zip(key, C.synchronize(handle), ctx):
                        self._set_grad(gp, out, gctx)
                else:
                    self._set_grad(key, C.synchronize(handle), ctx)
            except Exception as e:  # noqa: BLE001 - wait for every handle, then raise
                if error is None and isinstance(e, TensorMismatchError) and \
                        isinstance(key, _buckets.Bucket):
                    e = _BucketMismatch(e)
                error = error or e
        self._reset_step()
        self._synchronized = True
        if isinstance(error, _BucketMismatch):
            ps, _ = resolve(self.process_set)
            raise self._explain_mismatch(error.cause, ps) from error.cause
        if error is not None:
            raise error

    def _explain_mismatch(self, cause, ps):
        """A bucket's allreduce failed because the ranks' buckets differ: every rank got
        the same error at once, so together they compare their parameters (names and
        shapes) and name those that differ, instead of the bucket."""
        mine = [(str(self._name(p)), tuple(p.shape)) for b in self._buckets for p in b.params]
        layouts = allgather_object(mine, "DistributedOptimizer.parameters", ps)
        ranks = ps.ranks or list(range(len(layouts)))
        shapes = {}                      # name -> {rank: shape}
        for r, layout in zip(ranks, layouts):
            for name, shape in layout:
                shapes.setdefault(name, {})[r] = shape
        diffs = []
        for name, per_rank in shapes.items():
            if len(set(per_rank.values())) > 1 or len(per_rank) < len(ranks):
                seen = ", ".join(f"rank {r} has {list(s)}" for r, s in sorted(per_rank.items()))
                absent = [r for r in ranks if r not in per_rank]
                diffs.append(f"'{name}': {seen}" + (f", ranks {absent} have no such parameter"
                                                    if absent else ""))
        if not diffs:
            return cause
        shown = "; ".join(diffs[:8]) + ("; ..." if len(diffs) > 8 else "")
        return TensorMismatchError(
            f"DistributedOptimizer: the model's parameters differ across ranks: {shown}. "
            f"Every rank must build the same model (the gradients are reduced in buckets "
            f"that pack the parameters in order)")

    # ------------------------------------------------------------- optimizer API

    @contextmanager
    def skip_synchronize(self):
        """Make step() skip its synchronize(), for use after an explicit one:

            optimizer.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            with optimizer.skip_synchronize():
                optimizer.step()
        """
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def _synchronizing_closure(self, closure):
        """Gradients computed inside a closure are averaged before the optimizer reads
        them; for LBFGS, whose decisions depend on the loss, the loss is averaged too so
        every rank takes the same steps."""
        def wrapped():
            loss = closure()
            if self._requires_update:
                self.synchronize()
                self._synchronized = False
                if isinstance(self, torch.optim.LBFGS) and loss is not None:
                    t = torch.as_tensor(loss).detach()
                    avg = C.synchronize(C.allreduce_async(
                        t.to(torch.float64), name="DistributedOptimizer.closure_loss",
                        op=C.Average, process_set=self.process_set))
                    loss = avg.to(t.dtype) if isinstance(loss, torch.Tensor) else float(avg)
            return loss
        return wrapped

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(). This can cause training "
                              "slowdown. You may want to consider using "
                              "optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.")
            if closure is None or self._handles:
                self.synchronize()
        self._synchronized = False
        if closure is not None:
            closure = self._synchronizing_closure(closure)
        return super().step(closure)

    def _local_step(self, closure=None):
        """The wrapped optimizer's own step: no allreduce, so any rank may call it alone
        (broadcast_optimizer_state creates the root's state with it)."""
        return super().step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError(_IN_FLIGHT_MSG)
        return super().zero_grad(*args, **kwargs)

    def _reset_step(self):
        for p in self._densified:
            if p.grad is not None and not p.grad.is_sparse:
                p.grad = p.grad.to_sparse()
        self._densified.clear()
        self._handles.clear()
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        for gid in self._group_counts:
            self._group_counts[gid] = 0
        for bucket in self._buckets:
            bucket.reset()

    def state_dict(self):
        """The wrapped optimizer's state_dict, plus PowerSGD's state under "powersgd"
        when compression=hvd.PowerSGD(...)."""
        state = super().state_dict()
        if self._powersgd is not None:
            state["powersgd"] = self._powersgd.state_dict()
        return state

    def load_state_dict(self, state_dict):
        self._reset_step()
        self._synchronized = False
        self._should_synchronize = True
        if isinstance(state_dict, dict) and "powersgd" in state_dict:
            state_dict = dict(state_dict)
            psgd = state_dict.pop("powersgd")
            if self._powersgd is not None:
                self._powersgd.load_state_dict(psgd)
        return super().load_state_dict(state_dict)

    def set_backward_passes_per_step(self, passes):
        passes = arguments.backward_passes(passes)
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=C.Average,
                         gradient_predivide_factor=1.0, num_groups=0, groups=None,
                         sparse_as_dense=False, process_set=global_process_set):
    """Wrap `optimizer` so that step() applies gradients averaged (op=) over the ranks.

    named_parameters: (name, parameter) pairs, usually model.named_parameters(); names
        key the allreduces, so every rank must use the same ones.
    compression: Compression.none, Compression.fp16 or Compression.bf16 (each gradient
        cast for the transfer), or hvd.PowerSGD(rank=...) (low-rank compression with
        error feedback; see docs/compression.md).
    backward_passes_per_step: local backward passes to accumulate before reducing.
    op: hvd.Average (default) or hvd.Sum (Min/Max/Product also work).
    gradient_predivide_factor: with Average, divide by this before the sum and by
        size/factor after it.
    groups: an int (split the parameters into that many groups reduced together) or a
        list of lists of parameters; num_groups is its deprecated spelling.
    sparse_as_dense: reduce sparse gradients as dense tensors.
    process_set: the ranks to average over.
    The argument rules (and their errors) are those of every binding:
    horovodlike/common/arguments.py.
    """
    if isinstance(optimizer, _DistributedOptimizer):
        raise ValueError("the optimizer is already a DistributedOptimizer")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"DistributedOptimizer expects a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    args = arguments.gradient_args(op, compression, gradient_predivide_factor,
                                   backward_passes_per_step, groups, num_groups,
                                   sparse_as_dense, _is_parameter, whole_step=True)
    resolve(process_set)          # a clear error now for an unregistered set
    if isinstance(compression, PowerSGD):
        if args.op != C.Average:
            raise ValueError("PowerSGD averages the gradients: use op=hvd.Average with "
                             "compression=hvd.PowerSGD(...)")
        compression.bind()
    cls = type(optimizer.__class__.__name__, (_DistributedOptimizer, optimizer.__class__),
               {"__module__": optimizer.__class__.__module__})
    wrapped = cls(optimizer.param_groups, named_parameters, args, process_set)
    # Keep any state the optimizer already has (e.g. loaded from a checkpoint); Horovod
    # starts the wrapper with empty state.
    for p, s in optimizer.state.items():
        wrapped.state[p] = s
    return wrapped
