"""Rank program of tests/test_p2p.py, run by
test_timeline_shows_send_and_recv_on_both_ranks."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def main():
    hvd.init()
    R = hvd.rank()
    if R == 0:
        hvd.send(np.zeros(1000, np.float32), 1, name="act")
    else:
        hvd.recv(0, name="act")
    finish()


if __name__ == "__main__":
    main()
