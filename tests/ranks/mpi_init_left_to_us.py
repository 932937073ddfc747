"""Rank program of tests/test_mpi_init.py, run under mpirun: Horovod's
test_process_sets_static.py pattern. The script sets mpi4py.rc.initialize = False, so
hvd.init() must initialise MPI (asking for MPI_THREAD_MULTIPLE) and finalise it at exit;
static process sets given twice, or naming every rank, are ignored as Horovod ignores
them; MPI works beside horovodlike until the script ends. argv[1] is "comm" to pass
comm=MPI.COMM_WORLD as well."""
import atexit
import os
import sys


def finalised_at_exit():
    # Registered before mpi4py's import: it runs after every other exit handler.
    from mpi4py import MPI
    print(f"MPI finalised at exit: {MPI.Is_finalized()}", flush=True)


atexit.register(finalised_at_exit)

import mpi4py  # noqa: E402
mpi4py.rc.initialize = False
from mpi4py import MPI  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import *  # noqa: E402,F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def main():
    check(not MPI.Is_initialized(), "mpi4py.rc.initialize = False leaves MPI alone")
    size = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    me = int(os.environ["OMPI_COMM_WORLD_RANK"])
    rest = list(range(1, size))
    again = [hvd.ProcessSet(list(range(size - 1, -1, -1))),   # every rank: ignored
             hvd.ProcessSet([0])]                             # given again: ignored
    sets = [[0], rest if me == 0 else rest[::-1], *again]     # a permuted set is the same
    by_caller = sys.argv[1:] == ["comm"]
    if by_caller:
        MPI.Init_thread(MPI.THREAD_MULTIPLE)    # the caller's MPI, handed over by comm=
    hvd.init(process_sets=sets, **({"comm": MPI.COMM_WORLD} if by_caller else {}))
    check(MPI.Is_initialized(), "hvd.init() initialised MPI")
    check(hvd.mpi_threads_supported() == (MPI.Query_thread() == MPI.THREAD_MULTIPLE),
          "mpi_threads_supported() is MPI's granted level")
    ps = hvd.get_process_sets()
    check(ps == {0: list(range(size)), 1: [0], 2: rest}, "the static sets", str(ps))
    check([s.process_set_id for s in again] == [0, 1], "an ignored set takes the id of "
          "the set it repeats", str([s.process_set_id for s in again]))
    if me in rest:
        got = hvd.allreduce(np.full(2, me, np.float32), op=hvd.Sum, name="rest",
                            process_set=_set(2))
        check_equal(got, np.full(2, sum(rest), np.float32), "allreduce over set 2")
    MPI.COMM_WORLD.barrier()          # MPI beside horovodlike
    hvd.shutdown()
    MPI.COMM_WORLD.barrier()          # still up after hvd.shutdown(): finalised at exit
    if by_caller:
        MPI.Finalize()                # the caller's to end
    finish_alone()


def _set(sid):
    from horovodlike.common import process_sets
    return process_sets.by_id(sid)


if __name__ == "__main__":
    main()
