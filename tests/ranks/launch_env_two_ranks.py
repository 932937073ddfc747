"""Rank program of tests/test_launch_env.py, started as plain processes carrying only a
scheduler's variables (and, by launch_env_torchrun_both, under torchrun): an allreduce
and an allgather, then a second init that rendezvouses again. Prints what it saw for
check_two_ranks."""
import numpy as np
import horovodlike as hvd


def main():
    hvd.init()
    s = hvd.allreduce(np.array([hvd.rank() + 1.0]), op=hvd.Sum)
    g = hvd.allgather(np.array([hvd.rank()]))
    print(f"RANK {hvd.rank()} of {hvd.size()} local {hvd.local_rank()}/{hvd.local_size()} "
          f"sum {s[0]} gather {g.tolist()}", flush=True)
    hvd.shutdown()
    hvd.init()                                  # a second init rendezvouses again
    print(f"AGAIN {hvd.rank()} {hvd.allreduce(np.array([1.0]), op=hvd.Sum)[0]}", flush=True)


if __name__ == "__main__":
    main()
