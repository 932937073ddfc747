"""Rank program of tests/test_launch_cli.py, run by
test_start_timeout_from_horovod_start_timeout: rank 1 never reaches hvd.init() (it waits
60 s, until the launcher stops it), so rank 0's init must give up after the start
timeout."""
import os
import time

import horovodlike as hvd


def main():
    if os.environ["HOROVOD_RANK"] == "1":
        time.sleep(60)
    hvd.init()


if __name__ == "__main__":
    main()
