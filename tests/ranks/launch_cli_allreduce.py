"""Rank program of tests/test_launch_cli.py: one allreduce, the result and
HOROVOD_GLOO_IFACE on stdout, a line on stderr. With --mpi-details the result line also
names OMPI_COMM_WORLD_SIZE, and HOROVOD_CYCLE_TIME is printed after shutdown."""
import os
import sys

import numpy as np
import horovodlike as hvd


def main():
    mpi_details = "--mpi-details" in sys.argv[1:]
    hvd.init()
    out = hvd.allreduce(np.full(4, hvd.rank() + 1.0), op=hvd.Sum)
    head = ("mpi", os.environ.get("OMPI_COMM_WORLD_SIZE"), "sum") if mpi_details else ("sum",)
    print(*head, out.tolist(), "iface", os.environ.get("HOROVOD_GLOO_IFACE"), flush=True)
    print("to stderr", hvd.rank(), file=sys.stderr, flush=True)
    hvd.shutdown()
    if mpi_details:
        print("ct", os.environ["HOROVOD_CYCLE_TIME"])


if __name__ == "__main__":
    main()
