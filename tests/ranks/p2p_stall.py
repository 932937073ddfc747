"""Rank program of tests/test_p2p.py, run by
test_stall_inspector_names_the_waiting_recv_and_what_the_peer_sent."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def main():
    hvd.init()
    R = hvd.rank()
    if R == 0:
        hvd.send(np.array([0]), 1, name="b")
        hvd.send(np.array([1]), 1, name="a")
        # The stall under test: the recv of "b" must wait past the stall check before
        # "b" is sent; 3 check periods cover the periodic check.
        time.sleep(3 * float(os.environ["HOROVOD_STALL_CHECK_TIME_SECONDS"]))
        hvd.send(np.array([2]), 1, name="b")
    else:
        # the first "b" makes the second a repeated call: the one that stalls is one
        # engine call (hvdl_run)
        b = np.zeros(1, np.int64)
        check_equal(hvd.recv_(b, 0, name="b"), np.array([0]), "the first b")
        check_equal(hvd.recv_(b, 0, name="b"), np.array([2]), "b")
        check_equal(hvd.recv(0, name="a"), np.array([1]), "a")
    finish()


if __name__ == "__main__":
    main()
