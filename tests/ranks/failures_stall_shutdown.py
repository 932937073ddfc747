"""Rank program of tests/test_failures.py, run by test_stall_shutdown_fails_every_rank."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def main():
    hvd.init()
    name = "only.rank0" if hvd.rank() == 0 else "only.others"
    t = time.monotonic()
    e = check_raises(hvd.HorovodInternalError, lambda: hvd.allreduce(np.ones(2), name=name),
                     "stalled", what="stalled op")
    check(time.monotonic() - t < 20, "stall shutdown came in time")
    check_raises(hvd.HorovodInternalError, lambda: hvd.allreduce(np.ones(2), name="next"),
                 "stalled", what="later op after a stall shutdown")
    finish_alone()


if __name__ == "__main__":
    main()
