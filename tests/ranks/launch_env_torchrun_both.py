"""Rank program of tests/test_launch_env.py, run by
test_torchrun_with_torch_distributed_alongside under real torchrun: launch_env_two_ranks,
then torch.distributed's own init and an all_reduce beside it.

argv[1]: a folder; torchrun interleaves the ranks' output unprefixed, so each rank writes
its stdout to out.<RANK> there."""
import os
import sys

import launch_env_two_ranks


def main():
    sys.stdout = open(os.path.join(sys.argv[1], "out." + os.environ["RANK"]), "w",
                      buffering=1)
    launch_env_two_ranks.main()
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    print(f"TORCH {dist.get_rank()} {t.item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
