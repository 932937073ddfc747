"""Rank program of tests/test_timeline.py, run by
test_start_stop_timeline_restarts_with_a_new_path."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def main():
    hvd.init()
    a, b = sys.argv[1], sys.argv[2]
    hvd.start_timeline(a)
    hvd.allreduce(np.ones(4), name="first")
    hvd.stop_timeline()
    hvd.allreduce(np.ones(4), name="untraced")
    hvd.start_timeline(b, mark_cycles=True)
    hvd.allreduce(np.ones(4), name="second")
    hvd.stop_timeline()
    finish()


if __name__ == "__main__":
    main()
