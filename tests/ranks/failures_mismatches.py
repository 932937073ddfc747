"""Rank program of tests/test_failures.py, run by
test_mismatches_name_field_and_ranks_and_engine_goes_on."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def main():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    last = n - 1
    check_raises(hvd.TensorMismatchError,
                 lambda: hvd.allreduce(np.ones((17 + (r == last), 17), np.float32), name="shape"),
                 "allreduce.shape", "shape", "[17, 17]", f"rank {last} has [18, 17]", what="shape")
    check_raises(hvd.TensorMismatchError,
                 lambda: hvd.allreduce(np.ones(4, np.float32 if r else np.float64), name="dt"),
                 "dtype", "float64", "float32", what="dtype")
    check_raises(hvd.TensorMismatchError,
                 lambda: hvd.allreduce(np.ones(4), op=hvd.Sum if r else hvd.Max, name="op"),
                 "reduce op", "Max", "Sum", what="reduce op")
    check_raises(hvd.TensorMismatchError,
                 lambda: hvd.broadcast(np.ones(4), root_rank=min(r, 1), name="root"),
                 "root rank", what="root")
    check_raises(hvd.TensorMismatchError,
                 lambda: hvd.allgather(np.ones((2, 3 + (r == last)), np.float32), name="ag"),
                 "allgather.ag", "shape", what="allgather trailing dims")
    # and the engine goes on
    out = hvd.allreduce(np.ones(5), op=hvd.Sum, name="after")
    check_equal(out, np.full(5, float(n)), "op after mismatches")
    finish()


if __name__ == "__main__":
    main()
