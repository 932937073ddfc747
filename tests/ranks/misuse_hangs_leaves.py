"""Rank program of tests/test_misuse_hangs.py, run by
test_a_rank_that_leaves_is_named_with_the_ops_it_never_submitted."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def main():
    HOW, EXPECT = sys.argv[1], sys.argv[2:]
    hvd.init()
    R = hvd.rank()
    h = hvd.allreduce_async(np.ones(3), name="x") if R == 0 else None
    hvd.allreduce(np.ones(3), name="sync")      # rank 0's "x" is announced before this
    if R == 1:
        if HOW == "shutdown":
            hvd.shutdown()
            finish_alone()
            sys.exit(0)
        os._exit(0)
    check_raises(hvd.HorovodInternalError, lambda: hvd.synchronize(h), *EXPECT,
                 what="the op the leaving rank never submitted")
    finish_alone()


if __name__ == "__main__":
    main()
