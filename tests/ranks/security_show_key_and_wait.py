"""Rank program of tests/test_security.py, run by
test_killing_the_launcher_ends_every_rank, test_the_key_is_on_no_command_line."""
import os
import time


def main():
    print("KEY", os.environ["HOROVODLIKE_JOB_KEY"], os.getpid(), flush=True)
    time.sleep(60)


if __name__ == "__main__":
    main()
