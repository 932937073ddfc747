"""Rank program of tests/test_negotiate_shm.py and tests/test_negotiate_nodes.py: the
last rank never submits "x" (it leaves once every other rank has the error), and the
stall shutdown must end the job naming it."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def main():
    hvd.init()
    r, last = hvd.rank(), hvd.size() - 1
    for i in range(3):
        hvd.allreduce(np.ones(2), name="x")
    if r == last:
        wait_for(*[f"stalled.{q}" for q in range(last)])   # never submits: the stall
        sys.exit(0)                                         # shutdown ends the job
    check_raises(hvd.HorovodInternalError, lambda: hvd.allreduce(np.ones(2), name="x"),
                 "stalled", "allreduce.x", f"ranks [{last}]", what="stalled op")
    arrive(f"stalled.{r}")
    finish_alone()


if __name__ == "__main__":
    main()
