"""Rank program of tests/test_p2p.py, run by test_the_mailbox_keeps_order_and_wraps.

Between two ranks on one node, eager messages and the announcements of large ones go
through the pair's shared-memory mailbox (engine/p2p/p2p_mailbox.c, "The mailbox"), which the
waiting recv's caller polls; the p2p thread takes them only when rung. Rank 1 sends,
rank 0 receives:
  * order: 90 messages of ONE name, small (eager) and large (rendezvous) mixed, posted
    back to back from the first send on (so the first go over the connection, before
    the mailbox is accepted, and the rest through it), each holding its index;
  * wrap and full: 300 eager messages of odd sizes (about 120 times the mailbox), all
    completed by rank 1 before rank 0 posts a recv (the test raises the pair's budget,
    HOROVODLIKE_P2P_UNEXPECTED_BYTES, to 32 MiB, so that all 18 MB stay eager): rank 0
    is not polling, so each is taken by its p2p thread when rung, and rank 1 waits for
    room again and again; the records wrap at every offset;
  * a recv that is never waited on (hvd.poll only): its message must come by the bell.
"""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)

SIZES = [1, 3000, 70001, 8, 0, 200000, 65535, 12, 1 << 20]   # float32 elements
N_ORDER = 90
N_WRAP, WRAP_BASE = 300, 60000                               # bytes: 60000..60299


def main():
    hvd.init()
    if hvd.rank() == 1:
        hs = [hvd.send_async(np.full(SIZES[i % len(SIZES)], i, np.float32), 0, name="m")
              for i in range(N_ORDER)]
        for h in hs:
            hvd.synchronize(h)
        hs = [hvd.send_async(np.full(WRAP_BASE + i, i % 251, np.uint8), 0, name="w")
              for i in range(N_WRAP)]
        for h in hs:
            hvd.synchronize(h)
        arrive("sent-wrap")
        hvd.send(np.arange(5.0), 0, name="bell")
        check_equal(hvd.recv(0, name="back"), np.arange(3.0), "the reply")
    else:
        hs = [hvd.recv_async(1, name="m") for _ in range(N_ORDER // 2)]
        got = [hvd.synchronize(h) for h in hs]
        got += [hvd.recv(1, name="m") for _ in range(N_ORDER - N_ORDER // 2)]
        for i, g in enumerate(got):
            check_equal(g, np.full(SIZES[i % len(SIZES)], i, np.float32), f"message {i} of m")
        wait_for("sent-wrap", timeout=120)
        for i in range(N_WRAP):
            check_equal(hvd.recv(1, name="w"), np.full(WRAP_BASE + i, i % 251, np.uint8),
                        f"message {i} of w")
        h = hvd.recv_async(1, name="bell")
        deadline = time.monotonic() + 60
        while not hvd.poll(h):
            if time.monotonic() > deadline:
                fail("bell", "a recv not waited on was not delivered within 60 s")
                break
        else:
            check_equal(hvd.synchronize(h), np.arange(5.0), "the message that rang")
        hvd.send(np.arange(3.0), 1, name="back")
    finish()


if __name__ == "__main__":
    main()
