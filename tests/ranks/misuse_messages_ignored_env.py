"""Rank program of tests/test_misuse_messages.py, run by
test_ineffective_horovod_variables_get_one_notice_at_init."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def main():
    hvd.init()
    hvd.shutdown()
    hvd.init()                   # a second init says nothing more
    finish_alone()


if __name__ == "__main__":
    main()
