"""The join phase the segment and node negotiation tests share: one rank leaves early, the
cached name "g" goes through rank 0 (zeros for the leaver) until everyone has joined,
then the segments carry it again."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def join_phase(r, n, early, rounds_after):
    if r == early:
        hvd.join()
    else:
        for i in range(5):
            check_equal(hvd.allreduce(np.full(7, 1.0, np.float32), op=hvd.Sum, name="g"),
                        np.full(7, float(n - 1), np.float32), f"joined {i}")
        time.sleep(0.5)
        hvd.join()
    for i in range(rounds_after):             # after the join: the segments again
        check_equal(hvd.allreduce(np.full(7, 1.0, np.float32), op=hvd.Sum, name="g"),
                    np.full(7, float(n), np.float32), f"after join {i}")
