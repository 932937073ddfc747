"""Rank program of tests/test_negotiate_shm.py, run by
test_process_sets_and_join_beside_the_segment."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)
from negotiate_join_common import join_phase


def main():
    hvd.init(process_sets="dynamic")
    r, n = hvd.rank(), hvd.size()
    pair = hvd.add_process_set([0, 1])        # through rank 0, between the segment's entries
    for i in range(20):
        hg = hvd.allreduce_async(np.full(7, r + i, np.float32), op=hvd.Sum, name="g")
        if r in (0, 1):
            check_equal(hvd.allreduce(np.full(3, r * i, np.float32), op=hvd.Sum, name="p",
                                      process_set=pair), np.full(3, float(i), np.float32), f"pair {i}")
        hh = hvd.allreduce_async(np.full(2, 1.0), op=hvd.Sum, name="h")
        check_equal(hvd.synchronize(hg), np.full(7, float(sum(q + i for q in range(n))), np.float32), f"g {i}")
        check_equal(hvd.synchronize(hh), np.full(2, float(n)), f"h {i}")
    # a join: rank 1 leaves early; the cached "g" must now go through rank 0 (zeros for 1)
    join_phase(r, n, early=1, rounds_after=5)
    finish()


if __name__ == "__main__":
    main()
