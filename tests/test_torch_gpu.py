"""CUDA tensors through the staging pipeline (horovodlike/torch/_staging.py), at 2 ranks
sharing one GPU (torch.cuda.set_device(local_rank % device_count)). Skipped without CUDA.

- every collective and dtype on CUDA tensors against the same op on CPU tensors (the
  unstaged path), bit for bit, and the outputs are on the tensor's device;
- a CUDA model trained with DistributedOptimizer (buckets, and groups: fused ops) equal
  to the CPU run within fp tolerance; broadcast_optimizer_state of CUDA state;
- stream races: a kernel queued on the current stream writes the tensor (or, inside
  backward, the gradient) just before the op, behind a long GPU sleep, also on a side
  stream made current; the op must wait for it, and its result must be ready for the
  current stream when synchronize() returns;
- a rank killed during a staged CUDA op is named by the survivor;
- without HOROVODLIKE_EXPERIMENTAL_CUDA=1 a CUDA tensor still gets the clear error.
"""
import importlib.util

import pytest
import torch

from test_torch_staging import killed_rank_during_staged_op
from test_torch_support import run_torch

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA device (torch.cuda.is_available() is "
                                        "False)")]
if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark.append(pytest.mark.timeout(300))

CUDA = {"HOROVODLIKE_EXPERIMENTAL_CUDA": "1"}

GPU_PRELUDE = r'''
import zlib
hvd.init()
R, P = thvd.rank(), thvd.size()
torch.cuda.set_device(thvd.local_rank() % torch.cuda.device_count())
DEV = torch.device("cuda", torch.cuda.current_device())
from horovodlike.torch import _staging


def same(cpu_out, gpu_out, what):
    """The CUDA op's output is on the GPU and equals the CPU op's, bit for bit."""
    if isinstance(cpu_out, (list, tuple)):
        check(len(cpu_out) == len(gpu_out), what, "lengths differ")
        for i, (c, g) in enumerate(zip(cpu_out, gpu_out)):
            same(c, g, f"{what}[{i}]")
        return
    if gpu_out.device.type != "cuda" and not what.endswith("splits"):
        fail(what, f"output on {gpu_out.device}, expected the GPU")
        return
    t_equal(gpu_out.cpu(), cpu_out, what)


def data(dtype, shape, key):
    g = torch.Generator()
    g.manual_seed(zlib.crc32(repr((key, R)).encode()))
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) < 0.5
    return torch.randint(1, 4, shape, generator=g).to(dtype)
'''

COLLECTIVES = GPU_PRELUDE + r'''
OPS = [thvd.Sum, thvd.Average, thvd.Min, thvd.Max, thvd.Product]
for dtype in ALL_TORCH_DTYPES:
    for op in OPS:
        if dtype == torch.bool and op == thvd.Average:
            continue
        for shape in [(), (5,), (3, 4), (0, 2), (600, 1000)]:   # the last: pieces (>= 4 bytes)
            x = data(dtype, shape, ("ar", str(dtype), op, shape))
            what = f"allreduce {dtype} op={op} {shape}"
            same(thvd.allreduce(x, op=op, name=what + "c"),
                 thvd.allreduce(x.to(DEV), op=op, name=what + "g"), what)
    x = data(dtype, (6, 3), ("misc", str(dtype)))
    xs = [data(dtype, (i + 1, 2), ("grp", str(dtype), i)) for i in range(4)]
    # in place, async, non-contiguous
    g = x.to(DEV).t()
    h = thvd.allreduce_async_(g, op=thvd.Max, name=f"ip {dtype}")
    while not thvd.poll(h):
        pass
    same(thvd.allreduce(x.t(), op=thvd.Max, name=f"ipc {dtype}"), thvd.synchronize(h),
         f"allreduce_ non-contiguous {dtype}")
    # grouped (one fused staged op), in place and not
    same(thvd.grouped_allreduce(xs, op=thvd.Sum, name=f"gc {dtype}"),
         thvd.grouped_allreduce([t.to(DEV) for t in xs], op=thvd.Sum, name=f"gg {dtype}"),
         f"grouped_allreduce {dtype}")
    gs = [t.to(DEV) for t in xs]
    thvd.grouped_allreduce_(gs, op=thvd.Max, name=f"gig {dtype}")
    same(thvd.grouped_allreduce(xs, op=thvd.Max, name=f"gic {dtype}"), gs,
         f"grouped_allreduce_ {dtype}")
    # allgather with a different first dimension per rank, grouped allgather
    y = data(dtype, (R + 1, 3), ("ag", str(dtype)))
    same(thvd.allgather(y, name=f"agc {dtype}"), thvd.allgather(y.to(DEV), name=f"agg {dtype}"),
         f"allgather {dtype}")
    same(thvd.grouped_allgather(xs, name=f"gagc {dtype}"),
         thvd.grouped_allgather([t.to(DEV) for t in xs], name=f"gagg {dtype}"),
         f"grouped_allgather {dtype}")
    # broadcast from every root, in place
    for root in range(P):
        same(thvd.broadcast(x, root, name=f"bc {dtype} {root}"),
             thvd.broadcast(x.to(DEV), root, name=f"bg {dtype} {root}"),
             f"broadcast {dtype} root {root}")
        b = x.to(DEV)
        thvd.broadcast_(b, root, name=f"big {dtype} {root}")
        same(thvd.broadcast(x, root, name=f"bic {dtype} {root}"), b,
             f"broadcast_ {dtype} root {root}")
    # alltoall with uneven splits
    splits = [(R + j) % 3 + 1 for j in range(P)]
    a = data(dtype, (sum(splits), 2), ("a2a", str(dtype)))
    co, cs = thvd.alltoall(a, splits=splits, name=f"a2ac {dtype}")
    go, gs_ = thvd.alltoall(a.to(DEV), splits=splits, name=f"a2ag {dtype}")
    same(co, go, f"alltoall {dtype}")
    same(cs, gs_, f"alltoall {dtype} splits")
    # reducescatter (Sum and Average are its ops), grouped
    if dtype != torch.bool:
        r = data(dtype, (5, 2), ("rs", str(dtype)))
        for op in (thvd.Sum, thvd.Average):
            same(thvd.reducescatter(r, op=op, name=f"rsc {dtype} {op}"),
                 thvd.reducescatter(r.to(DEV), op=op, name=f"rsg {dtype} {op}"),
                 f"reducescatter {dtype} op={op}")
        same(thvd.grouped_reducescatter(xs, op=thvd.Sum, name=f"grsc {dtype}"),
             thvd.grouped_reducescatter([t.to(DEV) for t in xs], op=thvd.Sum,
                                        name=f"grsg {dtype}"),
             f"grouped_reducescatter {dtype}")

# autograd through allreduce and allgather on the GPU
x = torch.linspace(-1, 1, 9, device=DEV, requires_grad=True)
y = thvd.allreduce(x * (R + 1), op=thvd.Sum)
y.sum().backward()
check(x.grad.device.type == "cuda", "allreduce backward on the GPU")
t_equal(x.grad.cpu(), torch.full((9,), float(P * (R + 1))), "allreduce backward")

st = _staging.stats()
check(st.get("ops", 0) > 500 and st.get("pieces", 0) > st.get("ops", 0), "staged in pieces",
      f"{st}")
check(st.get("fused_groups", 0) > 0, "grouped ops fused", f"{st}")
finish()
'''

TRAINING = GPU_PRELUDE + r'''
import torch.nn as nn
# Full fp32 on the GPU (no TF32), so that only summation order differs from the CPU.
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(8 * 8 * 8, 32), nn.Tanh(), nn.Linear(32, 10))


def train(device, **kw):
    model = make_model().to(device)
    opt = thvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                    named_parameters=model.named_parameters(), **kw)
    thvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for step in range(5):
        g = torch.Generator()
        g.manual_seed(1000 * step + R)
        xb = torch.randn(16, 3, 8, 8, generator=g).to(device)
        yb = torch.randint(0, 10, (16,), generator=g).to(device)
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1).double().cpu() for p in model.parameters()])


for kw in ({}, {"groups": 2}, {"backward_passes_per_step": 1, "op": thvd.Sum}):
    cpu = train("cpu", **kw)
    gpu = train(DEV, **kw)
    t_close(gpu, cpu, f"CUDA training equals CPU training {kw}", rtol=1e-4, atol=1e-4)
    same_on_every_rank(gpu, f"CUDA parameters identical on every rank {kw}")
check(_staging.stats().get("ops", 0) > 0, "the CUDA gradients were staged")

# broadcast_optimizer_state of CUDA state larger than a piece: the other ranks receive it
# on their GPU, so every rank stages the same pieces.
big = nn.Linear(1024, 2048).to(DEV)                 # 8 MiB of weights
adam = torch.optim.Adam(big.parameters(), lr=0.01)
if R == 0:
    big(torch.ones(4, 1024, device=DEV)).sum().backward()
    adam.step()
thvd.broadcast_optimizer_state(adam, root_rank=0)
exp_avg = adam.state[big.weight]["exp_avg"]
check(exp_avg.device.type == "cuda", "optimizer state on the GPU", str(exp_avg.device))
check(bool(exp_avg.abs().sum() > 0), "root's optimizer state arrived")
same_on_every_rank(exp_avg.reshape(-1).cpu(), "optimizer state identical on every rank")
finish()
'''

STREAM_RACE = GPU_PRELUDE + r'''
SLEEP = int(2e8)      # GPU cycles: ~0.1 s of kernel queued before the write
N = 3 << 20           # 12 MiB: several pieces
for stream in (None, torch.cuda.Stream()):
    ctx = torch.cuda.stream(stream) if stream is not None else torch.cuda.stream(
        torch.cuda.current_stream())
    with ctx:
        tag = "side stream" if stream is not None else "default stream"
        for i in range(3):
            x = torch.zeros(N, device=DEV)
            torch.cuda._sleep(SLEEP)
            x.fill_(R + 1 + i)                      # queued behind the sleep
            y = thvd.allreduce(x, op=thvd.Sum, name=f"race {tag} {i}")
            # used at once on the current stream: must already hold the result
            s = (y == float(sum(range(1, P + 1)) + P * i)).all()
            check(bool(s), f"allreduce waited for the current stream ({tag}, {i})",
                  f"got {y[:4].tolist()}")
            # in place, after a sleep as well
            torch.cuda._sleep(SLEEP)
            x.fill_(2.0)
            thvd.allreduce_(x, op=thvd.Sum, name=f"race_ {tag} {i}")
            check(bool((x == 2.0 * P).all()), f"allreduce_ waited ({tag}, {i})",
                  f"got {x[:4].tolist()}")


class SlowGrad(torch.autograd.Function):
    """Its backward queues a long kernel, then writes the gradient behind it."""

    @staticmethod
    def forward(ctx, w):
        return w.clone()

    @staticmethod
    def backward(ctx, g):
        torch.cuda._sleep(SLEEP)
        out = torch.empty_like(g)
        out.fill_(float(R + 1))
        return out


w = torch.nn.Parameter(torch.zeros(N, device=DEV))
opt = thvd.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), named_parameters=[("w", w)],
                                op=thvd.Sum)
for step in range(2):
    opt.zero_grad()
    SlowGrad.apply(w).sum().backward()
    opt.synchronize()
    check(bool((w.grad == float(sum(range(1, P + 1)))).all()),
          f"the hook's allreduce waited for the gradient's kernel (step {step})",
          f"got {w.grad[:4].tolist()}")
    with opt.skip_synchronize():
        opt.step()
finish()
'''

NO_SWITCH = GPU_PRELUDE + r'''
for fn in (lambda: thvd.allreduce(torch.ones(2, device=DEV)),
           lambda: thvd.allgather_async(torch.ones(2, device=DEV)),
           lambda: thvd.broadcast_(torch.ones(2, device=DEV), 0)):
    check_raises(TypeError, fn, "move it to the CPU first", "HOROVODLIKE_EXPERIMENTAL_CUDA=1")
finish()
'''


@pytest.mark.parametrize("body", [pytest.param(COLLECTIVES, id="collectives"),
                                  pytest.param(TRAINING, id="training"),
                                  pytest.param(STREAM_RACE, id="stream-race")])
def test_cuda_tensors_at_two_ranks_sharing_one_gpu(body):
    run_torch(body, 2, "horovodlikerun", timeout=240, env=CUDA)


def test_cuda_tensors_refused_without_the_switch():
    run_torch(NO_SWITCH, 2, "horovodlikerun", timeout=120,
              env={"HOROVODLIKE_EXPERIMENTAL_CUDA": None})


@pytest.mark.timeout(120)
def test_killed_rank_during_staged_cuda_op_is_named(tmp_path):
    killed_rank_during_staged_op(tmp_path, dict(CUDA, STAGE_DEVICE="cuda"))
