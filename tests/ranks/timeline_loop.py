"""Rank program of tests/test_timeline.py, run by test_size_cap_and_step_window,
test_traces_parse_while_the_job_runs_and_after_a_kill."""
import sys
import time
import numpy as np
import horovodlike as hvd


def main():
    hvd.init()
    seconds = float(sys.argv[1])
    end = time.monotonic() + seconds
    step = 0
    while time.monotonic() < end:
        hs = [hvd.allreduce_async(np.ones(1000 * (i + 1), np.float32), name=f"g{i}") for i in range(6)]
        for h in hs:
            hvd.synchronize(h)
        hvd.allgather(np.ones((hvd.rank() + 1, 3)), name="ag")
        hvd.broadcast(np.ones(10), root_rank=0, name="bc")
        step += 1
    print("steps", step, flush=True)


if __name__ == "__main__":
    main()
