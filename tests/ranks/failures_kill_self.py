"""Rank program of tests/test_failures.py, run by
test_launcher_ends_the_job_and_names_the_killed_rank,
test_mpirun_job_with_a_killed_rank_ends_promptly."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)
import signal


def main():
    hvd.init()
    x = np.ones(4 << 20, np.float32)
    for i in range(1000):
        h = hvd.allreduce_async(x, name="big")
        if hvd.rank() == 1 and i == 2:
            os.kill(os.getpid(), signal.SIGKILL)    # dies with its allreduce in flight
        try:
            hvd.synchronize(h)
        except hvd.HorovodInternalError as e:
            print(f"rank {hvd.rank()} saw: {e}", flush=True)
            time.sleep(30)       # the launcher must not wait for this
            sys.exit(5)


if __name__ == "__main__":
    main()
