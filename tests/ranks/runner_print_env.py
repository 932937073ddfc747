"""Rank program of tests/test_runner.py: prints, as one JSON line, what horovodlikerun
gave this rank.

No argument: the variables in KEYS (None where unset) and the working directory.
argv[1] = PREFIX: every variable whose name starts with PREFIX."""
import json
import os
import sys

KEYS = ["HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
        "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE", "HOROVOD_HOSTNAME",
        "HOROVODLIKE_STORE_ADDR", "HOROVODLIKE_JOB_ID", "HOROVODLIKE_JOB_KEY",
        "PYTHONUNBUFFERED", "MY_TEST_VAR"]


def main():
    if len(sys.argv) > 1:
        print(json.dumps({k: v for k, v in os.environ.items() if k.startswith(sys.argv[1])}))
    else:
        print(json.dumps({k: os.environ.get(k) for k in KEYS} | {"cwd": os.getcwd()}))


if __name__ == "__main__":
    main()
