"""Rank program of tests/test_negotiate_shm.py, run by
test_stall_shutdown_names_a_rank_missing_from_the_segment."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def main():
    hvd.init()
    for i in range(3):
        hvd.allreduce(np.ones(2), name="x")
    if hvd.rank() == 2:
        wait_for("stalled.0", "stalled.1")   # never submits: the stall shutdown ends the job
        sys.exit(0)
    check_raises(hvd.HorovodInternalError, lambda: hvd.allreduce(np.ones(2), name="x"),
                 "stalled", "allreduce.x", "ranks [2]", what="stalled op")
    arrive(f"stalled.{hvd.rank()}")
    finish_alone()


if __name__ == "__main__":
    main()
