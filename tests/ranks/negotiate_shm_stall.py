"""Rank program of tests/test_negotiate_shm.py, run by
test_stall_warning_names_a_rank_missing_from_the_segment."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def main():
    hvd.init()
    r = hvd.rank()
    for i in range(3):
        hvd.allreduce(np.ones(4), op=hvd.Sum, name="late")
    if r == 1:
        # The stall under test: away for 5 check periods while the others have posted
        # "late" in the segment (the warning comes after one or two).
        time.sleep(5 * float(os.environ["HOROVOD_STALL_CHECK_TIME_SECONDS"]))
    check_equal(hvd.allreduce(np.ones(4), op=hvd.Sum, name="late"), np.full(4, float(hvd.size())), "late")
    finish()


if __name__ == "__main__":
    main()
