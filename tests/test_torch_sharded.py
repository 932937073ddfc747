"""ShardedDistributedOptimizer on real jobs, against plain DistributedOptimizer.

Every launch trains, in the same job, a model with DistributedOptimizer and copies of it
with ShardedDistributedOptimizer for each shard size (the whole set, 2 and 1 where they
divide it), stage 1 and 2, and SGD with momentum, Adam and AdamW; after a few steps the
parameters must match within float tolerance and be bit-identical across ranks. The
model has two parameter groups, a float64 parameter (a second flat buffer), a frozen and
an unused parameter, and buckets small enough that there are several. One configuration
per launch also checks backward_passes_per_step, fp16 compression, op=Sum, clipping,
the consolidated state against DistributedOptimizer's, checkpoints resharded to another
shard size, and broadcast_optimizer_state.
"""
import importlib.util
import signal
import socket

import pytest

from harness import rank_program, run_ranks
from test_torch_support import run_torch

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(420)

FAKE_NODES = ["-H", "a:2,b:2", "--ssh-command", "sh -c {command}"]

COMMON = r'''
import copy
import torch.nn as nn
import torch.nn.functional as F
thvd.init(process_sets="dynamic")
R, P = thvd.rank(), thvd.size()
TMP = os.environ.get("HVDTEST_TMP", "")
CAP = 200 / 2 ** 20          # 200-byte buckets: several per dtype


class Net(nn.Module):
    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.fc1 = nn.Linear(5, 7)
        self.fc2 = nn.Linear(7, 3)
        self.scale = nn.Parameter(1 + 0.1 * torch.randn(3, dtype=torch.float64))
        self.frozen = nn.Parameter(torch.ones(2), requires_grad=False)
        self.unused = nn.Parameter(torch.ones(4))

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x))) * self.scale.float() + self.frozen.sum()


def groups(model, lr):
    return [{"params": [model.fc1.weight, model.fc1.bias, model.scale, model.frozen]},
            {"params": [model.fc2.weight, model.fc2.bias, model.unused], "lr": lr / 2,
             "weight_decay": 0.01}]


OPTIMIZERS = {
    "SGD momentum": lambda g: torch.optim.SGD(g, lr=0.1, momentum=0.9, nesterov=True),
    "Adam": lambda g: torch.optim.Adam(g, lr=0.01),
    "AdamW amsgrad": lambda g: torch.optim.AdamW(g, lr=0.01, weight_decay=0.05,
                                                 amsgrad=True),
}


def batch(step, r, n=6):
    g = torch.Generator()
    g.manual_seed(1000 * step + r)
    return torch.randn(n, 5, generator=g), torch.randint(0, 3, (n,), generator=g)


def train_step(model, opt, step, passes=1, clip=None):
    opt.zero_grad()
    for k in range(passes):
        x, y = batch(10 * step + k, R)
        F.cross_entropy(model(x), y).backward()
    if clip is None:
        opt.step()
        return None
    opt.synchronize()
    if isinstance(opt, thvd.ShardedDistributedOptimizer):
        norm = opt.clip_grad_norm_(clip[0], clip[1])
    else:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip[0], clip[1])
    with opt.skip_synchronize():
        opt.step()
    return norm


def fresh(seed=None):
    model = Net(100 + R if seed is None else seed)
    thvd.broadcast_parameters(model.state_dict(), root_rank=0)
    return model


def params_of(model):
    return [p.detach().clone() for p in model.parameters()]


def compare(model, ref, what, rtol=1e-5, atol=1e-6):
    for (name, p), q in zip(model.named_parameters(), ref):
        t_close(p.detach(), q, f"{what}: {name}", rtol=rtol, atol=atol)


def identical_in(model, opt, what):
    flat = flat_params(model)
    same_on_every_rank(flat, f"{what}: bit-identical across the partition group",
                       process_set=opt.partition_set)
    same_on_every_rank(flat, f"{what}: bit-identical across all ranks")


def shard_sizes():
    sizes = [P] + [s for s in (2, 1) if s < P and P % s == 0]
    if os.environ.get("HVDTEST_LOCAL_SHARDS"):
        sizes = [thvd.local_size()]
    return sizes
'''

EQUIVALENCE = COMMON + r'''
STEPS = 4
for label, make in OPTIMIZERS.items():
    ref_model = fresh()
    ref_opt = thvd.DistributedOptimizer(make(groups(ref_model, 0.1)),
                                        named_parameters=ref_model.named_parameters())
    for step in range(STEPS):
        train_step(ref_model, ref_opt, step)
    ref = params_of(ref_model)
    ref_state = ref_opt.state_dict()
    check(not torch.equal(ref[0], params_of(fresh())[0]), f"{label}: training moved weights")
    for S in shard_sizes():
        for stage in (1, 2):
            what = f"{label} S={S} stage={stage}"
            model = fresh()
            opt = thvd.ShardedDistributedOptimizer(
                make(groups(model, 0.1)), named_parameters=model.named_parameters(),
                stage=stage, shard_size=S, bucket_cap_mb=CAP)
            thvd.broadcast_optimizer_state(opt, root_rank=0)
            check(len(opt._buckets) > 2, f"{what}: several buckets", str(len(opt._buckets)))
            for step in range(STEPS):
                train_step(model, opt, step)
                if stage == 2:
                    check(all(p.grad is None for p in model.parameters()),
                          f"{what}: stage 2 keeps no full gradients")
            compare(model, ref, what)
            identical_in(model, opt, what)
            check(model.frozen.grad is None and torch.equal(model.frozen.detach(),
                                                            torch.ones(2)),
                  f"{what}: the frozen parameter is untouched")
            # optimizer state: 1/S of the elements here, all of them over the group
            full = sum(v.numel() for s in ref_opt.state.values() for k, v in s.items()
                       if k != "step")
            mine = torch.tensor([sum(v.numel() for s in opt._inner.state.values()
                                     for k, v in s.items() if k != "step")])
            total = thvd.allreduce(mine, op=thvd.Sum, process_set=opt.partition_set) \
                if opt.partition_set is not None else mine
            check(int(total) == full, f"{what}: state elements over the partition group",
                  f"{int(total)} != {full}")
            check(int(mine) <= full // S + 64, f"{what}: ~1/S of the state here",
                  f"{int(mine)} of {full}")
            cons = opt.consolidated_state_dict(root_rank=P - 1)
            check((cons is not None) == (R == P - 1), f"{what}: consolidated on root only")
            if R == P - 1:
                check(sorted(cons["state"]) == sorted(ref_state["state"]),
                      f"{what}: consolidated state covers the parameters",
                      f"{sorted(cons['state'])} vs {sorted(ref_state['state'])}")
                for j, s in ref_state["state"].items():
                    for k, v in s.items():
                        got = cons["state"].get(j, {}).get(k)
                        if isinstance(v, torch.Tensor):
                            t_close(got if isinstance(got, torch.Tensor) else torch.zeros(0),
                                    v, f"{what}: consolidated state[{j}][{k!r}]",
                                    rtol=1e-4, atol=1e-6)
                check([{k: v for k, v in g.items()} for g in cons["param_groups"]]
                      == ref_state["param_groups"], f"{what}: consolidated param_groups")

# Options, each against DistributedOptimizer with the same options (Adam, S = P).
for label, kw, passes, clip, tol in [
        ("backward_passes_per_step=2", dict(backward_passes_per_step=2), 2, None, 1e-6),
        ("fp16 compression", dict(compression=thvd.Compression.fp16), 1, None, 2e-3),
        ("op=Sum", dict(op=thvd.Sum), 1, None, 1e-6),
        ("clip 2-norm", {}, 1, (0.05, 2.0), 1e-6),
        ("clip inf-norm", {}, 1, (0.02, float("inf")), 1e-6)]:
    for stage in (1, 2):
        what = f"{label} stage={stage}"
        ref_model, model = fresh(), fresh()
        ref_opt = thvd.DistributedOptimizer(OPTIMIZERS["Adam"](groups(ref_model, 0.1)),
                                            named_parameters=ref_model.named_parameters(),
                                            **kw)
        opt = thvd.ShardedDistributedOptimizer(
            OPTIMIZERS["Adam"](groups(model, 0.1)), named_parameters=model.named_parameters(),
            stage=stage, bucket_cap_mb=CAP, shard_size=shard_sizes()[-1], **kw)
        for step in range(3):
            n_ref = train_step(ref_model, ref_opt, step, passes, clip)
            n = train_step(model, opt, step, passes, clip)
            if clip is not None:
                t_close(n.reshape(1).float(), n_ref.reshape(1).float(),
                        f"{what}: total norm step {step}", rtol=1e-5, atol=1e-7)
                check(float(n_ref) > clip[0], f"{what}: the norm is over the threshold")
            if clip is not None and stage == 1:
                for p, q in zip(model.parameters(), ref_model.parameters()):
                    if q.grad is not None and p.requires_grad:
                        t_close(p.grad, q.grad, f"{what}: stage 1 p.grad after clipping",
                                rtol=1e-5, atol=1e-7)
        compare(model, params_of(ref_model), what, rtol=tol, atol=tol)
        identical_in(model, opt, what)

# Checkpoints: shards saved with one shard size load into another (a list of one
# partition group's state_dict()s, or the consolidated dict), and training goes on
# exactly as without the round trip.
S_old = shard_sizes()[0]
base = fresh()
opt = thvd.ShardedDistributedOptimizer(OPTIMIZERS["Adam"](groups(base, 0.1)),
                                       named_parameters=base.named_parameters(),
                                       shard_size=S_old, bucket_cap_mb=CAP)
for step in range(2):
    train_step(base, opt, step)
torch.save(opt.state_dict(), f"{TMP}/shard.{R}.pt")
cons = opt.consolidated_state_dict(root_rank=0)
if R == 0:
    torch.save(cons, f"{TMP}/full.pt")
thvd.barrier()
shards = [torch.load(f"{TMP}/shard.{r}.pt") for r in range(S_old)]
full = torch.load(f"{TMP}/full.pt")
for S_new in shard_sizes():
    for label, loaded in [("a list of shards", shards), ("the consolidated dict", full)]:
        what = f"load {label} S={S_old}->{S_new}"
        model = copy.deepcopy(base)
        opt2 = thvd.ShardedDistributedOptimizer(
            OPTIMIZERS["Adam"](groups(model, 0.1)), named_parameters=model.named_parameters(),
            shard_size=S_new, bucket_cap_mb=CAP * 3)
        opt2.load_state_dict(loaded)
        for step in range(2, 4):
            train_step(model, opt2, step)
        if label == "a list of shards":
            check(sorted(opt2.state_dict()["state"]) == list(range(len(opt2._pieces))),
                  f"{what}: every piece has state")
        expect = copy.deepcopy(base)
        o3 = thvd.ShardedDistributedOptimizer(
            OPTIMIZERS["Adam"](groups(expect, 0.1)), named_parameters=expect.named_parameters(),
            shard_size=S_old, bucket_cap_mb=CAP)
        o3.load_state_dict(opt.state_dict())          # its own layout: loaded as it is
        for step in range(2, 4):
            train_step(expect, o3, step)
        compare(model, params_of(expect), what)
if P > 1:
    other = torch.load(f"{TMP}/shard.{(R + 1) % S_old}.pt") if S_old > 1 else None
    if other is not None:
        check_raises(ValueError, lambda: opt.load_state_dict(other), "shard_size=",
                     "pass the list", what="loading another member's shard")
    check_raises(ValueError, lambda: opt.load_state_dict(shards[:-1] if S_old > 1 else []),
                 what="an incomplete list of shards")

# broadcast_optimizer_state: rank 0's hyperparameters, and each shard from its replica in
# rank 0's partition group.
model = fresh()
opt = thvd.ShardedDistributedOptimizer(OPTIMIZERS["Adam"](groups(model, 0.1)),
                                       named_parameters=model.named_parameters(),
                                       shard_size=shard_sizes()[-1], bucket_cap_mb=CAP)
ref_model = fresh()
ref_opt = thvd.DistributedOptimizer(OPTIMIZERS["Adam"](groups(ref_model, 0.1)),
                                    named_parameters=ref_model.named_parameters())
for step in range(2):
    train_step(model, opt, step)
    train_step(ref_model, ref_opt, step)
if R == 0:
    opt.param_groups[0]["lr"] = 0.02
    ref_opt.param_groups[0]["lr"] = 0.02
elif R >= opt.shard_size:           # not rank 0's partition group: spoil this shard
    for s in opt._inner.state.values():
        for k, v in s.items():
            if k != "step":
                v.mul_(3)
thvd.broadcast_optimizer_state(opt, root_rank=0)
thvd.broadcast_optimizer_state(ref_opt, root_rank=0)
check(opt.param_groups[0]["lr"] == 0.02, "broadcast_optimizer_state: lr from rank 0")
for step in range(2, 4):
    train_step(model, opt, step)
    train_step(ref_model, ref_opt, step)
compare(model, params_of(ref_model), "after broadcast_optimizer_state")
finish()
'''


@pytest.mark.parametrize("np_", [2, 3, 4], ids=lambda n: f"np{n}")
def test_sharded_matches_distributed_optimizer(np_, tmp_path):
    run_torch(EQUIVALENCE, np_, timeout=400, env={"HVDTEST_TMP": tmp_path})


def test_hybrid_shards_inside_fake_nodes(tmp_path):
    """shard_size=hvd.local_size() on two fake nodes of two ranks: MiCS's two hops
    (reduce-scatter in the node, allreduce across)."""
    run_torch(COMMON + r'''
check(thvd.local_size() == 2 and thvd.size() == 4, "two fake nodes of two ranks")
''' + EQUIVALENCE[len(COMMON):], 4, timeout=400, launcher_args=FAKE_NODES,
              env={"HVDTEST_TMP": tmp_path, "HVDTEST_LOCAL_SHARDS": "1"})


WORLD_CHANGE = COMMON + r'''
# Phase "save" (4 ranks, 2 partition groups) then phase "load" (2 ranks, 1 group); both
# compare against a single-process replay of the whole run with plain Adam.
PHASE = os.environ["HVDTEST_PHASE"]
OLD_P = 4


def reference(steps):
    model = Net(100)
    opt = OPTIMIZERS["Adam"](groups(model, 0.1))
    for step in range(steps):
        ranks = OLD_P if step < 3 else 2
        opt.zero_grad()
        loss = sum(F.cross_entropy(model(batch(10 * step, r)[0]), batch(10 * step, r)[1])
                   for r in range(ranks)) / ranks
        loss.backward()
        model.unused.grad = torch.zeros(4)    # Horovod: a gradient no rank computed is 0
        opt.step()
    return params_of(model)


if PHASE == "save":
    model = fresh(100)
    opt = thvd.ShardedDistributedOptimizer(OPTIMIZERS["Adam"](groups(model, 0.1)),
                                           named_parameters=model.named_parameters(),
                                           shard_size=2, bucket_cap_mb=CAP)
    for step in range(3):
        train_step(model, opt, step)
    compare(model, reference(3), "before the checkpoint", rtol=1e-5, atol=1e-6)
    torch.save(opt.state_dict(), f"{TMP}/shard.{R}.pt")
    cons = opt.consolidated_state_dict(root_rank=0)
    if R == 0:
        torch.save(cons, f"{TMP}/full.pt")
        torch.save(model.state_dict(), f"{TMP}/model.pt")
else:
    for label, load in [("shards of a 4-rank job", lambda: [torch.load(f"{TMP}/shard.{r}.pt")
                                                           for r in range(2)]),
                        ("the other partition group's shards",
                         lambda: [torch.load(f"{TMP}/shard.{r}.pt") for r in (2, 3)]),
                        ("a consolidated dict", lambda: torch.load(f"{TMP}/full.pt"))]:
        for S in (2, 1):
            model = Net(0)
            model.load_state_dict(torch.load(f"{TMP}/model.pt"))
            opt = thvd.ShardedDistributedOptimizer(OPTIMIZERS["Adam"](groups(model, 0.1)),
                                                   named_parameters=model.named_parameters(),
                                                   shard_size=S, bucket_cap_mb=CAP * 2)
            opt.load_state_dict(load())
            for step in range(3, 6):
                train_step(model, opt, step)
            compare(model, reference(6), f"resumed from {label} with shard_size={S}",
                    rtol=1e-5, atol=1e-6)
    shard = torch.load(f"{TMP}/shard.{R}.pt")
    check_raises(ValueError, lambda: opt.load_state_dict(shard), "shard_size=2 of 4",
                 "pass the list", what="one shard of another world size")
    check_raises(ValueError, lambda: opt.load_state_dict([shard]), "every member",
                 what="a list missing a member")
finish()
'''


def test_checkpoint_round_trip_across_a_change_of_world_size(tmp_path):
    run_torch(WORLD_CHANGE, 4, timeout=300, env={"HVDTEST_TMP": tmp_path,
                                                 "HVDTEST_PHASE": "save"})
    run_torch(WORLD_CHANGE, 2, timeout=300, env={"HVDTEST_TMP": tmp_path,
                                                 "HVDTEST_PHASE": "load"})


ERRORS = COMMON + r'''
def wrap(opt, **kw):
    return lambda: thvd.ShardedDistributedOptimizer(opt, **kw)


model = fresh()
refused = [torch.optim.LBFGS(model.parameters())]
for name in ("Adafactor", "Muon"):
    if hasattr(torch.optim, name):
        refused.append(getattr(torch.optim, name)([model.fc1.weight, model.fc2.weight]))


class MyAdam(torch.optim.Adam):
    pass


refused.append(MyAdam(model.parameters()))
for o in refused:
    check_raises(ValueError, wrap(o), f"cannot shard {type(o).__name__}",
                 "use hvd.DistributedOptimizer", what=f"{type(o).__name__} refused")
adam = torch.optim.Adam(model.parameters())
check_raises(ValueError, wrap(adam, shard_size=P + 1), f"shard_size={P + 1} does not "
             f"divide the process set's size {P}", what="shard_size not dividing")
check_raises(ValueError, wrap(adam, shard_size=0), "positive int", what="shard_size 0")
check_raises(ValueError, wrap(adam, stage=3), "stage must be 1", what="stage 3")
check_raises(ValueError, wrap(adam, op=thvd.Max), "op=hvd.Average or op=hvd.Sum",
             what="op=Max")
check_raises(NotImplementedError, wrap(adam, op=thvd.Adasum), "Adasum", what="Adasum")
check_raises(ValueError, wrap(adam, backward_passes_per_step=0), "positive int",
             what="backward_passes_per_step=0")
check_raises(ValueError, wrap(adam, named_parameters=[("a", model.fc1.weight)]),
             "not named", what="named_parameters missing some")
check_raises(TypeError, wrap(object()), "torch.optim.Optimizer", what="not an optimizer")
do = thvd.DistributedOptimizer(torch.optim.SGD(fresh().parameters(), lr=0.1))
check_raises(ValueError, wrap(do), "already wrapped", what="a DistributedOptimizer")

model = fresh()
opt = thvd.ShardedDistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
x, y = batch(0, R)
F.cross_entropy(model(x), y).backward()
check_raises(AssertionError, lambda: F.cross_entropy(model(x), y).backward(),
             "more than backward_passes_per_step", what="too many backward passes")
check_raises(AssertionError, opt.zero_grad, "zero_grad() was called after loss.backward()",
             what="zero_grad while reducing")
opt.step()
check_raises(NotImplementedError, lambda: opt.add_param_group({"params": [torch.zeros(2)]}),
             "cannot add parameter groups", what="add_param_group")
check_raises(ValueError, lambda: opt.load_state_dict({"nope": 1}), "expects a torch optimizer",
             what="a bad state dict")
check_raises(ValueError, lambda: opt.clip_grad_norm_(1.0, norm_type=-1), "norm_type",
             what="a negative norm type")


def step_skipping_synchronize():
    with opt.skip_synchronize():
        opt.step()


check_raises(AssertionError, step_skipping_synchronize, "explicit optimizer.synchronize()")

torch.manual_seed(0)
emb = nn.Embedding(5, 2, sparse=True)
sopt = thvd.ShardedDistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.1))
check_raises(ValueError, lambda: emb(torch.tensor([1, 2])).sum().backward(),
             "sparse gradient", what="a sparse gradient")
finish()
'''


def test_refusals_and_errors():
    run_torch(ERRORS, 2, timeout=200)


IN_PLACE = rank_program("torch_sharded_in_place")


@pytest.mark.parametrize("np_", [2, 3])
def test_collectives_write_into_the_optimizers_buffers(np_):
    run_torch(IN_PLACE, np_, timeout=200)


STATIC_SETS = rank_program("torch_sharded_static_sets")


def test_static_process_sets_are_completed_by_the_optimizer():
    run_torch(STATIC_SETS, 4, timeout=200)


PLAIN_INIT = rank_program("torch_sharded_plain_init")


def test_sharded_optimizer_works_after_a_plain_init():
    run_torch(PLAIN_INIT, 4, timeout=200)


KILLED = rank_program("torch_sharded_killed")


@pytest.mark.parametrize("np_,shards", [(3, 3), (4, 2)], ids=["np3-whole", "np4-hybrid"])
def test_a_killed_rank_fails_the_job_naming_it(np_, shards):
    res = run_ranks(KILLED, np=np_, timeout=120, env={"HVDTEST_SHARDS": shards})
    host = socket.gethostname()
    assert res.returncode == 128 + signal.SIGKILL, res.describe()
    assert f"rank {np_ - 1} (host {host}) was killed by signal 9" in res.stderr, \
        res.describe()
    assert res.elapsed < 60, res.describe()
