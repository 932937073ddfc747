"""Rank program of tests/test_p2p.py, run by
test_a_message_sent_before_the_senders_shutdown_is_delivered.

The sender (T_SENDER) sends a small message, one larger than the socket buffers and an
empty one, then calls hvd.shutdown() (which ends the job for every rank, as in Horovod)
before the receiver has posted a single recv. The receiver first waits for that shutdown
to reach it (a barrier the sender never joins fails as shut down), then receives the
three messages in another order than they were sent: each must be delivered whole. A
recv of a name the sender never sent must fail at once, naming the sender. With
T_LINGER=1 the sender stays alive (its process, not its engine) until the receiver is
done, so the failure cannot come from the process exiting.
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
        # above the eager threshold: announced only, and failed by the shutdown
        hvd.send_async(np.ones(ANNOUNCED), receiver, name="announced")
        hvd.shutdown()
        if os.environ.get("T_LINGER") == "1":
            wait_for("received")
        finish_alone()
        return
    # The sender's shutdown ends this rank's engine too: wait until it has.
    check_raises(Exception, lambda: hvd.barrier(), "shut down", what="barrier after shutdown")
    check_equal(hvd.recv(sender, name="big"), BIG, "big")
    buf = np.zeros(3, dtype=np.int16)
    hvd.recv_(buf, sender, name="small")
    check_equal(buf, np.array([1, 2, 3], dtype=np.int16), "small")
    check_equal(hvd.recv(sender, name="empty"), np.zeros((0, 4)), "empty")
    for name in ("never", "announced"):
        t = time.monotonic()
        check_raises(Exception, lambda: hvd.recv(sender, name=name), f"rank {sender}", name,
                     what=f"recv of a message never sent ({name})")
        took = time.monotonic() - t
        check(took < 5, "the recv of a message never sent fails promptly", f"took {took:.1f} s")
    arrive("received")
    hvd.shutdown()
    finish_alone()


if __name__ == "__main__":
    main()
