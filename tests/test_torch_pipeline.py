"""Pipeline parallelism (horovodlike.torch.pipeline) on real ranks.

The reference everywhere is the whole model in one process, trained with gradient
accumulation over the same micro-batches (each micro-batch's loss / m), in float64.

Launch 1 (4 ranks, plain hvd.init): Topology(pp=2) (two independent pipelines side by
side) and Topology(pp=4); an MLP and a tiny transformer; m in {1, 4, 8}; GPipe and
1F1B: the losses (StepOutput, on every rank) and every parameter after 3 SGD steps equal
the reference within 1e-10; eval_batch; per-micro-batch sequence lengths that change the
activation shape between stages; tied embedding / LM head (gradients equal the
reference's, copies bitwise equal); each rank's parameters are exactly its stage's
layers; saved activations counted with saved_tensors_hooks peak at <= p-k micro-batches
on stage k under 1F1B and at m under GPipe; checkpoint_layers; the argument errors.
Launch 2 (4 ranks): pp 2 × dp 2 with DistributedOptimizer and with
ShardedDistributedOptimizer(stage=2) over topo.dp_set against the global batch, with and
without a tied embedding / LM head.
Then: 50 back-to-back 1F1B batches of varying size at 2 ranks; the bubble of stages that
sleep (forward t, backward 2t), read from the timeline by the viewer's analysis, within
±2 points of (p-1)/(m+p-1) at p=2 and p=4 (m=8), and the viewer naming a slow stage;
SIGKILL of the last stage during its drain and SIGSTOP of a middle stage: every other
rank fails naming it, within the peer timeout; the example at pp 2 × dp 2.
"""
import importlib.util

import pytest

from harness import rank_program, run_ranks
from test_torch_support import run_torch

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(300)

COMMON = r'''
import copy
import torch.nn as nn
import torch.nn.functional as F
from horovodlike.common.topology import Topology
from horovodlike.torch.pipeline import (LayerSpec, PipelineModule, Schedule1F1B,
                                        ScheduleGPipe)
thvd.init()
R, N = thvd.rank(), thvd.size()
torch.set_default_dtype(torch.float64)
TOL = 1e-10
SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def close(got, exp, what):
    t_close(got, exp, what, rtol=0, atol=TOL)


def mlp_layers():
    return [nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8),
            nn.Tanh(), nn.Linear(8, 3)]


class Trim(nn.Module):
    """Drops the trailing sequence positions that are padding in every row (feature 0
    is exactly 0), so each micro-batch leaves stage 0 with its own length."""

    def forward(self, x):
        keep = (x[..., 0] != 0).any(0).nonzero()
        return x[:, :int(keep.max()) + 1] if keep.numel() else x[:, :1]


def tf_layers():
    return [Trim(), nn.Linear(6, 8),
            nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
            nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
            nn.LayerNorm(8), nn.Linear(8, 3)]


def seq_loss(out, y):
    return F.mse_loss(out, y[:, :out.shape[1]])


def data(kind, step, rows, seed=0):
    g = torch.Generator().manual_seed(1000 * seed + step)
    if kind == "mlp":
        return torch.randn(rows, 6, generator=g), torch.randn(rows, 3, generator=g)
    x = torch.randn(rows, 7, 6, generator=g)
    for i in range(rows):              # row i has 2 + i % 6 positions, the rest padding
        x[i, 2 + i % 6:] = 0
    return x, torch.randn(rows, 7, 3, generator=g)


def reference(layers, loss_fn, batches, m, lr=0.1, tie=None):
    """Whole model in one process; returns the losses per step and the model."""
    model = nn.Sequential(*layers)
    if tie:
        i, j = tie
        model[j].weight = model[i].weight
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        opt.zero_grad()
        step = []
        for xm, ym in zip(torch.tensor_split(x, m), torch.tensor_split(y, m)):
            loss = loss_fn(model(xm), ym)
            (loss / m).backward()
            step.append(loss.detach())
        opt.step()
        losses.append(torch.stack(step))
    return losses, model


def sgd(module, lr=0.1):
    """SGD over the stage's parameters (a stage may have none: a placeholder then)."""
    return torch.optim.SGD(list(module.parameters()) or [torch.zeros(1, requires_grad=True)],
                           lr=lr)


def compare_stage(pipe, ref_model, what):
    for li, layer in zip(pipe.layer_ids, pipe.layers):
        ref_sd = dict(ref_model[li].named_parameters())
        for n, p in list(layer.named_parameters()):
            close(p, ref_sd[n], f"{what} layer {li} {n}")
'''

EQUIV_BODY = COMMON + r'''
# ------------------------------------------------ equivalence: pp 2 (×2) and pp 4
for pp in (2, 4):
    topo = Topology(pp=pp)
    for model, make, loss_fn, rows in (("mlp", mlp_layers, F.mse_loss, 16),
                                       ("transformer", tf_layers, seq_loss, 8)):
        for m in (1, 4, 8):
            for sname, cls in SCHEDULES.items():
                what = f"pp{pp} {model} m={m} {sname}"
                torch.manual_seed(7)
                layers = make()
                batches = [data(model, s, rows) for s in range(3)]
                ref_losses, ref_model = reference(copy.deepcopy(layers), loss_fn, batches, m)
                pipe = PipelineModule(layers, topology=topo, loss_fn=loss_fn,
                                      partition="uniform" if model == "mlp" else "parameters")
                opt = sgd(pipe)
                sched = cls(pipe, microbatches=m)
                for s, (x, y) in enumerate(batches):
                    opt.zero_grad()
                    out = sched.train_batch(x if topo.first_stage else None,
                                            y if topo.last_stage else None)
                    opt.step()
                    close(torch.stack(out.outputs), ref_losses[s], f"{what} step {s} losses")
                    close(out.reduce_mean(), ref_losses[s].mean(), f"{what} reduce_mean")
                    close(out.reduce_sum(), ref_losses[s].sum(), f"{what} reduce_sum")
                compare_stage(pipe, ref_model, what)
                # each rank's parameters are exactly its stage's layers
                mine = sum(p.numel() for li in pipe.layer_ids for p in layers[li].parameters())
                check(sum(p.numel() for p in pipe.parameters()) == mine and
                      all(l is layers[li] for li, l in zip(pipe.layer_ids, pipe.layers)),
                      f"{what} stage parameters", str(pipe.layer_ids))
                if m == 4 and sname == "1f1b":      # eval: outputs on every rank
                    x, _ = batches[0]
                    with torch.no_grad():
                        exp = [ref_model(xm) for xm in torch.tensor_split(x, m)]
                    got = sched.eval_batch(x if topo.first_stage else None)
                    for i, (g_, e_) in enumerate(zip(got.outputs, exp)):
                        close(g_, e_, f"{what} eval micro-batch {i}")
                    if model == "mlp":
                        close(got.concat(), torch.cat(exp), f"{what} eval concat")

# ------------------------------------------------ LayerSpec, checkpoint_layers
topo = Topology(pp=4)
torch.manual_seed(3)
ref_layers = mlp_layers()
specs = [LayerSpec(nn.Linear, 6, 8), LayerSpec(nn.Tanh), LayerSpec(nn.Linear, 8, 8),
         LayerSpec(nn.Tanh), LayerSpec(nn.Linear, 8, 8), LayerSpec(nn.Tanh),
         LayerSpec(nn.Linear, 8, 3)]
pipe = PipelineModule(specs, topology=topo, loss_fn=F.mse_loss, checkpoint_layers=True)
with torch.no_grad():
    for li, layer in zip(pipe.layer_ids, pipe.layers):
        for p, q in zip(layer.parameters(), ref_layers[li].parameters()):
            p.copy_(q)
batches = [data("mlp", s, 12, seed=1) for s in range(3)]
ref_losses, ref_model = reference(copy.deepcopy(ref_layers), F.mse_loss, batches, 4)
opt = sgd(pipe)
sched = Schedule1F1B(pipe, microbatches=4)
for s, (x, y) in enumerate(batches):
    opt.zero_grad()
    out = sched.train_batch(x, y)
    opt.step()
    close(torch.stack(out.outputs), ref_losses[s], f"LayerSpec+checkpoint step {s}")
compare_stage(pipe, ref_model, "LayerSpec+checkpoint")
check(pipe.bounds == [0, 1, 3, 5, 7], "partition=parameters bounds", str(pipe.bounds))

# ------------------------------------------------ tied embedding / LM head
V, D = 11, 6


class Pool(nn.Module):
    def forward(self, x):
        return torch.tanh(x)


def lm_layers():
    return [nn.Embedding(V, D), nn.Linear(D, D), Pool(), nn.Linear(D, D), Pool(),
            nn.Linear(D, V, bias=False)]


def lm_loss(out, y):
    return F.cross_entropy(out.reshape(-1, V), y.reshape(-1))


for pp in (2, 4):
    topo = Topology(pp=pp)
    for sname, cls in SCHEDULES.items():
        what = f"tied pp{pp} {sname}"
        torch.manual_seed(11)
        layers = lm_layers()
        g = torch.Generator().manual_seed(5)
        batches = [(torch.randint(0, V, (8, 5), generator=g),
                    torch.randint(0, V, (8, 5), generator=g)) for _ in range(3)]
        ref_layers = copy.deepcopy(layers)
        model = nn.Sequential(*ref_layers)
        model[5].weight = model[0].weight
        pipe = PipelineModule(layers, topology=topo, loss_fn=lm_loss, partition="uniform",
                              tied={"weight": (0, 5)})
        opt = sgd(pipe, 0.5)
        ropt = torch.optim.SGD(model.parameters(), lr=0.5)
        sched = cls(pipe, microbatches=4)
        for s, (x, y) in enumerate(batches):
            opt.zero_grad(); ropt.zero_grad()
            out = sched.train_batch(x, y)
            exp = []
            for xm, ym in zip(torch.tensor_split(x, 4), torch.tensor_split(y, 4)):
                loss = lm_loss(model(xm), ym)
                (loss / 4).backward()
                exp.append(loss.detach())
            close(torch.stack(out.outputs), torch.stack(exp), f"{what} step {s} losses")
            if s == 0 and pipe.has_tied:
                close(pipe.tied_params["weight"].grad, model[0].weight.grad,
                      f"{what} tied gradient")
            opt.step(); ropt.step()
        for li, layer in zip(pipe.layer_ids, pipe.layers):
            for n, p in layer.named_parameters():
                close(p, dict(model[li].named_parameters())[n], f"{what} layer {li} {n}")
        if pipe.has_tied:
            w = pipe.tied_params["weight"]
            close(w, model[0].weight, f"{what} tied weight")
            same_on_every_rank(w, f"{what} tied copies bitwise equal",
                               topo.tied_set((0, pp - 1)))
            check(pipe.layers[-1 if topo.last_stage else 0].weight.data_ptr() == w.data_ptr(),
                  f"{what} layer computes with the tied parameter's storage")

# ------------------------------------------------ saved activations per stage
for pp in (2, 4):
    topo = Topology(pp=pp)
    m = 8
    for sname, cls in SCHEDULES.items():
        torch.manual_seed(2)
        pipe = PipelineModule(mlp_layers(), topology=topo, loss_fn=F.mse_loss,
                              partition="uniform")
        sched = cls(pipe, microbatches=m)
        live = {}
        peak = [0]

        class Saved:
            def __init__(self, t, mb):
                self.t, self.mb = t, mb
                live[mb] = live.get(mb, 0) + 1
                peak[0] = max(peak[0], sum(1 for v in live.values() if v))

            def __del__(self):
                live[self.mb] -= 1

        def pack(t):
            return Saved(t, sched.current_microbatch)

        def unpack(s):
            return s.t

        x, y = data("mlp", 0, 16)
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            sched.train_batch(x, y)
        exp = m if sname == "gpipe" else pp - topo.stage()
        check(peak[0] <= exp and (sname == "1f1b" or peak[0] == m),
              f"pp{pp} {sname} stage {topo.stage()} peak saved micro-batches",
              f"{peak[0]} (bound {exp})")

# ------------------------------------------------ errors: every rank, no hang
topo = Topology(pp=4)


def raises(fn, words, what):
    try:
        fn()
    except (ValueError, TypeError) as e:
        check(all(w in str(e) for w in words), what, f"message {e!r} lacks {words}")
        return
    fail(what, "no error")


pipe = PipelineModule(mlp_layers(), topology=topo, loss_fn=F.mse_loss)
raises(lambda: Schedule1F1B(pipe, microbatches=0), ["microbatches", "m >= 1"], "m < 1")
raises(lambda: PipelineModule([nn.Linear(2, 2)] * 3, topology=topo), ["4 stages", "3 layers"],
       "more stages than layers")
raises(lambda: PipelineModule(lm_layers(), topology=topo, tied={"weight": (2, 3)},
                              partition=[1, 2, 5]),
       ["layers 2 and 3 are both on stage 2"], "tied pair on one stage")
raises(lambda: PipelineModule(lm_layers(), topology=topo, tied={"weight": (0, 3)},
                              partition=[1, 2, 4]),
       ["did not declare", "tied=[(0, 2)]"], "tied pair of undeclared stages")
sched = ScheduleGPipe(pipe, microbatches=4)
x, y = data("mlp", 0, 8)
bad = y + R if not topo.last_stage else y
raises(lambda: sched.train_batch(x, bad), ["y given on stage 1 (rank 1) differs from the last stage"],
       "y differing on a non-last stage")
raises(lambda: sched.train_batch(x[:3], y), ["fewer rows than microbatches=4"], "x too short")
raises(lambda: sched.train_batch(x, None), ["needs y on the last stage"], "no y")
out = sched.train_batch(x, y if topo.last_stage else None)   # still usable afterwards
check(len(out) == 4, "a good batch after the errors")
finish()
'''

DP_BODY = COMMON + r'''
topo = Topology(pp=2)           # dp-inner: ranks 0,1 stage 0; 2,3 stage 1
m = 4
for kind in ("DistributedOptimizer", "ShardedDistributedOptimizer"):
    for sname, cls in SCHEDULES.items():
        what = f"pp2×dp2 {kind} {sname}"
        torch.manual_seed(9)
        layers = mlp_layers()
        model = nn.Sequential(*copy.deepcopy(layers))
        ropt = torch.optim.Adam(model.parameters(), lr=1e-2)
        pipe = PipelineModule(layers, topology=topo, loss_fn=F.mse_loss)
        inner = torch.optim.Adam(pipe.parameters(), lr=1e-2)
        if kind == "DistributedOptimizer":
            opt = thvd.DistributedOptimizer(inner, pipe.named_parameters(),
                                            process_set=topo.dp_set)
        else:
            opt = thvd.ShardedDistributedOptimizer(inner, pipe.named_parameters(), stage=2,
                                                   process_set=topo.dp_set)
        sched = cls(pipe, microbatches=m, optimizer=opt)
        for s in range(3):
            parts = [data("mlp", s, 8, seed=10 + d) for d in range(topo.dp)]
            ropt.zero_grad()
            exp = accumulate_global_batch(model, F.mse_loss, parts, m)
            ropt.step()
            opt.zero_grad()
            x, y = parts[topo.replica()]
            out = sched.train_batch(x, y)
            opt.step()
            close(torch.stack(out.outputs), torch.stack(exp[topo.replica() * m:][:m]),
                  f"{what} step {s} losses")
        compare_stage(pipe, model, what)
        for n, p in pipe.named_parameters():
            same_on_every_rank(p, f"{what} {n} equal over dp", topo.dp_set)

# tied embedding / LM head at pp 2 × dp 2: the tied sum and the replica average compose
V, D = 11, 6


def lm_layers():
    return [nn.Embedding(V, D), nn.Linear(D, D), nn.Tanh(), nn.Linear(D, V, bias=False)]


def lm_loss(out, y):
    return F.cross_entropy(out.reshape(-1, V), y.reshape(-1))


for kind in ("DistributedOptimizer", "ShardedDistributedOptimizer"):
    what = f"pp2×dp2 tied {kind}"
    torch.manual_seed(12)
    layers = lm_layers()
    model = nn.Sequential(*copy.deepcopy(layers))
    model[3].weight = model[0].weight
    ropt = torch.optim.Adam(model.parameters(), lr=1e-2)
    pipe = PipelineModule(layers, topology=topo, loss_fn=lm_loss, tied={"weight": (0, 3)},
                          partition=[2])
    inner = torch.optim.Adam(pipe.parameters(), lr=1e-2)
    opt = (thvd.DistributedOptimizer(inner, pipe.named_parameters(), process_set=topo.dp_set)
           if kind == "DistributedOptimizer" else
           thvd.ShardedDistributedOptimizer(inner, pipe.named_parameters(), stage=2,
                                            process_set=topo.dp_set))
    sched = Schedule1F1B(pipe, microbatches=m, optimizer=opt)
    for s in range(3):
        g = torch.Generator().manual_seed(50 + s)
        parts = [(torch.randint(0, V, (8, 5), generator=g),
                  torch.randint(0, V, (8, 5), generator=g)) for _ in range(topo.dp)]
        ropt.zero_grad()
        accumulate_global_batch(model, lm_loss, parts, m)
        ropt.step()
        opt.zero_grad()
        sched.train_batch(*parts[topo.replica()])
        opt.step()
    compare_stage(pipe, model, what)
    w = pipe.tied_params["weight"]
    close(w, model[0].weight, f"{what} tied weight")
    same_on_every_rank(w, f"{what} tied copies bitwise equal", topo.tied_set((0, 1)))
    same_on_every_rank(w, f"{what} tied weight equal over dp", topo.dp_set)
finish()
'''


def test_pipeline_equivalence_tied_memory_and_errors():
    run_torch(EQUIV_BODY, 4, timeout=280)


def test_pipeline_with_data_parallel_optimizers():
    run_torch(DP_BODY, 4, timeout=150)


# ---------------------------------------------------------------- bubble (timeline)

SLEEP_STAGES = rank_program("torch_pipeline_sleep_stages")


@pytest.mark.parametrize("p,schedule", [(2, "1f1b"), (4, "1f1b")])
def test_pipeline_bubble_from_the_timeline_matches_the_cost_model(tmp_path, p, schedule):
    from horovodlike.timeline_viewer.analyses import pipeline
    from horovodlike.timeline_viewer.model import open_timeline
    path = tmp_path / "tl.json"
    run_torch(SLEEP_STAGES, p, timeout=120,
              env={"HOROVOD_TIMELINE": str(path), "STAGE_SECONDS": "0.1",
                   "SCHEDULE": schedule, "BATCHES": "3"})
    rep = pipeline(open_timeline([str(tmp_path)]))
    m = 8
    ideal = (p - 1) / (m + p - 1)
    assert rep is not None and rep.stages == p and rep.microbatches == m, rep
    assert rep.batches == 2, rep           # the first (warm-up) batch is left out
    got = {r: round(x.bubble, 4) for r, x in rep.ranks.items()}
    assert sorted(x.stage for x in rep.ranks.values()) == list(range(p)), rep
    assert all(abs(b - ideal) <= 0.02 for b in got.values()), (got, ideal)


def test_timeline_viewer_names_the_stage_that_holds_the_pipeline_up(tmp_path):
    import subprocess
    import sys
    path = tmp_path / "tl.json"
    run_torch(SLEEP_STAGES, 4, timeout=120,
              env={"HOROVOD_TIMELINE": str(path), "STAGE_SECONDS": "0.03",
                   "SCHEDULE": "1f1b", "BATCHES": "2", "SLOW_STAGE": "2"})
    out = subprocess.run([sys.executable, "-m", "horovodlike.timeline_viewer", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Pipeline (4 stages, 8 micro-batches, 1 batches): stage 2 (rank 2) holds the " \
           "others up" in out.stdout, out.stdout[:3000]
    assert "Pipeline bubble" in out.stdout, out.stdout[:3000]


# ---------------------------------------------------------------- back to back

BACK_TO_BACK = COMMON + r'''
topo = Topology(pp=2)
torch.manual_seed(4)
layers = mlp_layers()
ref = nn.Sequential(*copy.deepcopy(layers))
pipe = PipelineModule(layers, topology=topo, loss_fn=F.mse_loss)
sched = Schedule1F1B(pipe, microbatches=4)
done = 0
for i in range(50):              # no optimizer step: every batch's loss is known
    x, y = data("mlp", i, 4 + i % 13)      # batch size varies: micro-batch shapes too
    out = sched.train_batch(x, y)
    with torch.no_grad():
        exp = torch.stack([F.mse_loss(ref(a), b) for a, b in
                           zip(torch.tensor_split(x, 4), torch.tensor_split(y, 4))])
    close(torch.stack(out.outputs), exp, f"batch {i} losses")
    done += 1
check(done == 50, "50 batches")
finish()
'''


def test_pipeline_fifty_back_to_back_1f1b_batches():
    run_torch(BACK_TO_BACK, 2, timeout=120)


# ---------------------------------------------------------------- faults

FAULT = rank_program("torch_pipeline_fault")


@pytest.mark.parametrize("victim,sig", [(3, "SIGKILL"), (1, "SIGSTOP")])
def test_pipeline_fault_fails_every_rank_naming_the_lost_stage(victim, sig):
    peer_timeout = 4
    res = run_ranks(FAULT, 4, timeout=90,
                    env={"VICTIM": str(victim), "SIG": sig,
                         "HOROVODLIKE_PEER_TIMEOUT_SECONDS": str(peer_timeout)})
    lines = res.rank_lines()
    at = [float(ln.split()[1]) for ln in lines.get(victim, []) if ln.startswith("VICTIM")]
    assert at, res.describe()
    errors = res.rank_lines("stderr")
    for r in range(4):
        if r == victim:
            continue
        failed = [ln for ln in lines.get(r, []) if ln.startswith("FAILED")]
        if not failed:
            # the launcher stops the others as soon as it sees a rank die; a rank it
            # stopped first has still logged the engine's verdict
            logged = [ln for ln in errors.get(r, []) if "ERROR: rank" in ln]
            assert logged and f"rank {victim} (host" in logged[0], \
                f"rank {r} did not fail naming rank {victim}\n{res.describe()}"
            continue
        took = float(failed[0].split()[1]) - at[0]
        assert f"rank {victim} (host" in failed[0], failed[0]
        # a killed rank's sockets close at once; a stopped one is found by the heartbeats
        # within the peer timeout (plus a heartbeat interval and the load here)
        assert took < 2 * peer_timeout + 3, (r, took, failed[0])
    assert res.elapsed < 60, res.describe()


def test_example_trains_pp2_dp2():
    from harness import REPO
    res = run_ranks(REPO / "examples" / "pytorch_pipeline_transformer.py", 4,
                    args=["--steps", "12", "--sharded"], timeout=150)
    assert res.returncode == 0, res.describe()
    lines = res.rank_lines()[0]
    out = "\n".join(lines)
    losses = [float(ln.split()[-1]) for ln in lines if ln.startswith("step")]
    assert len(losses) >= 3 and losses[-1] < 0.8 * losses[0], out
    rows = [ln for ln in lines if ln.startswith("rank ") and "parameter bytes" in ln]
    assert [ln.split()[3] for ln in rows] == ["0", "0", "1", "1"], out    # stage per rank
    assert "cost model bubble (p-1)/(m+p-1) = 11.1%" in out, out
