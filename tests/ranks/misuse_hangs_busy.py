"""Rank program of tests/test_misuse_hangs.py, run by
test_a_rank_busy_elsewhere_is_not_a_deadlock."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def main():
    hvd.init()
    x = np.ones(3, dtype=np.float32)
    if hvd.rank() == 1:
        time.sleep(4.5)          # busy elsewhere, longer than a deadlock takes to be found
    check_equal(hvd.allreduce(x, name="late", op=hvd.Sum), 2 * x, "the late rank's allreduce")
    finish()


if __name__ == "__main__":
    main()
