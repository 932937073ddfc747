"""``horovodlikerun``: parse the command line, then hand the job to the launcher it asks for.

The one module that knows every launcher, so that none of them imports another:
args (the command line) <- launch (a fixed-size job) <- elastic_driver <- entry, and
mpirun (--mpi: exec mpirun).
"""

import sys

from .elastic_driver import is_elastic, run_elastic
from .launch import parse_args, run_static, tuning_env
from .mpirun import run_mpi


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if is_elastic(args):
        return run_elastic(args)
    if args.use_mpi:
        return run_mpi(args, tuning_env(args))
    return run_static(args)
