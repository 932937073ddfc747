"""Rank program of tests/test_negotiate_shm.py, run by
test_a_rank_lost_while_others_wait_in_the_segment_is_named."""
import os, signal, sys, time
import numpy as np
import horovodlike as hvd


def main():
    hvd.init()
    r = hvd.rank()
    for i in range(5):
        hvd.allreduce(np.ones(4), name="k")
    print(f"ready {r}", flush=True)
    if r == 2:
        time.sleep(1)                        # the others post "k" and wait in the segment
        os.kill(os.getpid(), getattr(signal, os.environ["HOW"]))
    t = time.monotonic()
    try:
        hvd.allreduce(np.ones(4), name="k")
        print(f"finished {r}", flush=True)
    except hvd.HorovodInternalError as e:
        print(f"lost {r} after {time.monotonic() - t:.1f}s: {e}", flush=True)


if __name__ == "__main__":
    main()
