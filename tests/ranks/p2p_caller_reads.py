"""Rank program of tests/test_p2p.py, run by
test_order_holds_across_the_caller_and_the_thread_reading_the_connection.

Between nodes the caller waiting on a send or recv reads its peer's connection itself,
and the p2p thread reads it only while no caller waits (engine/p2p/p2p_poll.c, "The waiting
caller reads"). Both ranks send 48 messages of ONE name to each other at once, small
(eager) and large (rendezvous: HOROVODLIKE_P2P_EAGER_BYTES is 1 KiB here) mixed, each
holding its index, while each receives the other's in four ways in turn, so that the
reads go from the caller to the thread and back at every kind of frame:
  0 recv, waited at once (the caller reads: the message, and the CTS and payloads of
    its own sends under way);
  1 recv_async polled with hvd.poll, never waited (only the thread reads);
  2 a short pause first (the thread takes the message unasked, or holds its
    announcement), then recv_ into a buffer;
  3 two recvs posted, then waited in order (the wait on the first reads the second).
"""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)

SIZES = [1, 3000, 8, 0, 70001, 200, 1 << 18, 257]     # float32 elements
N = 48


def expected(i):
    return np.full(SIZES[i % len(SIZES)], i, np.float32)


def main():
    hvd.init()
    peer = 1 - hvd.rank()
    sends = [hvd.send_async(expected(i), peer, name="m") for i in range(N)]
    got = {}
    i = 0
    while i < N:
        mode = (i // 2) % 4 if hvd.rank() == 0 else (i // 2 + 1) % 4   # the ranks differ
        if mode == 0:
            got[i] = hvd.recv(peer, name="m")
        elif mode == 1:
            h = hvd.recv_async(peer, name="m")
            deadline = time.monotonic() + 60
            while not hvd.poll(h):
                if time.monotonic() > deadline:
                    fail(f"message {i}", "a recv polled, never waited, not delivered in 60 s")
                    finish()
                    return
            got[i] = hvd.synchronize(h)
        elif mode == 2:
            time.sleep(0.02)
            buf = np.empty_like(expected(i))
            hvd.recv_(buf, peer, name="m")
            got[i] = buf
        else:
            hs = [hvd.recv_async(peer, name="m") for _ in range(2)]
            got[i], got[i + 1] = (hvd.synchronize(h) for h in hs)
            i += 1
        i += 1
    for h in sends:
        hvd.synchronize(h)
    for i in range(N):
        check_equal(got[i], expected(i), f"message {i} of m from rank {peer}")
    finish()


if __name__ == "__main__":
    main()
