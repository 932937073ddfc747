"""Train a small GPT language model with tensor parallelism inside groups of ranks and
data parallelism across them, and check the result against the unsharded model.

    horovodlikerun -np 4 python examples/pytorch_tensor_parallel_gpt.py          # tp 2 × dp 2
    horovodlikerun -np 4 python examples/pytorch_tensor_parallel_gpt.py --tp 4   # tp 4

The model is written as if for one process. hvd.parallel.tensor_parallel splits the
embedding by vocabulary, each block's attention by heads and its MLP by hidden units, and
the LM head by vocabulary (the loss never gathers the full vocabulary). The ranks of one
tensor-parallel group read the same batch; the data-parallel replicas read different
batches and average gradients over the Topology's dp_set.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

import horovodlike.torch as hvd
from horovodlike.torch.parallel import GPT_BLOCK_PLAN, GPTBlock


class GPT(nn.Module):
    def __init__(self, vocab, d_model, layers, heads, seq):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(0.02 * torch.randn(seq, d_model))
        self.blocks = nn.ModuleList(GPTBlock(d_model, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens):
        h = self.embed(tokens) + self.pos[:tokens.shape[1]]
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln_f(h))


PLAN = dict(GPT_BLOCK_PLAN, embed="vocab", head="column")


def batch(step, replica, args):
    """Counting sequences with a random start: token i+1 = token i + 1 (mod vocab)."""
    g = torch.Generator().manual_seed(1000 * step + replica)
    start = torch.randint(0, args.vocab, (args.batch, 1), generator=g)
    seq = (start + torch.arange(args.seq + 1)) % args.vocab
    return seq[:, :-1], seq[:, 1:]


def param_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()

    torch.set_num_threads(1)
    hvd.init()
    topo = hvd.parallel.Topology(tp=args.tp)
    torch.manual_seed(0)                       # the same full model on every rank
    full = GPT(args.vocab, args.d_model, args.layers, args.heads, args.seq)
    full_bytes = param_bytes(full)
    model = hvd.parallel.tensor_parallel(full, PLAN, process_set=topo.tp_set)
    opt = hvd.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=3e-3),
                                   model.named_parameters(), process_set=topo.dp_set)
    if hvd.rank() == 0:
        print(f"{topo!r}: tp={topo.tp} dp={topo.dp}; parameters per rank "
              f"{param_bytes(model) / 2**20:.2f} MiB of {full_bytes / 2**20:.2f} MiB",
              flush=True)
    for step in range(args.steps):
        x, y = batch(step, topo.replica(), args)
        opt.zero_grad()
        loss = hvd.parallel.vocab_parallel_cross_entropy(model(x), y,
                                                         process_set=topo.tp_set)
        loss.backward()
        opt.step()
        mean = hvd.allreduce(loss.detach(), name="loss")       # over every rank
        if hvd.rank() == 0 and (step % 5 == 0 or step == args.steps - 1):
            print(f"step {step:3d}  loss {mean.item():.4f}", flush=True)

    # The full weights, reassembled on rank 0, load into the unsharded model, which then
    # computes the same loss.
    state = hvd.parallel.consolidated_state_dict(model, root_rank=0)
    x, y = batch(args.steps, 0, args)
    with torch.no_grad():
        tp_loss = hvd.parallel.vocab_parallel_cross_entropy(model(x), y,
                                                            process_set=topo.tp_set)
    if hvd.rank() == 0:
        torch.manual_seed(0)
        plain = GPT(args.vocab, args.d_model, args.layers, args.heads, args.seq)
        plain.load_state_dict(state)
        with torch.no_grad():
            ref = F.cross_entropy(plain(x).flatten(0, 1), y.flatten())
        print(f"unsharded model from the consolidated state: loss {ref.item():.6f}, "
              f"tensor-parallel {tp_loss.item():.6f}", flush=True)
        if abs(ref.item() - tp_loss.item()) > 1e-4:
            raise SystemExit("the consolidated model disagrees with the parallel one")
    # One rank's shutdown stops the job's engine, as in Horovod: wait for every group.
    hvd.barrier()
    hvd.shutdown()


if __name__ == "__main__":
    main()
