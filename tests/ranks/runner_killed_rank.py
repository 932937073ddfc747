"""Rank program of tests/test_runner.py, run by test_rank_killed_by_signal_is_reported:
rank 1 SIGKILLs itself; the others wait to be stopped."""
import os
import signal
import time


def main():
    if os.environ["HOROVOD_RANK"] == "1":
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)


if __name__ == "__main__":
    main()
