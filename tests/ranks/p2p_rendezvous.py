"""Rank program of tests/test_p2p.py, run by test_unmatched_large_sends_are_not_held_by_the_receiver.

Rank 0 posts 24 sends of 8 MiB that rank 1 has not asked for, then one small eager
"marker". The connection keeps order, so once rank 1 has the marker it has read all
that rank 0 put before it: eagerly, the 192 MiB of payloads; with rendezvous, 24
announcements. Rank 1's peak resident memory may not grow by more than a few messages
meanwhile. Then it receives all 24 (in reverse order) and checks them.
"""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)

N, ELEMS = 24, 1 << 20                   # 24 x 8 MiB


def peak_rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024


def main():
    hvd.init()
    if hvd.rank() == 0:
        hs = [hvd.send_async(np.full(ELEMS, i, np.float64), 1, name=f"big.{i}") for i in range(N)]
        hvd.send(np.array([1]), 1, name="marker")
        for h in hs:
            hvd.synchronize(h)
    else:
        before = peak_rss_mib()
        hvd.recv(0, name="marker")
        grew = peak_rss_mib() - before
        check(grew < 64, "the receiver does not hold unasked large messages",
              f"its peak resident memory grew by {grew:.0f} MiB for {N * 8} MiB sent unasked")
        for i in reversed(range(N)):
            check_equal(hvd.recv(0, name=f"big.{i}"), np.full(ELEMS, i, np.float64), f"big.{i}")
    finish()


if __name__ == "__main__":
    main()
