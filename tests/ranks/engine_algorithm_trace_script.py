"""Rank program of tests/test_engine_algorithm_trace.py, run by
test_traced_algorithm_is_the_one_chosen."""
import os
import sys
import numpy as np
import horovodlike as hvd


def main():
    sets = [hvd.ProcessSet([0, 1]), hvd.ProcessSet([2, 3])]
    hvd.init(process_sets=sets)
    r = hvd.rank()
    local = sets[0] if r < 2 else sets[1]
    hvd.allreduce(np.ones(1 << 16, np.float32), name="ar")
    hvd.allgather(np.ones((r + 1, 3), np.float32), name="ag")
    hvd.broadcast(np.ones(10), root_rank=0, name="bc")
    hvd.alltoall(np.ones((4, 2), np.float32), name="a2a")
    hvd.reducescatter(np.ones((8, 2), np.float32), name="rs")
    hvd.allreduce(np.ones(100, np.float32), name="local", process_set=local)
    hvd.barrier()
    print("OK", flush=True)


if __name__ == "__main__":
    main()
