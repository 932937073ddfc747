"""Rank program of tests/test_p2p.py, run by
test_an_op_meeting_a_closed_connection_fails_the_job_naming_the_peer."""
import os
import time
import numpy as np
import horovodlike as hvd
from p2p_victim import struck


def main():
    hvd.init()
    R = hvd.rank()
    if R == 2:
        hvd.send(np.array([os.getpid()]), 1, name="pid")
        print("ready", flush=True)
        time.sleep(300)                     # the test kills this rank here
    elif R == 0:
        print("ready", flush=True)
        time.sleep(300)                     # the test stops this rank here
    else:
        pid = int(hvd.recv(2, name="pid")[0])
        print("ready", flush=True)
        # Rank 2's connections close while nothing waits on them, and rank 0, stopped,
        # relays no verdict: the ops below are the first to meet the closed connection.
        struck(pid, time.monotonic() + 60)
        for name in ("recv", "send"):
            t = time.monotonic()
            try:
                if name == "recv":
                    hvd.recv(2, name="never")
                else:
                    hvd.send(np.zeros(4), 2, name="never")
                print(f"{name} no error", flush=True)
            except Exception as e:
                print(f"{name} failed after {time.monotonic() - t:.1f}s: {type(e).__name__}: "
                      f"{e}", flush=True)
        print("done", flush=True)


if __name__ == "__main__":
    main()
