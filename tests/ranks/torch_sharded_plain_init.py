"""Rank program of tests/test_torch_sharded.py, run by
test_sharded_optimizer_works_after_a_plain_init."""
from _torch_common import *  # noqa: F401,F403 (torch, thvd, hvd, np, the check helpers)
import torch.nn as nn


def main():
    thvd.init()                                   # no process sets asked for
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = thvd.ShardedDistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), shard_size=2)
    model(torch.ones(1, 3) * (thvd.rank() + 1)).sum().backward()
    opt.step()
    w = model.weight.detach().numpy().copy()
    every = thvd.allgather_object(w, name="weights")
    check(all(np.array_equal(every[0], x) for x in every), "every rank's parameters after a step",
          str(every))
    finish()


if __name__ == "__main__":
    main()
