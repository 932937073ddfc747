"""Rank program of tests/test_negotiate_nodes.py, run by
test_stall_warning_names_exactly_the_missing_rank."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def main():
    hvd.init()
    r, late = hvd.rank(), [int(q) for q in os.environ["LATE"].split(",")]
    for i in range(3):
        hvd.allreduce(np.ones(4), op=hvd.Sum, name="late")
    if r in late:
        # The stall under test: away for 3 check periods while its node mate has posted
        # "late" in the segment (the warning comes after one or two).
        time.sleep(3 * float(os.environ["HOROVOD_STALL_CHECK_TIME_SECONDS"]))
    check_equal(hvd.allreduce(np.ones(4), op=hvd.Sum, name="late"), np.full(4, float(hvd.size())), "late")
    finish()


if __name__ == "__main__":
    main()
