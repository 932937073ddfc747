"""Rank program of tests/test_torch_zero3.py, run by test_ranks_that_run_other_units_fail:
rank 1's forward skips a unit (skip) or runs two units the other way round (order), so
the ranks gather different units: every rank fails naming the unit, never hangs.

    torch_zero3_misuse.py skip|order
"""
import sys

import torch
import torch.nn as nn

import horovodlike.torch as hvd

CASE = sys.argv[1]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))

    def forward(self, x):
        order = [0, 1, 2]
        if hvd.rank() == 1:
            order = [0, 2] if CASE == "skip" else [0, 2, 1]
        for i in order:
            x = self.blocks[i](x)
        return x


def main():
    hvd.init(process_sets="dynamic")
    torch.manual_seed(0)
    model = Net()
    opt = hvd.ShardedDistributedOptimizer(torch.optim.Adam(model.parameters()),
                                          model.named_parameters(), stage=3, model=model)
    try:
        model(torch.randn(2, 8)).sum().backward()
        opt.step()
    except hvd.HorovodInternalError as e:
        print(f"FAILED-AS-EXPECTED {e}", flush=True)
        return
    print("NOT FAILED", flush=True)


if __name__ == "__main__":
    main()
