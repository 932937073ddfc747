"""torch's own consumers on backend="horovodlike", each against a single-process
reference in float64: DDP (buckets, find_unused_parameters, no_sync, comm hooks), FSDP2
(full and, at 4 ranks, HSDP on a 2-D mesh), DTensor, tensor parallelism, pipelining
(GPipe, 1F1B) and distributed checkpointing. argv[1:]: the parts to run (default all)."""
from _torch_common import *  # noqa: F401,F403
import copy
import os
import sys
import torch.distributed as dist
import torch.nn as nn
import horovodlike.torch.distributed  # noqa: F401

torch.set_default_dtype(torch.float64)
dist.init_process_group("horovodlike")
R, N = dist.get_rank(), dist.get_world_size()
PARTS = sys.argv[1:] or ["ddp", "fsdp", "dtensor", "tp", "pipe", "dcp"]
D = 8


def mlp(seed=0, unused=False):
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(D, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                      nn.Linear(16, 4))
    if unused:
        m.extra = nn.Linear(4, 4)       # never used in forward
    return m


def data(step, rows=4 * N):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(rows, D, generator=g), torch.randn(rows, 4, generator=g)


def reference(model, steps, lr=0.1, micro=1):
    """The single-process run on the global batch (mean loss)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for s in range(steps):
        opt.zero_grad()
        for m in range(micro):
            x, y = data(s * micro + m)
            (nn.functional.mse_loss(model(x), y) / micro).backward()
        opt.step()
    return model


def mine(x):
    return x.chunk(N)[R]


def ddp_run(wrapped, steps, micro=1, lr=0.1):
    opt = torch.optim.SGD(wrapped.parameters(), lr=lr)
    for s in range(steps):
        opt.zero_grad()
        for m in range(micro):
            x, y = data(s * micro + m)
            loss = nn.functional.mse_loss(wrapped(mine(x)), mine(y)) / micro
            if m < micro - 1:
                with wrapped.no_sync():
                    loss.backward()
            else:
                loss.backward()
        opt.step()
    return wrapped.module


def close_models(got, ref, what, rtol=1e-10, atol=1e-12):
    for (n, p), q in zip(got.named_parameters(), ref.parameters()):
        t_close(p.detach(), q.detach(), f"{what}: {n}", rtol=rtol, atol=atol)


if "ddp" in PARTS:
    from torch.nn.parallel import DistributedDataParallel as DDP
    ref = reference(mlp(), 3)
    got = ddp_run(DDP(mlp(), bucket_cap_mb=0.0005), 3)       # several buckets
    close_models(got, ref, "DDP small buckets")
    ref = reference(mlp(unused=True), 2)
    got = ddp_run(DDP(mlp(unused=True), find_unused_parameters=True), 2)
    close_models(got, ref, "DDP find_unused_parameters")
    ref = reference(mlp(), 2, micro=2)
    got = ddp_run(DDP(mlp()), 2, micro=2)
    close_models(got, ref, "DDP no_sync")
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    w = DDP(mlp())
    w.register_comm_hook(None, default_hooks.allreduce_hook)
    close_models(ddp_run(w, 2), reference(mlp(), 2), "DDP allreduce_hook")
    w = DDP(mlp())
    w.register_comm_hook(None, default_hooks.fp16_compress_hook)
    close_models(ddp_run(w, 2), reference(mlp(), 2), "DDP fp16_compress_hook",
                 rtol=2e-3, atol=2e-4)
    w = DDP(mlp())
    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                        start_powerSGD_iter=2)
    w.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    got = ddp_run(w, 4)
    same_on_every_rank(flat_params(got), "DDP PowerSGD: replicas agree")
    check(bool(torch.isfinite(flat_params(got)).all()), "DDP PowerSGD: finite")

if "fsdp" in PARTS:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.device_mesh import init_device_mesh
    ref = reference(mlp(), 3)
    m = mlp()
    for layer in m:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for s in range(3):
        opt.zero_grad()
        x, y = data(s)
        (nn.functional.mse_loss(m(mine(x)), mine(y))).backward()
        opt.step()
    for (n, p), q in zip(m.named_parameters(), ref.parameters()):
        t_close(p.full_tensor().detach(), q.detach(), f"FSDP2: {n}", rtol=1e-10, atol=1e-12)
    if N % 2 == 0 and N >= 4:
        mesh = init_device_mesh("cpu", (2, N // 2), mesh_dim_names=("replicate", "shard"))
        m = mlp()
        for layer in m:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(m, mesh=mesh)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for s in range(3):
            opt.zero_grad()
            x, y = data(s)
            (nn.functional.mse_loss(m(mine(x)), mine(y))).backward()
            opt.step()
        for (n, p), q in zip(m.named_parameters(), ref.parameters()):
            t_close(p.full_tensor().detach(), q.detach(), f"HSDP 2x{N // 2}: {n}",
                    rtol=1e-10, atol=1e-12)

if "dtensor" in PARTS:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (N,))
    full = torch.arange(4.0 * N * 3).view(4 * N, 3)
    dt = distribute_tensor(full, mesh, [Shard(0)])
    t_equal(dt.to_local(), full.chunk(N)[R], "DTensor Shard(0) local part")
    t_equal(dt.redistribute(mesh, [Replicate()]).to_local(), full, "DTensor redistribute")
    t_equal(dt.full_tensor(), full, "DTensor full_tensor")
    col = distribute_tensor(full, mesh, [Shard(1)]) if 3 % N == 0 or N <= 3 else None
    t_equal((dt * 2).sum().full_tensor(), full.sum() * 2, "DTensor sum (a partial reduced)")

if "tp" in PARTS:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    torch.manual_seed(3)
    ref = nn.Sequential(nn.Linear(D, 4 * N), nn.ReLU(), nn.Linear(4 * N, D))
    tp = copy.deepcopy(ref)
    mesh = init_device_mesh("cpu", (N,))
    parallelize_module(tp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x, _ = data(0)
    t_close(tp(x), ref(x), "TP forward", rtol=1e-10, atol=1e-12)
    tp(x).sum().backward()
    ref(x).sum().backward()
    t_close(tp[0].weight.grad.full_tensor(), ref[0].weight.grad, "TP colwise grad",
            rtol=1e-10, atol=1e-12)
    t_close(tp[2].weight.grad.full_tensor(), ref[2].weight.grad, "TP rowwise grad",
            rtol=1e-10, atol=1e-12)

if "pipe" in PARTS:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    for sched_cls in (ScheduleGPipe, Schedule1F1B):
        torch.manual_seed(5)
        full = nn.Sequential(*[nn.Linear(D, D) for _ in range(N)])
        x, _ = data(1, rows=8)
        y = torch.randn(8, D, generator=torch.Generator().manual_seed(9))
        ref_loss = nn.functional.mse_loss(full(x), y)
        ref_loss.backward()
        stage_mod = copy.deepcopy(full[R])
        stage_mod.zero_grad()
        stage = PipelineStage(stage_mod, R, N, torch.device("cpu"))
        sched = sched_cls(stage, n_microbatches=4, loss_fn=nn.functional.mse_loss)
        losses = []
        if R == 0:
            sched.step(x)
        elif R == N - 1:
            sched.step(target=y, losses=losses)
        else:
            sched.step()
        if R == N - 1:
            t_close(torch.stack(losses).mean(), ref_loss.detach(),
                    f"{sched_cls.__name__} loss", rtol=1e-10, atol=1e-12)
        # the microbatch losses are summed into gradients as a mean over microbatches
        t_close(stage_mod.weight.grad, full[R].weight.grad, f"{sched_cls.__name__} grad",
                rtol=1e-9, atol=1e-11)

if "dcp" in PARTS:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
    from torch.distributed.fsdp import fully_shard
    m = mlp(seed=1)
    fully_shard(m)
    path = os.path.join(os.environ["HVDTEST_DIR"], "ckpt")
    dcp.save(get_model_state_dict(m), checkpoint_id=path)
    m2 = mlp(seed=2)
    fully_shard(m2)
    sd = get_model_state_dict(m2)
    dcp.load(sd, checkpoint_id=path)
    set_model_state_dict(m2, sd)
    for (n, p), q in zip(m2.named_parameters(), m.parameters()):
        t_equal(p.full_tensor(), q.full_tensor(), f"DCP round trip: {n}")

finish()
dist.destroy_process_group()
