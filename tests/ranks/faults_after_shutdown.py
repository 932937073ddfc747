"""Rank program of tests/test_faults.py, run by
test_launcher_kills_a_rank_stopped_after_its_peers_finished,
test_launcher_waits_for_a_busy_rank_after_its_peers_finished,
test_mpirun_ends_a_job_whose_rank_stopped_after_shutdown,
test_mpirun_waits_for_a_busy_rank_after_shutdown."""
import os
import signal
import time
import numpy as np
import horovodlike as hvd


def main():
    victim, mode = int(os.environ["FAULT_VICTIM"]), os.environ["FAULT_MODE"]
    hvd.init()
    me = hvd.rank()
    hvd.allreduce(np.ones(4), name="warm")
    hvd.shutdown()
    if me == victim:
        if mode == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        end = time.monotonic() + float(os.environ["FAULT_BUSY"])
        while time.monotonic() < end:      # busy and silent: working, not hung
            pass
    print("FINISHED", flush=True)


if __name__ == "__main__":
    main()
