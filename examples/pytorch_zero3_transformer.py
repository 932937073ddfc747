"""Train a small transformer language model on synthetic tokens with its parameters
sharded (ShardedDistributedOptimizer, stage 3): each rank holds 1/shard_size of the
parameters between steps, and gathers one encoder layer at a time while it computes.
Between steps every rank prints what it holds:

    rank R: resident parameter bytes X of Y (Z%)

    horovodlikerun -np 4 python examples/pytorch_zero3_transformer.py
    horovodlikerun -np 4 python examples/pytorch_zero3_transformer.py --shard-size 2

--shard-size defaults to the whole job (ZeRO-3); the ranks of a node (hvd.local_size())
shard inside each node and replicate across nodes (MiCS).
"""
import argparse

import torch
import torch.nn.functional as F

import horovodlike.torch as hvd
from pytorch_sharded_transformer import TransformerLM, model_args


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shard-size", type=int, default=None)
    model_args(ap, steps=3)
    args = ap.parse_args()

    hvd.init(process_sets="dynamic")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = TransformerLM(args.vocab, args.d_model, args.layers, seq=args.seq)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    full = sum(p.numel() * p.element_size() for p in model.parameters())
    opt = hvd.ShardedDistributedOptimizer(
        torch.optim.AdamW(model.parameters(), lr=1e-4), model.named_parameters(), stage=3,
        shard_size=args.shard_size, model=model, units=list(model.encoder.layers))
    g = torch.Generator().manual_seed(hvd.rank())
    for step in range(args.steps):
        tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g)
        opt.zero_grad()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        held = opt.parameter_bytes()
        print(f"rank {hvd.rank()}: step {step} loss {loss.item():.3f}: resident parameter "
              f"bytes {held} of {full} ({100 * held / full:.0f}%)", flush=True)


if __name__ == "__main__":
    main()
