"""FSDP2 (fully_shard) on horovodlike's engine, HSDP on a 2-D mesh when the job has 4k ranks.

    horovodlikerun -np 4 python examples/pytorch_fsdp2_backend.py
"""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import horovodlike.torch.distributed  # noqa: F401  (registers backend="horovodlike")


def main(steps=10):
    dist.init_process_group("horovodlike")
    rank, size = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (2, size // 2), mesh_dim_names=("replicate", "shard")) \
        if size % 2 == 0 and size >= 4 else init_device_mesh("cpu", (size,))
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.GELU()) for _ in range(4)],
                          nn.Linear(64, 1))
    for block in model:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    for step in range(steps):
        x = torch.randn(32, 64, generator=g)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.5f} mesh {tuple(mesh.shape)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
