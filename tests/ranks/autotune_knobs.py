"""Rank program of tests/test_autotune.py, run by test_tune_op_changes_every_ranks_knobs:
the tune op (HVDL_TUNE) refuses values the knobs cannot take, and a good one changes
the allreduce algorithm on every rank between the same two ops (read back from each
rank's timeline)."""
import numpy as np

import horovodlike as hvd
from horovodlike.common import autotune, ops


def tune(**knobs):
    v = np.full(autotune.VALUES, autotune.KEEP)
    for k, x in knobs.items():
        v[getattr(autotune, k.upper())] = x
    return ops.tune(v)


def refused(what, **knobs):
    try:
        tune(**knobs)
    except ValueError as e:
        print(f"REFUSED {what}: {e}", flush=True)
        return
    raise AssertionError(f"a tune op with {what} was accepted")


def main():
    hvd.init()
    if hvd.rank() == 0:               # the values are checked where they come from
        refused("NaN", fusion=float("nan"))
        refused("shm forced", allreduce=1)
        refused("2 TiB fusion", fusion=2.0 ** 41)
    try:                              # the shape, on every rank
        ops.tune(np.zeros(3))
        raise AssertionError("a tune op of 3 values was accepted")
    except ValueError as e:
        print(f"REFUSED short: {e}", flush=True)
    x = np.ones(1 << 16, np.float32)
    assert (hvd.allreduce(x, name="before", op=hvd.Sum) == hvd.size()).all()
    tune(allreduce=autotune.ALGORITHMS["ring"], fusion=4 << 20, cycle=2.5)
    assert (hvd.allreduce(x, name="ring", op=hvd.Sum) == hvd.size()).all()
    tune(allreduce=autotune.ALGORITHMS["auto"])
    assert (hvd.allreduce(x, name="auto", op=hvd.Sum) == hvd.size()).all()
    print("OK", flush=True)


if __name__ == "__main__":
    main()
