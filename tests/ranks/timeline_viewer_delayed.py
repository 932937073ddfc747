"""Rank program of tests/test_timeline_viewer.py: argv is the steps, the slow rank and its
delay in seconds; that rank is late before every allreduce (the straggler the viewer
must name), then every rank joins one allgather."""
import sys
import time

import numpy as np
import horovodlike as hvd


def main():
    steps, slow_rank, sleep_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    hvd.init()
    x = np.ones(4096, np.float32)
    for step in range(steps):
        for name in ("grad.a", "grad.b"):
            if hvd.rank() == slow_rank:
                time.sleep(sleep_s)          # the straggler: late before every allreduce
            hvd.allreduce(x, name=name)
    hvd.allgather(np.ones((hvd.rank() + 1, 2)), name="rows")
    print("HVDTEST-OK", flush=True)


if __name__ == "__main__":
    main()
