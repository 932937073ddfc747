"""Rank program of tests/test_negotiate_shm.py, run by
test_an_op_finished_on_rank_0_before_a_shutdown_finishes_everywhere."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)
import signal
import subprocess


def main():
    hvd.init()
    r = hvd.rank()
    hvd.allreduce(np.ones(1), name="sync")
    if r == 2:
        # Stopped (whole process) just after its barrier request left, until the others
        # have finished the barrier and shut down: the barrier's response and rank 0's
        # goodbye then wait in its socket together.
        stopper = subprocess.Popen(
            [sys.executable, "-c", "import os, sys, time, signal; p = int(sys.argv[1]); "
             "sys.stdin.read(1); time.sleep(0.05); os.kill(p, signal.SIGSTOP); time.sleep(1.5); "
             "os.kill(p, signal.SIGCONT)", str(os.getpid())], stdin=subprocess.PIPE, text=True)
        stopper.stdin.write("x")
        stopper.stdin.flush()
    else:
        time.sleep(0.4)
    try:
        hvd.barrier()
    except Exception as e:
        fail("barrier", repr(e))
    hvd.shutdown()
    if r == 2:
        stopper.wait()
    finish_alone()


if __name__ == "__main__":
    main()
