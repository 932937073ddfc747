"""Rank program of tests/test_failures.py, run by
test_launcher_lets_the_others_name_a_killed_rank_before_stopping_them."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)
import signal


def main():
    hvd.init()
    pids = [int(p) for p in hvd.allgather(np.array([os.getpid()]), name="pids")]
    if hvd.rank() == 1:
        # Rank 0, stopped, relays no verdict: rank 2, which waits on this rank, names it
        # only after its engine's grace for rank 0's verdict (1 s).
        os.kill(pids[0], signal.SIGSTOP)
        os.kill(os.getpid(), signal.SIGKILL)
    elif hvd.rank() == 2:
        try:
            hvd.recv(1, name="never")
        except hvd.HorovodInternalError as e:
            print(f"FAILED {e}", flush=True)
    time.sleep(60)               # rank 0 is stopped here; the launcher ends the job


if __name__ == "__main__":
    main()
