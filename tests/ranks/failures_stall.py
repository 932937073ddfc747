"""Rank program of tests/test_failures.py, run by
test_stall_warning_names_tensor_and_missing_rank."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def main():
    hvd.init()
    if hvd.rank() == 1:
        # The stall under test: away for 3 check periods (the warning comes after one
        # or two).
        time.sleep(3 * float(os.environ["HOROVOD_STALL_CHECK_TIME_SECONDS"]))
    out = hvd.allreduce(np.ones(4), op=hvd.Sum, name="late")
    check_equal(out, np.full(4, float(hvd.size())), "late allreduce")
    finish()


if __name__ == "__main__":
    main()
