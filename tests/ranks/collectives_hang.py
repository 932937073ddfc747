"""Rank program of tests/test_collectives.py, run by
test_harness_kills_a_hung_job_on_timeout."""
import os
import time

# The pid comes first, before the imports: under the sanitizers an import of numpy and
# the engine takes seconds, and the test must learn every rank's pid within its timeout.
print("pid=%d" % os.getpid(), flush=True)

import numpy as np  # noqa: E402
import horovodlike as hvd  # noqa: E402


def main():
    hvd.init()
    if hvd.rank() == 0:
        hvd.allreduce(np.ones(3), name="never")     # the other ranks never submit it
    else:
        time.sleep(600)


if __name__ == "__main__":
    main()
