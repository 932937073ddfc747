"""DDP on horovodlike's engine: torch's own API, backend="horovodlike".

    torchrun --nproc-per-node 2 examples/pytorch_ddp_backend.py
    horovodlikerun -np 2 python examples/pytorch_ddp_backend.py
"""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import horovodlike.torch.distributed  # noqa: F401  (registers backend="horovodlike")


def main(steps=20):
    dist.init_process_group("horovodlike")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(rank)
    w = torch.randn(32, 1, generator=torch.Generator().manual_seed(42))
    for step in range(steps):
        x = torch.randn(64, 32, generator=g)
        loss = nn.functional.mse_loss(model(x), x @ w)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and step % 5 == 0:
            print(f"step {step} loss {loss.item():.4f} ({size} ranks)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
