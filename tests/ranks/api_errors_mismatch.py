"""Rank program of tests/test_api_errors.py, run by
test_ranks_that_disagree_get_tensor_mismatch_error."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)
import re


def main():
    hvd.init()
    R, P = hvd.rank(), hvd.size()
    LAST = P - 1          # only the last rank disagrees
    odd = R == LAST
    f32 = np.float32


    def expect_mismatch(label, fn, name, field, good=None, bad=None):
        """TensorMismatchError on every rank; the message names the tensor, the field, the
        disagreeing rank with its value, and some other rank with the agreed value (which
        rank the engine takes as the reference is its own business)."""
        needles = [name, field, f"rank {LAST}"] + ([f"rank {LAST} has {bad}"] if bad else [])
        e = check_raises(hvd.TensorMismatchError, fn, *needles, what=label)
        check(isinstance(e, RuntimeError), label, "TensorMismatchError is a RuntimeError")
        if e is not None and good is not None:
            others = [int(m) for m in re.findall(r"rank (\d+) has " + re.escape(good), str(e))]
            check(any(r != LAST for r in others), label,
                  f"message {str(e)!r} names no agreeing rank with {good}")


    cases = [
        ("shape", lambda: hvd.allreduce(np.ones(5 if odd else 4, f32), name="m.shape"),
         ["allreduce.m.shape", "shape", "[4]", "[5]"]),
        ("shape 2-d", lambda: hvd.allreduce(np.ones((2, 3) if odd else (3, 2), f32),
                                            name="m.shape2"),
         ["allreduce.m.shape2", "shape", "[3, 2]", "[2, 3]"]),
        ("dtype", lambda: hvd.allreduce(np.ones(4, np.float64 if odd else f32), name="m.dtype"),
         ["allreduce.m.dtype", "dtype", "float32", "float64"]),
        ("op", lambda: hvd.allreduce(np.ones(4, f32), op=hvd.Max if odd else hvd.Sum,
                                     name="m.op"),
         ["allreduce.m.op", "op", "Sum", "Max"]),
        ("root", lambda: hvd.broadcast(np.ones(4, f32), 1 if odd else 0, name="m.root"),
         ["broadcast.m.root", "root", "0", "1"]),
        ("scale", lambda: hvd.allreduce(np.ones(4, f32), op=hvd.Sum, name="m.scale",
                                        prescale_factor=2.0 if odd else 1.0),
         ["allreduce.m.scale", "prescale"]),
        ("allgather trailing dims", lambda: hvd.allgather(np.ones((2, 4 if odd else 3), f32),
                                                          name="m.gather"),
         ["allgather.m.gather", "shape"]),
        ("allgather dtype", lambda: hvd.allgather(np.ones((R, 3), np.int32 if odd else np.int64),
                                                  name="m.gdtype"),
         ["allgather.m.gdtype", "dtype", "int64", "int32"]),
        ("async shape", lambda: hvd.synchronize(hvd.allreduce_async(
            np.ones(3 if odd else 2, f32), name="m.async")),
         ["allreduce.m.async", "shape", "[2]", "[3]"]),
    ]
    for label, fn, needles in cases:
        expect_mismatch(f"mismatch on {label}", fn, *needles)
        # the engine goes on: the same name now agrees, then unrelated ops
        check_equal(hvd.allreduce(np.full(3, R, f32), op=hvd.Sum, name="after.mismatch"),
                    np.full(3, sum(range(P)), f32), f"allreduce after mismatch on {label}")
    # a mismatched op inside a batch of good in-flight ops fails alone
    good = [hvd.allreduce_async(np.full(8, R + i, f32), op=hvd.Sum, name=f"batch.{i}")
            for i in range(10)]
    bad = hvd.allreduce_async(np.ones(7 if odd else 6, f32), op=hvd.Sum, name="batch.bad")
    expect_mismatch("mismatch inside a batch", lambda: hvd.synchronize(bad),
                    "allreduce.batch.bad", "shape", "[6]", "[7]")
    for i, h in enumerate(good):
        check_equal(hvd.synchronize(h), np.full(8, sum(range(P)) + P * i, f32),
                    f"good op {i} of the batch with a mismatch")
    finish()


if __name__ == "__main__":
    main()
