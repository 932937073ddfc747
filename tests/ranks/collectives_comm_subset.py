"""Rank program of tests/test_collectives.py, run by test_init_on_a_list_of_world_ranks."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)
from mpi4py import MPI


def main():
    me = MPI.COMM_WORLD.Get_rank()
    try:
        hvd.init(comm=[2, 0])
    except ValueError as e:
        print(f"refused {me}: {e}", flush=True)
        sys.exit(0)
    out = hvd.allreduce(np.array([float(me)]), op=hvd.Sum, name="subset")
    ps = hvd.ProcessSet(MPI.COMM_WORLD)
    print(f"member {me} rank={hvd.rank()} size={hvd.size()} sum={out[0]} "
          f"comm={ps.mpi_comm is MPI.COMM_WORLD}", flush=True)


if __name__ == "__main__":
    main()
