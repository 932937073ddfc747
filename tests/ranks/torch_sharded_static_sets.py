"""Rank program of tests/test_torch_sharded.py, run by
test_static_process_sets_are_completed_by_the_optimizer."""
from _torch_common import *  # noqa: F401,F403 (torch, thvd, hvd, np, the check helpers)
import torch.nn as nn


def main():
    parts = [thvd.ProcessSet([0, 1]), thvd.ProcessSet([2, 3])]
    thvd.init(process_sets=parts)                 # partition groups only, no replica groups
    R, P = thvd.rank(), thvd.size()
    model = nn.Linear(3, 2)
    # the replica groups are missing: the optimizer registers them itself (every rank
    # builds it), without dynamic process sets
    for S in (2, 4, 1):                           # groups; one group; no partition
        model = nn.Linear(3, 2)                   # each optimizer hooks a model of its own
        opt = thvd.ShardedDistributedOptimizer(torch.optim.Adam(model.parameters()), shard_size=S)
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
    from horovodlike.torch.sharded import partition_ranks
    check(partition_ranks(range(4), 2) == ([[0, 1], [2, 3]], [[0, 2], [1, 3]]),
          "partition_ranks", str(partition_ranks(range(4), 2)))
    finish()


if __name__ == "__main__":
    main()
