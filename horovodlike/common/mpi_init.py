"""MPI initialised as Horovod does.

A script may set ``mpi4py.rc.initialize = False`` before importing mpi4py (Horovod's own
tests do) so that importing ``mpi4py.MPI`` leaves MPI alone and the library initialises
it. Then, under an MPI launcher, the first MPI use of hvd.init() calls
MPI_Init_thread(MPI_THREAD_MULTIPLE), which mpi4py beside horovodlike needs and which
Horovod asks for too; MPI may grant less (hvd.mpi_threads_supported() says). What this
process initialised it finalises at exit, after the engine's shutdown and after
mpi_end's MPI_Abort of a failed job (an atexit handler registered before theirs runs
after them). Horovod finalises in hvd.shutdown() instead; at exit, a script may still use
MPI between hvd.shutdown() and its end. MPI that is already initialised (mpi4py's
default, or hvd.init(comm=...)) is left to whoever initialised it.
"""
import atexit
import threading

_lock = threading.Lock()
_ours = False          # this module called MPI_Init_thread


def mpi():
    """mpi4py's MPI module, with MPI initialised (ImportError without mpi4py)."""
    global _ours
    from mpi4py import MPI
    with _lock:
        if not MPI.Is_initialized():
            MPI.Init_thread(MPI.THREAD_MULTIPLE)
            _ours = True
            atexit.register(_finalize)
    return MPI


def initialised_here():
    """True when hvd.init() initialised MPI (and so finalises it at exit)."""
    return _ours


def _finalize():
    from mpi4py import MPI
    if MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.Finalize()
