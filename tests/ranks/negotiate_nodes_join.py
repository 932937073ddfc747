"""Rank program of tests/test_negotiate_nodes.py, run by
test_a_join_takes_every_word_over_until_it_ends."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)
from negotiate_join_common import join_phase


def main():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    early = int(os.environ["EARLY"])
    for i in range(10):
        check_equal(hvd.allreduce(np.full(7, 1.0, np.float32), op=hvd.Sum, name="g"),
                    np.full(7, float(n), np.float32), f"before {i}")
    # the early rank leaves: "g" must go through rank 0 (zeros for it) until all join
    join_phase(r, n, early, rounds_after=10)
    finish()


if __name__ == "__main__":
    main()
