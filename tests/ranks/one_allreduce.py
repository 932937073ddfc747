"""The smallest job: init, one allreduce of argv[1] ones (default 3) named "x", finish."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    hvd.init()
    hvd.allreduce(np.ones(n), name="x")
    finish()


if __name__ == "__main__":
    main()
