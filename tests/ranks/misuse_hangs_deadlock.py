"""Rank program of tests/test_misuse_hangs.py, run by
test_ops_that_never_match_end_the_job_within_seconds: argv is the case, "cached" or
"fresh", the deadline in seconds, and the texts the error must hold."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def main():
    CASE, WARM = sys.argv[1], sys.argv[2] == "cached"
    DEADLINE, EXPECT = float(sys.argv[3]), sys.argv[4:]
    ps = hvd.ProcessSet([0, 1])
    hvd.init(process_sets=[ps])
    R = hvd.rank()
    x = np.ones(3, dtype=np.float32)
    if WARM:
        # the names are cached: on one node they are then agreed in the shared segment
        for i in range(3):
            for n in ("a", "b"):
                hvd.allreduce(x, name=n)

    def cycle():
        if CASE == "names":
            hvd.allreduce(x, name="a" if R == 0 else "b")
        elif CASE == "kinds":
            (hvd.allreduce if R == 0 else hvd.allgather)(x, name="k")
        elif CASE == "skipped":
            if R == 0:
                hvd.allreduce(x, name="a")
            hvd.allreduce(x, name="b")
        elif CASE == "set":
            if R < 2:
                hvd.allreduce(x, name="a" if R == 0 else "b", process_set=ps)
            else:
                hvd.barrier()

    check_deadlock_verdict(cycle, DEADLINE, EXPECT)
    finish_alone()


if __name__ == "__main__":
    main()
