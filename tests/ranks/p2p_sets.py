"""Rank program of tests/test_p2p.py, run by test_process_set_membership_and_fake_nodes."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def main():
    hvd.init(process_sets="dynamic")
    R = hvd.rank()
    ends = hvd.add_process_set([0, 2])          # rank 1 (on node a with rank 0) is not in it
    x = np.arange(100_000, dtype=np.float32)
    if R == 0:
        hvd.send(x, 2, name="cross-node", process_set=ends)
        hvd.send(x + 1, 1, name="same-node")
        check_raises(ValueError, lambda: hvd.send(x, 1, name="outside", process_set=ends),
                     "destination rank 1 is not a member")
    elif R == 1:
        check_equal(hvd.recv(0, name="same-node"), x + 1, "same node")
        check_raises(ValueError, lambda: hvd.recv(0, name="outside", process_set=ends),
                     "is not a member")
    else:
        check_equal(hvd.recv(0, name="cross-node", process_set=ends), x, "across nodes, in a set")
    finish()


if __name__ == "__main__":
    main()
