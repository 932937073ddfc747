"""Train a small transformer language model on synthetic tokens twice, with
hvd.DistributedOptimizer and with hvd.ShardedDistributedOptimizer, and print each rank's
memory for both: optimizer state, gradients kept between steps, and step time.

    horovodlikerun -np 4 python examples/pytorch_sharded_transformer.py
    horovodlikerun -np 4 python examples/pytorch_sharded_transformer.py --shard-size 2 --stage 1

--shard-size defaults to the whole job (ZeRO); pass the ranks per node
(hvd.local_size()) to shard inside nodes and replicate across them.
"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import horovodlike.torch as hvd


class TransformerLM(nn.Module):
    """Token embedding, pre-norm encoder layers, and an output head tied to the
    embedding: about 23M parameters with the defaults."""

    def __init__(self, vocab=8192, d_model=512, layers=6, heads=8, ff=2048, seq=64):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(seq, d_model))
        layer = nn.TransformerEncoderLayer(d_model, heads, ff, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.head.weight = self.embed.weight
        self.seq = seq

    def forward(self, tokens):
        n = tokens.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(n)
        h = self.encoder(self.embed(tokens) + self.pos[:n], mask=mask, is_causal=True)
        return self.head(self.norm(h))


def model_args(ap, steps):
    """The model's and the run's flags (examples/pytorch_zero3_transformer.py too)."""
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=8192)


def tensor_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def state_bytes(opt):
    if isinstance(opt, hvd.ShardedDistributedOptimizer):
        return opt.state_bytes()
    return tensor_bytes(v for s in opt.state.values() for v in s.values())


def train(model, opt, steps, batch, seq, vocab):
    g = torch.Generator().manual_seed(hvd.rank())
    times = []
    for step in range(steps):
        tokens = torch.randint(0, vocab, (batch, seq + 1), generator=g)
        t = time.perf_counter()
        opt.zero_grad()
        logits = model(tokens[:, :-1])
        F.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1)).backward()
        opt.step()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shard-size", type=int, default=None)
    ap.add_argument("--stage", type=int, default=2, choices=[1, 2])
    model_args(ap, steps=4)
    args = ap.parse_args()

    hvd.init(process_sets="dynamic")
    torch.set_num_threads(1)
    rows = []
    for label in ("DistributedOptimizer", "ShardedDistributedOptimizer"):
        torch.manual_seed(0)
        model = TransformerLM(args.vocab, args.d_model, args.layers, seq=args.seq)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        if label == "DistributedOptimizer":
            opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        else:
            opt = hvd.ShardedDistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                                  stage=args.stage, shard_size=args.shard_size)
        step = train(model, opt, args.steps, args.batch, args.seq, args.vocab)
        if isinstance(opt, hvd.ShardedDistributedOptimizer):
            grads = opt.gradient_bytes()
        else:
            grads = tensor_bytes(p.grad for p in model.parameters())
        rows.append((label, state_bytes(opt), grads, step))
        if hvd.rank() == 0 and label == "DistributedOptimizer":
            n = sum(p.numel() for p in model.parameters())
            print(f"model: {n / 1e6:.1f}M parameters, {hvd.size()} ranks", flush=True)

    mb = 1 << 20
    what = f"stage {args.stage}, shard_size {args.shard_size or hvd.size()}"
    for label, state, grads, step in rows:
        tag = label if label == "DistributedOptimizer" else f"{label} ({what})"
        print(f"rank {hvd.rank()}: {tag}: optimizer state {state / mb:.1f} MiB, gradients "
              f"kept {grads / mb:.1f} MiB, step {step * 1e3:.0f} ms", flush=True)


if __name__ == "__main__":
    main()
