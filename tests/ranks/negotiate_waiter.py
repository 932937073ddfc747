"""Rank program of tests/test_negotiate_shm.py and tests/test_negotiate_nodes.py: rank 2
is lost (signal HOW) while the others wait for "k"; each survivor prints how long it
took to learn of it."""
import os
import signal
import sys
import time
import numpy as np
import horovodlike as hvd


def main():
    hvd.init()
    r = hvd.rank()
    for i in range(5):
        hvd.allreduce(np.ones(4), name="k")
    print(f"ready {r}", flush=True)
    if r == 2:
        time.sleep(1)                        # the others post "k" and wait
        os.kill(os.getpid(), getattr(signal, os.environ["HOW"]))
    t = time.monotonic()
    try:
        hvd.allreduce(np.ones(4), name="k")
        print(f"finished {r}", flush=True)
    except hvd.HorovodInternalError as e:
        print(f"lost {r} after {time.monotonic() - t:.1f}s: {e}", flush=True)


if __name__ == "__main__":
    main()
