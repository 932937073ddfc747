"""Rank program of tests/test_collectives.py, run by
test_every_rank_exits_cleanly_right_after_its_last_collective."""
import sys
import numpy as np
import horovodlike as hvd


def main():
    n, explicit = int(sys.argv[1]), sys.argv[2] == "shutdown"
    hvd.init()
    out = hvd.allreduce(np.full(n, hvd.rank(), dtype=np.int64), op=hvd.Sum, name="last")
    print("sum=%d" % out[0], flush=True)
    assert out.tolist() == [sum(range(hvd.size()))] * n, out
    if explicit:
        hvd.shutdown()
    print("HVDTEST-OK", flush=True)


if __name__ == "__main__":
    main()
