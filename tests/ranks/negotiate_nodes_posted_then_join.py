"""Rank program of tests/test_negotiate_nodes.py, run by
test_a_request_posted_before_a_join_counts_as_submitted."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def main():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    for i in range(5):
        check_equal(hvd.broadcast(np.full(3, float(r)), root_rank=1, name="b"), np.full(3, 1.0), f"before {i}")
    if r == 2:
        # posts "b" in its node's word, then joins without waiting: its request counts
        # as submitted, ahead of its join (as joined, only an allreduce could run)
        h = hvd.broadcast_async(np.full(3, float(r)), root_rank=1, name="b")
        hvd.join()
        check_equal(hvd.synchronize(h), np.full(3, 1.0), "posted then joined")
    else:
        time.sleep(0.5)
        check_equal(hvd.broadcast(np.full(3, float(r)), root_rank=1, name="b"), np.full(3, 1.0), "with 2's")
        hvd.join()
    for i in range(5):
        check_equal(hvd.broadcast(np.full(3, float(r)), root_rank=1, name="b"), np.full(3, 1.0), f"after {i}")
    finish()


if __name__ == "__main__":
    main()
