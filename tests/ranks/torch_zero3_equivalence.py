"""Rank program of tests/test_torch_zero3.py, run by test_stage3_matches_one_process:
ShardedDistributedOptimizer(stage=3) against one process training the global batch,
in float64, for Adam and AdamW, backward_passes_per_step 1 and 2, shard_size the world
(ZeRO-3) and 2 (MiCS, at 4 ranks), units by module and by block; and the resident
parameter bytes between steps and during forward. The model ties two layers' weights."""
import torch
import torch.nn as nn
import torch.nn.functional as F

import horovodlike.torch as hvd

STEPS = 3


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Linear(5, 16)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.Tanh())
                                    for _ in range(3))
        self.tie_a = nn.Linear(16, 16)             # tied weights: one unit, used twice
        self.tie_b = nn.Linear(16, 16, bias=False)
        self.tie_b.weight = self.tie_a.weight
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        x = torch.tanh(self.emb(x))
        x = x + torch.tanh(self.tie_a(x))
        for b in self.blocks:
            x = x + b(x)
        return self.head(x + self.tie_b(x))


def fresh():
    torch.manual_seed(0)
    return Net().double()


def batch(step, r, passes_i):
    g = torch.Generator().manual_seed(1000 * step + 10 * r + passes_i)
    return torch.randn(4, 5, generator=g, dtype=torch.float64), \
        torch.randn(4, 3, generator=g, dtype=torch.float64)


def reference(make, n, passes):
    model = fresh()
    opt = make(model.parameters())
    for step in range(STEPS):
        opt.zero_grad()
        for i in range(passes):
            xs, ys = zip(*(batch(step, r, i) for r in range(n)))
            (F.mse_loss(model(torch.cat(xs)), torch.cat(ys)) / passes).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def main():
    hvd.init(process_sets="dynamic")
    R, n = hvd.rank(), hvd.size()
    makers = {"Adam": lambda ps: torch.optim.Adam(ps, lr=0.05),
              "AdamW": lambda ps: torch.optim.AdamW(ps, lr=0.05, weight_decay=0.1)}
    failures = []
    for label, make in makers.items():
        for passes in (1, 2):
            ref = reference(make, n, passes)
            for S, by in [(S, by) for S in sorted({n, 2}) for by in ("modules", "blocks")]:
                what = f"{label} passes={passes} S={S} units={by}"
                model = fresh()
                units = list(model.blocks) if by == "blocks" else None
                opt = hvd.ShardedDistributedOptimizer(
                    make(model.parameters()), model.named_parameters(), stage=3,
                    shard_size=S, backward_passes_per_step=passes, model=model,
                    units=units)
                total = sum(p.numel() * 8 for p in fresh().parameters())
                tied = [b for b in opt._buckets if len(b.modules) > 1]
                if len(tied) != 1 or {m for m in tied[0].modules} != {model.tie_a, model.tie_b}:
                    failures.append(f"{what}: the tied layers are not one unit")
                largest = sorted(b.padded * 8 for b in opt._buckets)[-2:]
                peak = [0]

                def watch(*_):
                    peak[0] = max(peak[0], opt.parameter_bytes())
                hooks = [m.register_forward_hook(watch) for m in model.modules()]
                for step in range(STEPS):
                    opt.zero_grad()
                    for i in range(passes):
                        x, y = batch(step, R, i)
                        (F.mse_loss(model(x), y) / passes).backward()
                    opt.step()
                    held = opt.parameter_bytes()
                    if held > total / S + 8 * 64:
                        failures.append(f"{what}: {held} parameter bytes held between "
                                        f"steps, more than 1/{S} of {total}")
                for h in hooks:
                    h.remove()
                if peak[0] > total / S + sum(largest) + 8 * 64 or peak[0] <= total / S:
                    failures.append(f"{what}: {peak[0]} parameter bytes held during "
                                    f"forward, against 1/{S} of {total} + the two largest "
                                    f"units {largest}")
                with opt.full_parameters():
                    got = [p.detach().clone() for p in model.parameters()]
                for k, (a, b) in enumerate(zip(got, ref)):
                    err = (a - b).abs().max().item()
                    if err > 1e-10:
                        failures.append(f"{what}: parameter {k} differs by {err:.3g}")
    for f in failures:
        print("FAIL", f, flush=True)
    print("DONE", len(failures), flush=True)
    if not failures:
        print("OK", flush=True)


if __name__ == "__main__":
    main()
