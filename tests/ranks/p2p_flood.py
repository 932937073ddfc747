"""Rank program of tests/test_p2p.py, run by test_unmatched_eager_sends_are_held_within_the_budget.

Rank 1 posts 40,000 sends of 32 KiB (each small enough to go eager: 1.25 GiB in all)
that rank 0 has not asked for, then a "marker". Messages are announced in posting
order, so once rank 0 has the marker it has read all that rank 1 posted before it:
without a bound, the 1.25 GiB of payloads; with the pair's budget
(HOROVODLIKE_P2P_UNEXPECTED_BYTES, 4 MiB) that much of them and announcements of the
rest. Rank 0's peak resident memory may not grow by more than 512 MiB meanwhile. Then it
receives all 40,000, a window of recvs at a time, and checks every one's contents.
"""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)

N, ELEMS, WINDOW = 40000, 8192, 2000      # 40,000 x 32 KiB (float32)


def peak_rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024


def main():
    hvd.init()
    # message i is base[i:i + ELEMS], a view: the sender holds 160 KiB, not 1.25 GiB
    base = np.arange(N + ELEMS, dtype=np.float32)
    if hvd.rank() == 1:
        hs = [hvd.send_async(base[i:i + ELEMS], 0, name="m") for i in range(N)]
        hvd.send(np.array([1]), 0, name="marker")
        for h in hs:
            hvd.synchronize(h)
    else:
        before = peak_rss_mib()
        hvd.recv(1, name="marker")
        grew = peak_rss_mib() - before
        check(grew <= 512, "the receiver holds unasked eager messages within the budget",
              f"its peak resident memory grew by {grew:.0f} MiB for {N * 32 // 1024} MiB "
              f"sent unasked")
        print(f"HVDTEST-GREW {grew:.0f} MiB", flush=True)
        for start in range(0, N, WINDOW):
            hs = [hvd.recv_async(1, name="m") for _ in range(WINDOW)]
            for k, h in enumerate(hs):
                i = start + k
                check_equal(hvd.synchronize(h), base[i:i + ELEMS], f"message {i}")
    finish()


if __name__ == "__main__":
    main()
