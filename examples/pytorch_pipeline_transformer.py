"""Train a small GPT language model cut into pipeline stages, with data parallelism
across pipelines.

    horovodlikerun -np 4 python examples/pytorch_pipeline_transformer.py             # pp 2 × dp 2
    horovodlikerun -np 4 python examples/pytorch_pipeline_transformer.py --pp 4      # pp 4
    horovodlikerun -np 4 python examples/pytorch_pipeline_transformer.py --schedule gpipe

The model is a list of layers; each rank builds only its own stage's (LayerSpec). The
token embedding and the LM head share one weight across the first and the last stage
(tied=). Each stage's replicas average gradients over the Topology's dp_set with
hvd.DistributedOptimizer (--sharded: ShardedDistributedOptimizer, stage 2). Every rank
prints its stage, its parameter bytes and its share of each batch spent waiting for a
neighbour; rank 0 prints the loss and the bubble the cost model predicts.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

import horovodlike.torch as hvd
from horovodlike.common.topology import Topology
from horovodlike.common.pipeline_schedule import bubble_fraction
from horovodlike.torch.parallel import GPTBlock
from horovodlike.torch.pipeline import LayerSpec, PipelineModule, Schedule1F1B, ScheduleGPipe


class Embed(nn.Module):
    """Token and position embedding; `weight` is tied to the LM head's."""

    def __init__(self, vocab, d_model, seq):
        super().__init__()
        self.weight = nn.Parameter(0.02 * torch.randn(vocab, d_model))
        self.pos = nn.Parameter(0.02 * torch.randn(seq, d_model))

    def forward(self, tokens):
        return F.embedding(tokens, self.weight) + self.pos[:tokens.shape[1]]


class Head(nn.Module):
    def __init__(self, vocab, d_model):
        super().__init__()
        self.weight = nn.Parameter(0.02 * torch.randn(vocab, d_model))

    def forward(self, h):
        return h @ self.weight.t()


def batch(step, replica, args):
    """Counting sequences with a random start: token i+1 = token i + 1 (mod vocab)."""
    g = torch.Generator().manual_seed(1000 * step + replica)
    start = torch.randint(0, args.vocab, (args.batch, 1), generator=g)
    seq = (start + torch.arange(args.seq + 1)) % args.vocab
    return seq[:, :-1], seq[:, 1:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--schedule", choices=["1f1b", "gpipe"], default="1f1b")
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--sharded", action="store_true")
    args = ap.parse_args()

    hvd.init()
    torch.manual_seed(0)          # every rank builds the same weights for its layers
    torch.set_num_threads(1)
    topo = Topology(pp=args.pp)
    layers = ([LayerSpec(Embed, args.vocab, args.d_model, args.seq)]
              + [LayerSpec(GPTBlock, args.d_model, args.heads) for _ in range(args.layers)]
              + [LayerSpec(nn.LayerNorm, args.d_model), LayerSpec(Head, args.vocab, args.d_model)])
    pipe = PipelineModule(
        layers, topology=topo, partition="parameters",
        loss_fn=lambda logits, y: F.cross_entropy(logits.reshape(-1, args.vocab), y.reshape(-1)),
        tied={"weight": (0, len(layers) - 1)})
    # the replicas of a stage start from the same weights
    hvd.broadcast_parameters(pipe.state_dict(), root_rank=topo.global_rank(topo.stage(), 0),
                             process_set=topo.dp_set)
    inner = torch.optim.AdamW(pipe.parameters(), lr=args.lr)
    if args.sharded:
        opt = hvd.ShardedDistributedOptimizer(inner, pipe.named_parameters(), stage=2,
                                              process_set=topo.dp_set)
    else:
        opt = hvd.DistributedOptimizer(inner, pipe.named_parameters(), process_set=topo.dp_set)
    cls = Schedule1F1B if args.schedule == "1f1b" else ScheduleGPipe
    sched = cls(pipe, microbatches=args.microbatches, optimizer=opt)

    wait = wall = 0.0
    for step in range(args.steps):
        x, y = batch(step, topo.replica(), args)
        opt.zero_grad()
        out = sched.train_batch(x if topo.first_stage else None,
                                y if topo.last_stage else None)
        opt.step()
        if step > 0:              # the first batch pays the connections' set-up
            wait, wall = wait + sched.last_wait_s, wall + sched.last_wall_s
        loss = hvd.allreduce(out.reduce_mean(), name="loss")   # over the replicas too
        if hvd.rank() == 0 and (step % 5 == 0 or step == args.steps - 1):
            print(f"step {step:3d}  loss {loss.item():.4f}", flush=True)

    mine = torch.tensor([float(hvd.rank()), float(topo.stage()),
                         float(pipe.stage_parameter_bytes()), wait / wall if wall else 0.0],
                        dtype=torch.float64)
    rows = hvd.allgather(mine.reshape(1, -1), name="report")
    if hvd.rank() == 0:
        for r, s, nbytes, waited in rows.tolist():
            print(f"rank {int(r)}  stage {int(s)}  parameter bytes {int(nbytes):>9,}  "
                  f"waiting for neighbours {100 * waited:5.1f}% of each batch", flush=True)
        print(f"cost model bubble (p-1)/(m+p-1) = "
              f"{100 * bubble_fraction(args.pp, args.microbatches):.1f}% "
              f"(p={args.pp}, m={args.microbatches}; the last stage's idle tail after its "
              f"last backward is not a wait and is not counted above)", flush=True)


if __name__ == "__main__":
    main()
