"""Rank program of tests/test_timeline.py, run by test_events_nest_and_are_ordered."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def main():
    hvd.init()
    for step in range(5):
        hs = [hvd.allreduce_async(np.ones(5000 + i, np.float32), name=f"w{i}") for i in range(8)]
        for h in hs:
            hvd.synchronize(h)
        hvd.allgather(np.ones((hvd.rank() + 1, 2)), name="ag")
        hvd.broadcast(np.ones(7), root_rank=hvd.size() - 1, name="bc")
    check_raises(hvd.TensorMismatchError,
                 lambda: hvd.allreduce(np.ones(3 + hvd.rank()), name="bad"), what="mismatch")
    finish()


if __name__ == "__main__":
    main()
