"""Gradient compression for slow links in horovodlike.torch's DistributedOptimizer:
Compression.bf16 and hvd.PowerSGD, on real ranks.

Every rank can regenerate every rank's gradients (seeded by step and rank), so it checks
the compressed results against the exact average it computes itself.
"""
import importlib.util

import pytest

from harness import rank_program, run_ranks
from test_torch_support import run_torch

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(300)

COMMON = r'''
import copy, io
hvd.init()
R, P = thvd.rank(), thvd.size()
import torch.nn as nn
import torch.nn.functional as F


def grad_of(shape, step, r, dtype=torch.float64):
    g = torch.Generator()
    g.manual_seed(100_000 * step + 100 * r + len(shape))
    return torch.randn(*shape, generator=g, dtype=dtype)


class Params(nn.Module):
    """Parameters whose gradient is whatever backward_with() says (loss = sum(p * g))."""
    def __init__(self, shapes, dtype=torch.float64):
        super().__init__()
        self.ps = nn.ParameterList([nn.Parameter(torch.zeros(s, dtype=dtype))
                                    for s in shapes])

    def backward_with(self, grads):
        sum((p * g).sum() for p, g in zip(self.ps, grads)).backward()


SHAPES = [(6, 4), (3, 5, 2), (7,), (8, 9)]


def average(step, shapes=SHAPES, ranks=None):
    ranks = range(P) if ranks is None else ranks
    return [sum(grad_of(s, step, r) for r in ranks) / len(ranks) for s in shapes]


def make_opt(model, psgd, **kw):
    return thvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters(),
                                     compression=psgd, **kw)


def mlp(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 10), nn.Tanh(),
                         nn.Linear(10, 3))


def mlp_batch(step, r):
    g = torch.Generator()
    g.manual_seed(1000 * step + r)
    return torch.randn(8, 12, generator=g), torch.randint(0, 3, (8,), generator=g)


def mlp_step(model, opt, step):
    opt.zero_grad()
    x, y = mlp_batch(step, R)
    F.cross_entropy(model(x), y).backward()
    opt.step()
'''

ALGORITHM = COMMON + r'''
# ------------------------------------------------ exact reconstruction at full rank
# r = min(n, m): P spans the averaged gradient's columns, so P Qᵀ is the exact average.
model = Params(SHAPES)
psgd = thvd.PowerSGD(rank=16, start_iter=0, min_compression_rate=0)
opt = make_opt(model, psgd)
for step in range(3):
    opt.zero_grad()
    model.backward_with([grad_of(s, step, R) for s in SHAPES])
    opt.synchronize()
    for p, exp, s in zip(model.ps, average(step), SHAPES):
        t_close(p.grad, exp, f"full-rank PowerSGD step {step} shape {s}", rtol=1e-9,
                atol=1e-11)
        same_on_every_rank(p.grad, f"full-rank PowerSGD step {step} shape {s} identical")
    check(sorted(psgd.qs) == ["ps.0", "ps.1", "ps.3"], "matrices compressed",
          str(sorted(psgd.qs)))
rate, before, after = psgd.compression_stats()
check(before == 3 * sum(int(np.prod(s)) for s in SHAPES) and after > 0, "stats",
      str((rate, before, after)))

# ------------------------------------------------ error feedback carries the residual
model = Params(SHAPES)
psgd = thvd.PowerSGD(rank=1, start_iter=0, min_compression_rate=0)
opt = make_opt(model, psgd)
prev = {}
for step in range(3):
    opt.zero_grad()
    mine = [grad_of(s, step, R) for s in SHAPES]
    model.backward_with(mine)
    opt.synchronize()
    for i, (p, g, s) in enumerate(zip(model.ps, mine, SHAPES)):
        name = f"ps.{i}"
        if len(s) == 1:
            t_close(p.grad, average(step)[i], f"vector step {step} uncompressed", 1e-12, 1e-14)
            check(name not in psgd.errors, "no error buffer for a vector")
            continue
        m = g.reshape(s[0], -1) + prev.get(name, torch.zeros(()))   # M = G + E_prev
        err = psgd.errors[name]
        # The buffer is M - M̂ (M̂ is the rank-1 approximation now in p.grad) ...
        t_close(err, m - p.grad.reshape(s[0], -1), f"E = M - M̂ step {step} {s}", 1e-12, 1e-12)
        check(torch.linalg.matrix_rank(p.grad.reshape(s[0], -1)).item() == 1,
              f"M̂ has rank 1 step {step} {s}")
        # ... and M̂ plus the average of the residuals is the average of the M's.
        avg_err = thvd.allreduce(err, name=f"err.{step}.{i}")
        avg_m = thvd.allreduce(m, name=f"m.{step}.{i}")
        t_close(p.grad.reshape(s[0], -1) + avg_err, avg_m, f"avg(M) = M̂ + avg(E) {step}",
                1e-9, 1e-11)
        prev[name] = err.clone()

# ------------------------------------------------ warm-up equals the uncompressed run
ref, comp = mlp(1), mlp(1)
opt_ref = thvd.DistributedOptimizer(torch.optim.SGD(ref.parameters(), lr=0.1),
                                    named_parameters=ref.named_parameters())
opt_c = make_opt(comp, thvd.PowerSGD(rank=1, start_iter=3))
for step in range(4):
    mlp_step(ref, opt_ref, step)
    mlp_step(comp, opt_c, step)
    same = all(torch.equal(a, b) for a, b in zip(ref.parameters(), comp.parameters()))
    check(same == (step < 3), f"warm-up step {step}: equal to uncompressed is {same}")

# ------------------------------------------------ ranks stay bit-identical
for kw in ({}, {"backward_passes_per_step": 2}):
    model = mlp(2)
    psgd = thvd.PowerSGD(rank=2, start_iter=1)
    opt = make_opt(model, psgd, **kw)
    for step in range(6):
        if kw:
            opt.zero_grad()
            for half in range(2):
                x, y = mlp_batch(step * 2 + half, R)
                F.cross_entropy(model(x), y).backward()
            opt.step()
        else:
            mlp_step(model, opt, step)
        same_on_every_rank(flat_params(model), f"params identical step {step} {kw}")
    check(psgd.iter == 6 and psgd.errors, f"compressed 5 steps {kw}", str(psgd.iter))

# backward_passes_per_step accumulates locally: at full rank, equal to the average of
# the summed passes.
model = Params(SHAPES)
opt = make_opt(model, thvd.PowerSGD(rank=16, start_iter=0, min_compression_rate=0),
               backward_passes_per_step=2)
opt.zero_grad()
model.backward_with([grad_of(s, 0, R) for s in SHAPES])
model.backward_with([grad_of(s, 1, R) for s in SHAPES])
opt.synchronize()
for p, a, b, s in zip(model.ps, average(0), average(1), SHAPES):
    t_close(p.grad, a + b, f"backward_passes_per_step=2 {s}", 1e-9, 1e-11)

# ------------------------------------------------ process sets
if P >= 3:
    members = [0, P - 1]
    ps_ = thvd.add_process_set(members)
    model = Params(SHAPES)
    opt = make_opt(model, thvd.PowerSGD(rank=16, start_iter=0, min_compression_rate=0),
                   process_set=ps_)
    opt.zero_grad()
    model.backward_with([grad_of(s, 0, R) for s in SHAPES])
    opt.synchronize()
    for p, exp, s in zip(model.ps, average(0, ranks=members), SHAPES):
        if R in members:
            t_close(p.grad, exp, f"process set {s}", 1e-9, 1e-11)
        else:
            t_equal(p.grad, grad_of(s, 0, R), f"outside the set {s} untouched")
    thvd.remove_process_set(ps_)
finish()
'''

STATE = COMMON + r'''
from horovodlike.torch.elastic import TorchState


def run(model, opt, steps):
    for step in steps:
        mlp_step(model, opt, step)
    return flat_params(model)


# ------------------------------------------------ state_dict round trip (through bytes)
model = mlp(3)
psgd = thvd.PowerSGD(rank=2, start_iter=1)
opt = make_opt(model, psgd)
run(model, opt, range(3))
buf = io.BytesIO()
torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
sd = opt.state_dict()["powersgd"]
check(sd["iter"] == 3 and set(sd["errors"]) == set(sd["qs"]) and sd["errors"],
      "state_dict has PowerSGD's state", str({k: (v if k == "iter" else sorted(v))
                                              for k, v in sd.items() if k in ("iter", "qs")}))
first = run(model, opt, range(3, 6))
buf.seek(0)
saved = torch.load(buf, weights_only=False)
model.load_state_dict(saved["model"])
opt.load_state_dict(saved["opt"])
check(psgd.iter == 3, "iter restored", str(psgd.iter))
t_equal(run(model, opt, range(3, 6)), first, "replay after load_state_dict")

# A fresh optimizer loading the checkpoint continues the same way.
model2 = mlp(99)
psgd2 = thvd.PowerSGD(rank=2, start_iter=1)
opt2 = make_opt(model2, psgd2)
model2.load_state_dict(saved["model"])
opt2.load_state_dict(saved["opt"])
t_equal(run(model2, opt2, range(3, 6)), first, "fresh optimizer from the checkpoint")

# ------------------------------------------------ elastic TorchState save / restore
model = mlp(4)
psgd = thvd.PowerSGD(rank=2, start_iter=1)
opt = make_opt(model, psgd)
run(model, opt, range(3))
state = TorchState(model, opt, epoch=0)
state.save()
first = run(model, opt, range(3, 6))
state.restore()
check(psgd.iter == 3, "elastic restore: iter", str(psgd.iter))
t_equal(run(model, opt, range(3, 6)), first, "elastic replay after restore")
# sync (what a re-formed job runs): every rank takes rank 0's Q's and step count, and
# keeps its own residuals.
mine = {k: v.clone() for k, v in psgd.errors.items()}
if R != 0:
    psgd.qs = {k: torch.zeros_like(v) for k, v in psgd.qs.items()}
    psgd.iter = 0
state.sync()
check(psgd.iter == 6, "elastic sync: iter from rank 0", str(psgd.iter))
for k, q in psgd.qs.items():
    same_on_every_rank(q, f"elastic sync: Q {k} from rank 0")
    t_equal(psgd.errors[k], mine[k], f"elastic sync: rank {R} keeps its residual {k}")
same_on_every_rank(run(model, opt, range(6, 8)), "identical after sync")

# ------------------------------------------------ bf16
x = torch.randn(100, dtype=torch.float64) * 1000
c, ctx = thvd.Compression.bf16.compress(x)
check(c.dtype == torch.bfloat16 and ctx == torch.float64, "bf16 compress", str(c.dtype))
t_equal(thvd.Compression.bf16.decompress(c, ctx), x.to(torch.bfloat16).double(),
        "bf16 round trip")
for t in (torch.ones(3, dtype=torch.float16), torch.ones(3, dtype=torch.bfloat16),
          torch.arange(3)):
    c, ctx = thvd.Compression.bf16.compress(t)
    check(c is t and ctx is None, f"bf16 leaves {t.dtype} alone")
model = Params(SHAPES, dtype=torch.float32)
opt = thvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                named_parameters=model.named_parameters(),
                                compression=thvd.Compression.bf16)
opt.zero_grad()
model.backward_with([grad_of(s, 0, R, torch.float32) for s in SHAPES])
opt.synchronize()
for p, s in zip(model.ps, SHAPES):
    # Each rank's gradient is rounded to bf16, summed in bf16 and cast back.
    exp = sum(grad_of(s, 0, r, torch.float32).to(torch.bfloat16).double()
              for r in range(P)) / P
    check(p.grad.dtype == torch.float32, "bf16: gradient dtype kept")
    t_close(p.grad, exp.float(), f"bf16 allreduce {s}", rtol=2 ** -7, atol=2 ** -7)
    bad = (p.grad.to(torch.bfloat16).float() != p.grad).sum().item()
    check(bad == 0, f"bf16 allreduce {s}: values are bf16 values", f"{bad} are not")

# ------------------------------------------------ bad input
def raises(fn, exc, text, what):
    try:
        fn()
    except exc as e:
        check(text in str(e), what, str(e))
    else:
        fail(what, f"no {exc.__name__}")


m = mlp(5)
raises(lambda: make_opt(m, thvd.PowerSGD(), op=thvd.Sum), ValueError, "op=hvd.Average",
       "op=Sum refused")
raises(lambda: make_opt(m, thvd.PowerSGD), TypeError, "needs an instance", "class refused")
shared = thvd.PowerSGD()
make_opt(m, shared)
raises(lambda: make_opt(m, shared), ValueError, "already belongs", "shared object refused")
raises(lambda: thvd.PowerSGD(rank=0), ValueError, "rank must be", "rank=0 refused")
raises(lambda: thvd.PowerSGD(start_iter=-1), ValueError, "start_iter", "start_iter<0 refused")
raises(lambda: thvd.PowerSGD(min_compression_rate=float("nan")), ValueError,
       "min_compression_rate", "nan rate refused")
raises(lambda: thvd.PowerSGD().compress(torch.ones(2)), NotImplementedError,
       "horovodlike.tensorflow", "per-tensor use refused")
raises(lambda: opt2.load_state_dict({**opt2.state_dict(), "powersgd": {"iter": 1}}),
       ValueError, "keys iter, qs, errors", "bad PowerSGD state refused")
finish()
'''

DIGITS = rank_program("torch_powersgd_digits")


def test_powersgd_algorithm_on_real_ranks():
    """Full-rank exactness, error feedback, warm-up, bit-identity,
    backward_passes_per_step and process sets, at 3 ranks."""
    run_torch(ALGORITHM, 3, timeout=180, env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"})


def test_powersgd_state_round_trips_and_bf16():
    """state_dict and elastic TorchState round trips, elastic sync, bf16, bad input."""
    run_torch(STATE, 2, timeout=180)


def test_powersgd_digits_accuracy_within_one_point():
    pytest.importorskip("sklearn")
    res = run_torch(DIGITS, 2, timeout=180)
    print([l for l in res.stdout.splitlines() if "accuracy" in l])


TF_REFUSAL = rank_program("torch_powersgd_tf_refusal")


def test_tensorflow_bf16_compressor_and_powersgd_refusal():
    tf = pytest.importorskip("tensorflow")
    from tf_support import TF_ENV
    run_ranks(TF_REFUSAL, 1, "python", env=TF_ENV, timeout=120).assert_ok()
    from horovodlike.tensorflow.compression import Compression
    x = tf.constant([1.0, 1.0 + 2 ** -10, 3e38], dtype=tf.float32)
    c, ctx = Compression.bf16.compress(x)
    assert c.dtype == tf.bfloat16 and ctx == tf.float32
    out = Compression.bf16.decompress(c, ctx)
    assert out.dtype == tf.float32
    assert out.numpy().tolist() == tf.cast(tf.cast(x, tf.bfloat16), tf.float32).numpy().tolist()
    assert out.numpy()[1] == 1.0             # 8 significant bits
    h = tf.constant([1.0], dtype=tf.float16)
    assert Compression.bf16.compress(h) == (h, None)
