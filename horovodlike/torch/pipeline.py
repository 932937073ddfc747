"""Pipeline parallelism for torch: PipelineModule (one stage's layers per rank) and the
GPipe and 1F1B schedules over point-to-point messages.

The schedule itself (which micro-batch runs forward or backward next, which message it
needs, the cost model) is framework-free in horovodlike.common.pipeline_schedule; this
module only runs its actions on torch tensors:

    topo = Topology(pp=2)                              # dp = size // 2
    pipe = PipelineModule([LayerSpec(nn.Linear, 8, 8), nn.ReLU(), ...], topology=topo,
                          loss_fn=F.mse_loss)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(pipe.parameters(), lr=0.1),
                                   named_parameters=pipe.named_parameters(),
                                   process_set=topo.dp_set)
    sched = Schedule1F1B(pipe, microbatches=8, optimizer=opt)
    out = sched.train_batch(x, y)                      # every rank of the job calls it
    opt.step(); opt.zero_grad()
    print(out.reduce_mean())                           # the mean loss, on every rank

Gradients after train_batch are the mean over micro-batches of each micro-batch's loss
gradient (each micro-batch's loss is scaled by 1/m), i.e. gradient accumulation; with a
mean loss and equal micro-batches that is the whole batch's gradient.

Tied weights (an embedding and the LM head): each stage using the weight holds one
parameter of its own. Its layers compute with a leaf that shares that parameter's
storage, so the micro-batches' gradients gather there and no optimizer hook sees them;
after the last backward the copies' gradients are summed over the tied set (the stages
that hold it, same replica) and handed to the parameter in one extra backward pass, which
a DistributedOptimizer or ShardedDistributedOptimizer then averages over dp_set like any
other gradient. Every copy gets the same sum and the same update, so they stay bitwise
equal.
"""
import time
import zlib

import torch
from torch import nn

from horovodlike.common import pipeline_schedule as S
from horovodlike.common.topology import Topology  # noqa: F401 (hvd.pipeline.Topology)
from . import _collectives as C
from .optimizer import reducers_of


class LayerSpec:
    """A layer not built yet: LayerSpec(cls, *args, **kwargs). Only the rank whose stage
    holds it builds it; partition='parameters' counts its parameters on the meta
    device (no memory)."""

    def __init__(self, cls, *args, **kwargs):
        if not callable(cls):
            raise TypeError(f"LayerSpec: {cls!r} is not a class or callable")
        self.cls, self.args, self.kwargs = cls, args, kwargs

    def build(self):
        return self.cls(*self.args, **self.kwargs)

    def __repr__(self):
        return f"LayerSpec({getattr(self.cls, '__name__', self.cls)})"


def _numel(layer):
    if isinstance(layer, LayerSpec):
        with torch.device("meta"):
            layer = layer.build()
    return sum(p.numel() for p in layer.parameters())


class PipelineModule(nn.Module):
    """This rank's stage of a model given as a list of layers run in sequence.

    layers: nn.Modules or LayerSpecs; each rank builds only its own stage's.
    topology: a horovodlike Topology (its pp is the number of stages).
    partition: "parameters" (balance parameter counts), "uniform" (layer counts) or the
        pp-1 layer indices where stages 1.. begin.
    loss_fn: loss_fn(output, y) -> scalar, run on the last stage.
    tied: {name: (layer_i, layer_j)}: the parameter `name` (a path inside both layers,
        e.g. "weight"; "label:weight" to tie several pairs of the same name) is one
        weight. The two layers must fall on different stages, declared tied in the
        Topology (its default ties the first and the last stage).
    checkpoint_layers: recompute each layer's activations in backward
        (torch.utils.checkpoint) instead of keeping them.
    """

    def __init__(self, layers, topology, partition="parameters", loss_fn=None, tied=None,
                 checkpoint_layers=False):
        super().__init__()
        layers = list(layers)
        for i, layer in enumerate(layers):
            if not isinstance(layer, (nn.Module, LayerSpec)):
                raise TypeError(f"PipelineModule: layer {i} is {type(layer).__name__}; "
                                f"give nn.Modules or LayerSpec(cls, *args)")
        self.topology, self.loss_fn = topology, loss_fn
        self.checkpoint_layers = bool(checkpoint_layers)
        p, n = topology.pp, len(layers)
        weights = [_numel(l) for l in layers] if partition == "parameters" else None
        self.bounds = S.partition(n, p, partition, weights)
        self.stage_id = topology.stage()
        lo, hi = self.bounds[self.stage_id], self.bounds[self.stage_id + 1]
        self.layer_ids = list(range(lo, hi))
        self.layers = nn.ModuleList(l.build() if isinstance(l, LayerSpec) else l
                                    for l in layers[lo:hi])
        self.tied_params = nn.ParameterDict()
        self._tied = {}        # name -> (parameter, [(module, attr)], process set, root)
        self._step = 0
        self._setup_tied(tied or {}, n)

    # ---------------------------------------------------------------- tied weights

    def _stage_of(self, layer):
        return next(s for s in range(self.topology.pp) if layer < self.bounds[s + 1])

    def _setup_tied(self, tied, n):
        topo = self.topology
        for name in sorted(tied):
            pair = tied[name]
            if (not isinstance(pair, (tuple, list)) or len(pair) != 2
                    or not all(isinstance(i, int) and 0 <= i < n for i in pair)
                    or pair[0] == pair[1]):
                raise ValueError(f"PipelineModule: tied[{name!r}] = {pair!r} must be two "
                                 f"different layer indices in [0, {n})")
            stages = sorted({self._stage_of(i) for i in pair})
            if len(stages) == 1:
                raise ValueError(f"PipelineModule: tied[{name!r}]: layers {pair[0]} and "
                                 f"{pair[1]} are both on stage {stages[0]}; a tie is across "
                                 f"stages (on one stage, share the module itself, or choose "
                                 f"a partition that splits them)")
            try:
                ps = topo.tied_set(stages)
            except ValueError:
                raise ValueError(f"PipelineModule: tied[{name!r}] joins stages {tuple(stages)}"
                                 f", which the Topology did not declare; build it with "
                                 f"Topology(pp={topo.pp}, ..., tied=[{tuple(stages)}])") from None
            mine = [i for i in pair if i in self.layer_ids]
            if not mine:
                continue
            path = name.split(":")[-1]
            sites = []
            param = None
            for i in mine:
                module, attr = self.layers[i - self.layer_ids[0]], path
                *parents, attr = path.split(".")
                for a in parents:
                    module = getattr(module, a)
                p_ = module._parameters.get(attr) if hasattr(module, "_parameters") else None
                if p_ is None:
                    raise ValueError(f"PipelineModule: tied[{name!r}]: layer {i} has no "
                                     f"parameter {path!r}")
                param = param if param is not None else p_
                del module._parameters[attr]
                sites.append((module, attr))
            root = topo.global_rank(stages[0], topo.replica(), topo.tp_rank)
            key = name.replace(".", "_").replace(":", "_")
            self.tied_params[key] = param
            self._tied[name] = (param, sites, ps, root)
            with torch.no_grad():      # every copy starts as the lowest stage's
                C.broadcast_(param.data, root, name=f"pipeline.tie.{name}", process_set=ps)
        self._point_tied_layers()

    def _point_tied_layers(self):
        """(Re)make each tied site a leaf sharing the parameter's storage; its gradient
        is collected apart from the parameter's (see the module comment)."""
        self._shadows = {}
        for name, (param, sites, _, _) in self._tied.items():
            shadow = param.detach().requires_grad_(param.requires_grad)
            for module, attr in sites:
                setattr(module, attr, shadow)
            self._shadows[name] = shadow

    @property
    def has_tied(self):
        return bool(self._tied)

    def reduce_tied_grads(self):
        """Sum the tied copies' gradients over their sets and accumulate them into the
        parameters (one backward pass, so optimizer hooks see them)."""
        if not self._tied:
            return
        handles = []
        for name, (param, _, ps, _) in self._tied.items():
            g = self._shadows[name].grad
            g = torch.zeros_like(param) if g is None else g
            handles.append(C.allreduce_async(g, name=f"pipeline.tie.{name}.grad", op=C.Sum,
                                             process_set=ps))
        params = [t[0] for t in self._tied.values()]
        grads = [C.synchronize(h) for h in handles]
        torch.autograd.backward(params, grad_tensors=grads)

    # ---------------------------------------------------------------- forward

    def forward(self, x):
        ckpt = self.checkpoint_layers and torch.is_grad_enabled()
        for layer in self.layers:
            if ckpt:
                x = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False)
            else:
                x = layer(x)
        return x

    def stage_parameter_bytes(self):
        return sum(p.numel() * p.element_size() for p in self.parameters())

    def _next_step(self):
        self._step += 1
        return self._step


class StepOutput:
    """The last stage's per-micro-batch values (losses or outputs), on every rank."""

    def __init__(self, values):
        self.outputs = values

    def reduce_mean(self):
        return torch.stack([v.reshape(()) for v in self.outputs]).mean()

    def reduce_sum(self):
        return torch.stack([v.reshape(()) for v in self.outputs]).sum()

    def concat(self):
        return torch.cat([v.reshape(1) if v.dim() == 0 else v for v in self.outputs])

    def __len__(self):
        return len(self.outputs)


class _Schedule:
    kind = None

    def __init__(self, pipe, microbatches, optimizer=None):
        if not isinstance(pipe, PipelineModule):
            raise TypeError(f"{type(self).__name__}: pipe must be a PipelineModule, got "
                            f"{type(pipe).__name__}")
        S.check_counts(pipe.topology.pp, microbatches)
        self.pipe, self.m = pipe, microbatches
        self.current_microbatch = None
        self.last_wall_s = self.last_wait_s = 0.0   # the last batch's time, and its part
        # spent waiting for a neighbour's activation or gradient (this rank's bubble)
        # backward passes per train_batch on this rank: one per micro-batch, and one
        # that hands the tied weights' summed gradients to their parameters
        self.backward_passes = microbatches + (1 if pipe.has_tied else 0)
        self.optimizer = None
        self._explicit = optimizer is not None
        if optimizer is not None:
            self._wire(optimizer)
        else:
            self._find_optimizer()

    def _wire(self, optimizer):
        """Tell the optimizer that one train_batch is backward_passes backward passes,
        so it reduces once per batch rather than refusing the second pass."""
        if hasattr(optimizer, "set_backward_passes_per_step"):
            optimizer.set_backward_passes_per_step(self.backward_passes)
        self.optimizer = optimizer

    def _find_optimizer(self):
        """Given no optimizer=, find the DistributedOptimizer (or sharded one) whose hooks
        reduce this stage's gradients and wire it. Run at construction and before each
        train_batch, so an optimizer made after the schedule is found too. With none
        (one data-parallel replica, or plain torch.optim) there is nothing to wire."""
        found = reducers_of(self.pipe.parameters())
        if not found or (len(found) == 1 and found[0] is self.optimizer):
            return
        name = type(self).__name__
        if len(found) > 1:
            raise ValueError(f"{name}: this stage's parameters are reduced by "
                             f"{len(found)} distributed optimizers "
                             f"({', '.join(type(o).__name__ for o in found)}); "
                             f"pass optimizer= to {name} to say which one steps them")
        if not hasattr(found[0], "set_backward_passes_per_step"):
            raise ValueError(f"{name}: the optimizer reducing this stage's gradients "
                             f"cannot be told the {self.backward_passes} backward passes "
                             f"of a batch; pass optimizer= to {name}")
        self._wire(found[0])

    # ------------------------------------------------------------ arguments

    def _split(self, t):
        return list(torch.tensor_split(t, self.m, dim=0))

    def _check_args(self, x, y, train, step):
        """One small allgather over the pipeline: every rank learns about every rank's
        bad argument, so all raise the same error instead of some waiting for a message
        that never comes."""
        topo, m = self.pipe.topology, self.m
        bad_x = 0
        if topo.first_stage:
            if not isinstance(x, torch.Tensor) or x.dim() == 0:
                bad_x = 1
            elif x.shape[0] < m:
                bad_x = 2
        has_y, crc, ny = 0, 0, 0
        if isinstance(y, torch.Tensor):
            yc = y.detach().contiguous()
            has_y, ny = 1, yc.numel()
            crc = zlib.crc32(yc.reshape(-1).view(torch.uint8).numpy().tobytes()) \
                if ny else 0
            if topo.last_stage and train and (yc.dim() == 0 or yc.shape[0] < m):
                has_y = 2
        mine = torch.tensor([[topo.stage(), topo.rank, bad_x, has_y, crc, ny]],
                            dtype=torch.int64)
        rows = C.synchronize(C.allgather_async(mine, name=f"pipeline.{step}.args",
                                               process_set=topo.pipe_set)).tolist()
        name = type(self).__name__
        for st, rank, bx, hy, _, _ in rows:
            if bx == 1:
                raise ValueError(f"{name}: x on the first stage (rank {rank}) must be a "
                                 f"tensor with a batch dimension")
            if bx == 2:
                raise ValueError(f"{name}: x on the first stage (rank {rank}) has fewer "
                                 f"rows than microbatches={m}")
        if not train:
            return
        last = next(r for r in rows if r[0] == topo.pp - 1)
        if last[3] == 0:
            raise ValueError(f"{name}: train_batch needs y on the last stage (rank {last[1]})")
        if last[3] == 2:
            raise ValueError(f"{name}: y on the last stage (rank {last[1]}) has fewer rows "
                             f"than microbatches={m}")
        for st, rank, bx, hy, c, ny in rows:
            if st != topo.pp - 1 and hy and (c, ny) != (last[4], last[5]):
                raise ValueError(f"{name}: the y given on stage {st} (rank {rank}) differs "
                                 f"from the last stage's (rank {last[1]}); only the last "
                                 f"stage reads y: give the same y, or None, elsewhere")

    # ------------------------------------------------------------ running

    def train_batch(self, x=None, y=None):
        """Run forward and backward of every micro-batch; gradients accumulate in the
        stage's parameters. Returns a StepOutput of the per-micro-batch losses."""
        return self._run(x, y, train=True)

    def eval_batch(self, x=None):
        """Forward only; a StepOutput of the last stage's per-micro-batch outputs."""
        return self._run(x, None, train=False)

    def _run(self, x, y, train):
        pipe, topo, m = self.pipe, self.pipe.topology, self.m
        if train and pipe.loss_fn is None:
            raise ValueError(f"{type(self).__name__}: train_batch needs "
                             f"PipelineModule(loss_fn=...)")
        if train and not self._explicit:
            self._find_optimizer()
        t0 = time.perf_counter()
        self.last_wait_s = 0.0
        step = pipe._next_step()
        pipe._point_tied_layers()    # fresh gradients; follows an optimizer that replaced .data
        self._check_args(x, y, train, step)
        xs = self._split(x) if topo.first_stage else None
        ys = self._split(y) if topo.last_stage and train else None
        ps, prev, nxt = topo.pipe_set, topo.prev_rank, topo.next_rank
        inputs, outputs, results, sends = {}, {}, [None] * m, []
        peer = {topo.stage() - 1: prev, topo.stage() + 1: nxt}
        for a in S.actions(self.kind, topo.pp, m, topo.stage(), forward_only=not train):
            self.current_microbatch = a.mb
            if a.kind == S.FORWARD:
                if a.recv is None:
                    inp = xs[a.mb]
                else:
                    inp = self._recv(peer[a.recv], S.message_name(step, a.kind, a.mb), ps)
                    if train and inp.is_floating_point():
                        inp.requires_grad_(True)
                with torch.set_grad_enabled(train):
                    out = pipe(inp)
                if a.send is not None:
                    if not isinstance(out, torch.Tensor):
                        raise TypeError(f"pipeline: stage {topo.stage()} returned "
                                        f"{type(out).__name__}; a stage must return one tensor")
                    sends.append(C.send_async(out.detach(), peer[a.send],
                                              S.message_name(step, a.kind, a.mb), ps))
                elif train:
                    out = pipe.loss_fn(out, ys[a.mb])
                    if not isinstance(out, torch.Tensor) or out.numel() != 1:
                        raise ValueError("pipeline: loss_fn must return a scalar tensor")
                    results[a.mb] = out.detach().reshape(())
                else:
                    results[a.mb] = out.detach()
                if train:
                    inputs[a.mb], outputs[a.mb] = inp, out
            else:
                out, inp = outputs.pop(a.mb), inputs.pop(a.mb)
                if a.recv is None:
                    (out / m).backward()
                else:
                    g = self._recv(peer[a.recv], S.message_name(step, a.kind, a.mb), ps)
                    if out.requires_grad:
                        torch.autograd.backward(out, g)
                if a.send is not None and inp.is_floating_point():
                    g = inp.grad if inp.grad is not None else torch.zeros_like(inp)
                    sends.append(C.send_async(g, peer[a.send],
                                              S.message_name(step, a.kind, a.mb), ps))
        self.current_microbatch = None
        for h in sends:
            C.synchronize(h)
        if train:
            pipe.reduce_tied_grads()
        out = StepOutput(self._share(results, step, train))
        self.last_wall_s = time.perf_counter() - t0
        return out

    def _recv(self, src, name, ps):
        t = time.perf_counter()
        try:
            return C.recv(src, name, ps)
        finally:
            self.last_wait_s += time.perf_counter() - t

    def _share(self, results, step, train):
        """The last stage's results, sent to every other stage of its pipeline."""
        topo = self.pipe.topology
        last = topo.global_rank(topo.pp - 1, topo.replica(), topo.tp_rank)
        others = [topo.global_rank(s, topo.replica(), topo.tp_rank)
                  for s in range(topo.pp - 1)]
        if train:        # the losses: one message
            if topo.last_stage:
                losses = torch.stack(results)
                hs = [C.send_async(losses, r, f"pipe.{step}.loss", topo.pipe_set)
                      for r in others]
                for h in hs:
                    C.synchronize(h)
                return list(losses)
            return list(C.recv(last, f"pipe.{step}.loss", topo.pipe_set))
        if topo.last_stage:     # outputs: one message per micro-batch (shapes may differ)
            hs = [C.send_async(v, r, f"pipe.{step}.out.{i}", topo.pipe_set)
                  for r in others for i, v in enumerate(results)]
            for h in hs:
                C.synchronize(h)
            return results
        return [C.recv(last, f"pipe.{step}.out.{i}", topo.pipe_set) for i in range(self.m)]


class ScheduleGPipe(_Schedule):
    """All forwards, then all backwards: m micro-batches of activations per stage."""
    kind = "gpipe"


class Schedule1F1B(_Schedule):
    """One forward, one backward (PipeDream-flush): at most p - s micro-batches of
    activations on stage s, the same bubble as GPipe."""
    kind = "1f1b"


__all__ = ["LayerSpec", "PipelineModule", "Schedule1F1B", "ScheduleGPipe", "StepOutput"]
