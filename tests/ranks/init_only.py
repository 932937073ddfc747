"""Rank program of tests/test_launch_env.py and tests/test_failures.py: hvd.init() alone,
for the tests of who may join a rendezvous and of what init() refuses.

With argv[1] == "from-another-parent" it runs itself once more as its child and exits
with the child's status, so the rank that calls init() has a parent other than the test
(whose other rank it cannot meet on one host)."""
import subprocess
import sys

import horovodlike as hvd


def main():
    if sys.argv[1:] == ["from-another-parent"]:
        sys.exit(subprocess.call([sys.executable, __file__]))
    hvd.init()


if __name__ == "__main__":
    main()
