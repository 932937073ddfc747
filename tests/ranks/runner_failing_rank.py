"""Rank program of tests/test_runner.py, run by
test_failing_rank_stops_the_job_and_leaves_nothing_behind (3 ranks).

Every rank notes its pid as a file <pid>.pid in argv[1]; rank 0 also starts a grandchild
(same process group) and notes it; rank 2 ignores SIGTERM, so the launcher must escalate
to SIGKILL; rank 1 waits until all four pids are noted, then exits with code 3."""
import os
import signal
import subprocess
import sys
import time


def main():
    d = sys.argv[1]
    rank = int(os.environ["HOROVOD_RANK"])

    def note(pid):
        open(os.path.join(d, f"{pid}.pid"), "w").close()
    note(os.getpid())
    if rank == 0:
        note(subprocess.Popen(["sleep", "60"]).pid)
    if rank == 2:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if rank == 1:
        while len(os.listdir(d)) < 4:
            time.sleep(0.05)
        sys.exit(3)
    time.sleep(60)


if __name__ == "__main__":
    main()
