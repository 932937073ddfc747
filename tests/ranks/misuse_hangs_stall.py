"""Rank program of tests/test_misuse_hangs.py, run by
test_stall_shutdown_time_ends_a_stall_as_in_horovod."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def main():
    hvd.init()
    shutdown = float(os.environ["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"])
    t0 = time.monotonic()
    if hvd.rank() == 1:
        # The stall under test: busy elsewhere (a stall, not a provable deadlock) for longer
        # than the stall shutdown and rank 0's 2.5 x bound below
        time.sleep(8 / 3 * shutdown)
    try:
        hvd.allreduce(np.ones(2), name="late")
        fail("allreduce with a stalled rank", "returned")
    except hvd.HorovodInternalError as e:
        took = time.monotonic() - t0
        check("ranks [1] never submitted it (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS)" in str(e),
              "the stall shutdown message", str(e))
        check(hvd.rank() == 1 or shutdown <= took < 2.5 * shutdown,
              "rank 0 fails at the shutdown time", f"{took:.1f} s")
    finish_alone()


if __name__ == "__main__":
    main()
