"""Rank program of tests/test_failures.py, run by
test_killed_rank_fails_survivors_promptly_naming_it."""
import os
import sys
import time
import numpy as np
import horovodlike as hvd


def main():
    hvd.init()
    r = hvd.rank()
    print(f"ready {r} {os.getpid()}", flush=True)
    x = np.ones(8 << 20, np.float32)          # 32 MiB: each allreduce takes a while
    t = None
    try:
        for i in range(100000):
            h = hvd.allreduce_async(x, name=f"big.{i % 2}")
            if i == 3:
                print(f"midway {r}", flush=True)
            t = time.monotonic()
            hvd.synchronize(h)
    except hvd.HorovodInternalError as e:
        print(f"lost {r} after {time.monotonic() - t:.2f}s: {e}", flush=True)
        try:
            hvd.allreduce(np.ones(3), name="after")
            print(f"later-op-succeeded {r}", flush=True)
        except hvd.HorovodInternalError as e2:
            print(f"later-op-failed {r}: {e2}", flush=True)
        sys.exit(0)


if __name__ == "__main__":
    main()
