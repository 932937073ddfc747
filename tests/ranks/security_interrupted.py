"""Rank program of tests/test_security.py, run by
test_an_interrupted_wait_keeps_the_buffers_and_the_handle."""
import os
import signal
import time
import numpy as np
import horovodlike as hvd


def main():
    hvd.init()
    r = hvd.rank()
    x = np.full(1 << 20, float(r + 1), np.float32)
    interrupted = os.path.join(os.environ["HVDTEST_DIR"], "rank0-interrupted")
    if r == 1:
        # rank 0's wait gets interrupted meanwhile: join only once it has been
        deadline = time.monotonic() + 60
        while not os.path.exists(interrupted) and time.monotonic() < deadline:
            time.sleep(0.005)
    class Alarm(Exception):
        pass
    def on_alarm(*_):
        raise Alarm()
    signal.signal(signal.SIGALRM, on_alarm)
    h = hvd.allreduce_async(x, op=hvd.Sum, name="big")
    del x                                  # only the pending op keeps it alive now
    if r == 0:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        try:
            hvd.synchronize(h)
            print("NOT-INTERRUPTED", flush=True)
        except Alarm:
            print("INTERRUPTED", flush=True)
        open(interrupted, "w").close()
        # Fresh arrays that would reuse the freed memory if the op had let go of it.
        junk = [np.full(1 << 20, 99.0, np.float32) for _ in range(8)]
    out = hvd.synchronize(h)               # the same handle, waited on again
    print("RESULT", r, float(out.min()), float(out.max()), flush=True)
    after = hvd.allreduce(np.ones(4, np.float32), op=hvd.Sum, name="after")
    print("AFTER", r, float(after[0]), flush=True)


if __name__ == "__main__":
    main()
