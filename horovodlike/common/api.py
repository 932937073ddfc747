"""The framework-free public API's entry point: init().

init() is the one call that knows every way a job starts: under horovodlikerun's
elastic driver it joins the driver's next round (elastic.init); otherwise it starts the
engine with the launch environment's rank and size and registers the process sets
(process_sets.start). It sits on top of the layers (see horovodlike/common/__init__.py),
so nothing below it imports it.
"""
from . import elastic
from . import process_sets as _sets
# The topology queries and the rest of start-up, so a binding takes its whole
# framework-free surface from here.
from .basics import (ccl_built, cross_rank, cross_size, cuda_built,  # noqa: F401
                     ddl_built, gloo_built, gloo_enabled, is_homogeneous, is_initialized,
                     local_rank, local_size, mpi_built, mpi_enabled, mpi_threads_supported,
                     nccl_built, rank, rocm_built, shutdown, size, start_timeline,
                     stop_timeline)

__all__ = ["ccl_built", "cross_rank", "cross_size", "cuda_built", "ddl_built", "gloo_built",
           "gloo_enabled", "init", "is_homogeneous", "is_initialized", "local_rank",
           "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built",
           "rank", "rocm_built", "shutdown", "size", "start_timeline", "stop_timeline"]


def init(comm=None, process_sets=None):
    """Start horovodlike on this process (idempotent).

    comm: an mpi4py communicator to run on, or a list of MPI_COMM_WORLD ranks (Horovod's
    argument); by default the launch environment decides. process_sets: a list of
    ProcessSet (or rank lists) to register on every rank, or "dynamic" to allow
    add_process_set() later.
    """
    if comm is None and elastic.enabled():
        return elastic.init(process_sets)
    _sets.start(comm, process_sets)
