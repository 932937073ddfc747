"""Rank program of tests/test_misuse_hangs.py, run by
test_a_thread_computing_while_another_waits_is_not_a_deadlock: argv is how many seconds
rank 0's second thread computes.

Rank 0's main thread waits in allreduce 'x' while its second thread, which has used the
engine already, computes before it submits allreduce 'y'; rank 1 waits in 'y' first.
Both ranks wait on an op the other has not submitted, but rank 0 is not blocked: its
computing thread will submit 'y'. A detector that counts rank 0 as blocked because one
of its threads waits ends this correct program with "deadlock" after about 4 s."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def compute(seconds):
    """Real work for `seconds` (matrix products, which release the GIL)."""
    a = np.random.default_rng(0).random((128, 128))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        a = np.tanh(a @ a)


def main():
    SECONDS = float(sys.argv[1])
    hvd.init()
    x = np.ones(3, dtype=np.float32)
    if hvd.rank() == 0:
        def worker():
            try:
                check_equal(hvd.allreduce(x, name="warm", op=hvd.Sum), 2 * x, "warm-up")
                compute(SECONDS)
                check_equal(hvd.allreduce(x, name="y", op=hvd.Sum), 2 * x, "the late 'y'")
            except Exception as e:  # noqa: BLE001 - reported by the main thread's finish()
                fail("the computing thread", repr(e))
        t = threading.Thread(target=worker)
        t.start()
        t0 = time.monotonic()
        check_equal(hvd.allreduce(x, name="x", op=hvd.Sum), 2 * x, "the waiting thread's 'x'")
        took = time.monotonic() - t0
        t.join()
        print(f"'x' waited {took:.1f} s", flush=True)
        check(took >= SECONDS, "'x' waited for the computing thread", f"{took:.1f} s")
    else:
        check_equal(hvd.allreduce(x, name="warm", op=hvd.Sum), 2 * x, "warm-up")
        check_equal(hvd.allreduce(x, name="y", op=hvd.Sum), 2 * x, "'y', waited for")
        check_equal(hvd.allreduce(x, name="x", op=hvd.Sum), 2 * x, "'x'")
    finish()


if __name__ == "__main__":
    main()
