"""Rank program of tests/test_torch_zero3.py: delayed parameter initialisation (a model
built on the meta device, its units filled one at a time, each rank keeping its shard).

    torch_zero3_delayed.py bitwise   parameters equal, bit for bit, a full build under
                                     the same seed: with reset_parameters(), and with an
                                     init function (a full build, then model.apply(init))
    torch_zero3_delayed.py capped    under an address-space cap that the full model's
                                     parameters exceed, the model is built and trained
"""
import resource
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import horovodlike.torch as hvd

CAP = 0.9     # the address space allowed past start-up, in full parameters' bytes


class Net(nn.Module):
    def __init__(self, width=16, depth=3):
        super().__init__()
        self.inp = nn.Linear(5, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.LayerNorm(width))
                                    for _ in range(depth))
        self.out = nn.Linear(width, 3)

    def forward(self, x):
        x = self.inp(x)
        for b in self.blocks:
            x = x + torch.tanh(b(x))
        return self.out(x)


def init_fn(m):
    if isinstance(m, nn.Linear):
        nn.init.normal_(m.weight, std=0.02)
        nn.init.uniform_(m.bias, -0.1, 0.1)
    elif isinstance(m, nn.LayerNorm):
        nn.init.normal_(m.weight, 1.0, 0.1)
        nn.init.zeros_(m.bias)


def sharded(init=None, **kw):
    with torch.device("meta"):
        model = Net(**kw)
    opt = hvd.ShardedDistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                          model.named_parameters(), stage=3, model=model,
                                          units=list(model.blocks), init=init)
    return model, opt


def bitwise():
    for label, init in (("reset_parameters", None), ("init function", init_fn)):
        torch.manual_seed(7)
        full = Net()
        if init is not None:
            full.apply(init)
        torch.manual_seed(7)
        model, opt = sharded(init)
        assert all(not p.is_meta for p in model.parameters()), label
        with opt.full_parameters():
            for (n, a), b in zip(model.named_parameters(), full.parameters()):
                assert torch.equal(a, b), f"{label}: {n} differs from the full build"
        x = torch.randn(4, 5)
        F.mse_loss(model(x), torch.zeros(4, 3)).backward()     # and it trains
        opt.step()
        print(f"BITWISE {label}", flush=True)


def vm_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize")


def capped():
    width, depth = 1024, 48
    full_bytes = depth * (width * width + 3 * width) * 4
    # One-time costs first, uncapped: a small model through the same path registers the
    # partition group's process set and starts the threads (whose stacks and malloc
    # arenas take address space), so the cap measures the big model alone.
    model, opt = sharded(width=8, depth=1)
    F.mse_loss(model(torch.randn(8, 5)), torch.zeros(8, 3)).backward()
    opt.step()
    del model, opt
    base = vm_bytes()
    cap = base + int(full_bytes * CAP)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    torch.manual_seed(0)
    model, opt = sharded(width=width, depth=depth)
    x = torch.randn(8, 5)
    for _ in range(2):
        opt.zero_grad()
        F.mse_loss(model(x), torch.zeros(8, 3)).backward()
        opt.step()
    with open("/proc/self/status") as f:
        peak = [int(x.split()[1]) * 1024 for x in f if x.startswith("VmPeak:")][0]
    try:
        torch.empty(full_bytes // 4)          # the cap bites: the full model could not exist
        raise AssertionError("a full model's worth of memory was allocated under the cap")
    except (RuntimeError, MemoryError):
        pass
    print(f"CAPPED trained at a peak of {(peak - base) / full_bytes:.2f}x the full "
          f"parameters' bytes, under a cap of {CAP}x, holding {opt.parameter_bytes()} "
          f"parameter bytes of {full_bytes} between steps", flush=True)


def main():
    hvd.init(process_sets="dynamic")
    torch.set_num_threads(1)
    {"bitwise": bitwise, "capped": capped}[sys.argv[1]]()
    print("OK", flush=True)


if __name__ == "__main__":
    main()
