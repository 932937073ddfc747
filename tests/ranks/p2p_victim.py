"""Rank program of tests/test_p2p.py, run by
test_a_dead_or_stopped_peer_fails_the_waiting_op_naming_it,
test_stall_inspector_names_a_send_the_peer_does_not_read."""
import os
import sys
import time
import numpy as np
import horovodlike as hvd


def main():
    hvd.init()
    R = hvd.rank()
    how = os.environ["T_WAITS_IN"]
    # ring-*: a 128 MiB message through a small ring (4096 pieces), under way when the
    # test strikes: rank 1 sending it (ring-recv) or receiving it (ring-send)
    huge = np.ones(16 << 20) if how.startswith("ring") else None
    if R == 1:
        hvd.send(np.arange(4.0), 0, name="first")
        if how == "mailbox-recv":       # once rank 0 has answered, "second" is past the switch
            hvd.recv(0, name="ack")
            hvd.send(np.arange(4.0), 0, name="second")
        if how == "ring-recv":
            hvd.send_async(huge, 0, name="huge")
        elif how == "ring-send":
            hvd.recv_async_(huge, 0, name="huge")
        print("ready", flush=True)
        time.sleep(300)                     # the test kills or stops this rank here
    else:
        hvd.recv(1, name="first")
        if how == "mailbox-recv":       # its mailbox answer went out before the ack
            hvd.send(np.arange(2.0), 1, name="ack")
            hvd.recv(1, name="second")
        print("ready", flush=True)
        t = time.monotonic()
        try:
            if how == "send":                  # more than the socket buffers hold
                hvd.send(np.zeros(64 << 17), 1, name="never")
            elif how == "ring-recv":
                hvd.recv_(huge, 1, name="huge")
            elif how == "ring-send":
                hvd.send(huge, 1, name="huge")
            else:
                hvd.recv(1, name="never")
            print("no error", flush=True)
        except Exception as e:
            print(f"failed after {time.monotonic() - t:.1f}s: {type(e).__name__}: {e}", flush=True)


if __name__ == "__main__":
    main()
