"""Rank program of tests/test_p2p.py, run by test_a_send_past_the_announcements_cap_fails_at_once.

With HOROVODLIKE_P2P_ANNOUNCED_BYTES=100000 (the test's), rank 1 posts 300 sends of
128 KiB (rendezvous: each costs rank 0 its announcement until the recv) that rank 0 has
not asked for. Those that fit the cap (about 250) wait for their recvs; the rest fail at
once, each naming the knob, and posting never blocks. Then rank 0 receives those that
fit and checks them, and a send after them works: the engine keeps serving.
"""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)

N, ELEMS = 300, 1 << 15                   # 300 x 128 KiB (float32)


def main():
    hvd.init()
    base = np.arange(N + ELEMS, dtype=np.float32)
    if hvd.rank() == 1:
        hs = [hvd.send_async(base[i:i + ELEMS], 0, name=f"big.{i:03d}") for i in range(N)]
        failed = []
        # a send past the cap is done at once (failed); one that fits waits for its recv
        for i in reversed(range(N)):
            if not hvd.poll(hs[i]):
                break
            try:
                hvd.synchronize(hs[i])
                fail(f"send {i} completed before its recv was posted")
            except ValueError as e:
                failed.append((i, str(e)))
        fit = N - len(failed)
        check(0 < fit < N, "some sends fit the cap and some do not", f"{fit} of {N} fit")
        for i, why in failed:
            check("HOROVODLIKE_P2P_ANNOUNCED_BYTES" in why and "to rank 0" in why,
                  f"send {i} past the cap names the knob and the receiver", why)
        hvd.send(np.array([fit]), 0, name="fit")
        for h in hs[:fit]:
            hvd.synchronize(h)
        hvd.send(base[:ELEMS], 0, name="after")
    else:
        fit = int(hvd.recv(1, name="fit")[0])
        for i in range(fit):
            check_equal(hvd.recv(1, name=f"big.{i:03d}"), base[i:i + ELEMS], f"big.{i}")
        check_equal(hvd.recv(1, name="after"), base[:ELEMS], "a send after the refused ones")
    finish()


if __name__ == "__main__":
    main()
