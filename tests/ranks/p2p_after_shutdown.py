"""Rank program of tests/test_p2p.py, run by
test_a_message_sent_before_the_senders_shutdown_is_delivered.

The sender (T_SENDER) sends a small message, one larger than the socket buffers, an
empty one and one above the eager threshold (announced only), then calls hvd.shutdown()
(its own: it returns once the receiver has shut down too) before the receiver has posted
a single recv. The receiver first waits for that shutdown to reach it (a barrier the
sender never joins fails at once, naming it), then receives the four messages in another
order than they were sent: each must be delivered whole, the announced one included (the
sender's engine serves until the job ends). A recv of a name the sender never sent must
fail at once, naming the sender. With T_LINGER=1 the sender stays alive after its
shutdown until the receiver is done.
"""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)

BIG = np.arange(3 << 20, dtype=np.float32)              # 12 MiB: many socket buffers
ANNOUNCED = 5 << 20                                      # 40 MiB: past the test's 16 MiB


def main():
    hvd.init()
    sender = int(os.environ["T_SENDER"])
    receiver = 1 - sender
    if hvd.rank() == sender:
        hvd.send(np.array([1, 2, 3], dtype=np.int16), receiver, name="small")
        hvd.send(BIG, receiver, name="big")
        hvd.send(np.zeros((0, 4)), receiver, name="empty")
        # above the eager threshold: announced only, and still delivered after the shutdown
        hvd.send_async(np.ones(ANNOUNCED), receiver, name="announced")
        hvd.shutdown()
        if os.environ.get("T_LINGER") == "1":
            wait_for("received")
        finish_alone()
        return
    # Wait until the sender's shutdown has reached rank 0: a barrier it never joins fails.
    check_raises(Exception, lambda: hvd.barrier(), f"rank {sender} called shutdown()",
                 "shut down", what="barrier after shutdown")
    check_equal(hvd.recv(sender, name="big"), BIG, "big")
    buf = np.zeros(3, dtype=np.int16)
    hvd.recv_(buf, sender, name="small")
    check_equal(buf, np.array([1, 2, 3], dtype=np.int16), "small")
    check_equal(hvd.recv(sender, name="empty"), np.zeros((0, 4)), "empty")
    check_equal(hvd.recv(sender, name="announced"), np.ones(ANNOUNCED), "announced")
    for name in ("never",):
        t = time.monotonic()
        check_raises(Exception, lambda: hvd.recv(sender, name=name), f"rank {sender}", name,
                     what=f"recv of a message never sent ({name})")
        took = time.monotonic() - t
        check(took < 5, "the recv of a message never sent fails promptly", f"took {took:.1f} s")
    t = time.monotonic()
    check_raises(Exception, lambda: hvd.send(np.ones(2), sender, name="late"),
                 f"rank {sender}", "without receiving it", what="a send to a rank that left")
    check(time.monotonic() - t < 5, "a send to a rank that left fails promptly", "")
    arrive("received")
    hvd.shutdown()
    finish_alone()


if __name__ == "__main__":
    main()
