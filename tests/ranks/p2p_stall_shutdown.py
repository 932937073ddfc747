"""Rank program of tests/test_p2p.py, run by
test_stall_shutdown_fails_every_rank_on_a_stalled_recv."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def main():
    hvd.init()
    R = hvd.rank()
    t = time.monotonic()
    # Neither rank ever sends "never": the first recv past the shutdown time fails the
    # job, and both ranks end with that one report.
    check_raises(hvd.HorovodInternalError, lambda: hvd.recv(1 - R, name="never"),
                 "stalled: recv 'p2p.never' on rank", "has not sent it",
                 "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", what="stalled recv")
    check(time.monotonic() - t < 20, "p2p stall shutdown came in time")
    finish_alone()


if __name__ == "__main__":
    main()
