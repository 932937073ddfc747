"""Rank program of tests/test_collectives.py, run by
test_harness_kills_a_hung_job_on_timeout."""
import os
import time
import numpy as np
import horovodlike as hvd


def main():
    hvd.init()
    print("pid=%d" % os.getpid(), flush=True)
    if hvd.rank() == 0:
        hvd.allreduce(np.ones(3), name="never")     # the other ranks never submit it
    else:
        time.sleep(600)


if __name__ == "__main__":
    main()
