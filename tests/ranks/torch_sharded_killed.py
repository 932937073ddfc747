"""Rank program of tests/test_torch_sharded.py, run by
test_a_killed_rank_fails_the_job_naming_it."""
from _torch_common import *  # noqa: F401,F403 (torch, thvd, hvd, np, the check helpers)
import signal
import torch.nn as nn


def main():
    thvd.init(process_sets="dynamic")
    model = nn.Linear(64, 64)
    opt = thvd.ShardedDistributedOptimizer(torch.optim.Adam(model.parameters()),
                                           shard_size=int(os.environ["HVDTEST_SHARDS"]))
    try:
        for step in range(1000):
            if step == 3 and thvd.rank() == thvd.size() - 1:
                os.kill(os.getpid(), signal.SIGKILL)
            opt.zero_grad()
            model(torch.randn(8, 64)).sum().backward()
            opt.step()
    except thvd.HorovodInternalError as e:
        print(f"rank {thvd.rank()} saw: {e}", flush=True)
        time.sleep(30)                # the launcher must end the job without waiting
        sys.exit(5)


if __name__ == "__main__":
    main()
