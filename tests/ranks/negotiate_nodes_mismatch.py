"""Rank program of tests/test_negotiate_nodes.py, run by
test_a_changed_request_is_named_at_once_and_the_engine_goes_on."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def main():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    odd = int(os.environ["ODD"])                          # the rank whose request changes
    for i in range(3):                                   # cached, agreed in the segments
        check_equal(hvd.allreduce(np.ones(4), op=hvd.Sum, name="a"), np.full(4, float(n)), f"warm {i}")
    for late in (True, False):
        # The changed request reaches rank 0 after its node mates posted theirs (late)
        # or before (the others wait a second).
        if (r == odd) == late:
            time.sleep(1)
        shape = 5 if r == odd else 4
        check_raises(hvd.TensorMismatchError,
                     lambda: hvd.allreduce(np.ones(shape), op=hvd.Sum, name="a"),
                     "allreduce.a", "shape", "has [4]", f"rank {odd} has [5]",
                     what=f"changed on rank {odd}, late {late}")
        for i in range(3):                               # and the engine goes on
            check_equal(hvd.allreduce(np.ones(4), op=hvd.Sum, name="a"), np.full(4, float(n)),
                        f"after {late}.{i}")
    finish()


if __name__ == "__main__":
    main()
