"""Rank program of tests/test_torch_gpu.py, run by
test_cuda_tensors_at_two_ranks_sharing_one_gpu[training]: a CUDA model trained with
DistributedOptimizer equals the CPU run; broadcast_optimizer_state of CUDA state."""
from torch_gpu_common import *  # noqa: F401,F403 (init, same, data, torch, thvd, hvd)
from horovodlike.torch import _staging
import torch.nn as nn


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(8 * 8 * 8, 32), nn.Tanh(), nn.Linear(32, 10))


def train(device, R, **kw):
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


def main():
    R, P, DEV = init()
    # Full fp32 on the GPU (no TF32), so that only summation order differs from the CPU.
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False

    for kw in ({}, {"groups": 2}, {"backward_passes_per_step": 1, "op": thvd.Sum}):
        cpu = train("cpu", R, **kw)
        gpu = train(DEV, R, **kw)
        t_close(gpu, cpu, f"CUDA training equals CPU training {kw}", rtol=1e-4, atol=1e-4)
        same_on_every_rank(gpu, f"CUDA parameters identical on every rank {kw}")
    check(_staging.stats().get("ops", 0) > 0, "the CUDA gradients were staged")

    # broadcast_optimizer_state of CUDA state larger than a piece: the other ranks receive
    # it on their GPU, so every rank stages the same pieces.
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


if __name__ == "__main__":
    main()
