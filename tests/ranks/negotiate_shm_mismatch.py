"""Rank program of tests/test_negotiate_shm.py, run by
test_a_changed_request_is_named_and_the_engine_goes_on."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def main():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    last = n - 1
    for i in range(3):                                   # cached, agreed in the segment
        check_equal(hvd.allreduce(np.ones(4), op=hvd.Sum, name="a"), np.full(4, float(n)), f"warm {i}")
    for late in (last, 0):
        # The changed request reaches rank 0 after the others posted theirs (late = last)
        # or before (late = 0: the last rank changes it at once, the others wait).
        if r != last and late == 0:
            time.sleep(1)
        if r == last and late == last:
            time.sleep(1)
        shape = 5 if r == last else 4
        check_raises(hvd.TensorMismatchError,
                     lambda: hvd.allreduce(np.ones(shape), op=hvd.Sum, name="a"),
                     "allreduce.a", "shape", "rank 0 has [4]", f"rank {last} has [5]",
                     what=f"changed on rank {last}, late {late}")
        for i in range(3):                               # and the engine goes on
            check_equal(hvd.allreduce(np.ones(4), op=hvd.Sum, name="a"), np.full(4, float(n)),
                        f"after {late}.{i}")
    for i in range(3):                                   # every rank changes it: a new entry
        check_equal(hvd.allreduce(np.ones(6), op=hvd.Sum, name="a"), np.full(6, float(n)), f"six {i}")
    check_raises(hvd.TensorMismatchError,                # rank 0 changes the dtype
                 lambda: hvd.allreduce(np.ones(6, np.float32 if r == 0 else np.float64),
                                       op=hvd.Sum, name="a"),
                 "dtype", "float32", "float64", what="dtype on rank 0")
    check_equal(hvd.allreduce(np.ones(6), op=hvd.Sum, name="a"), np.full(6, float(n)), "last")
    finish()


if __name__ == "__main__":
    main()
