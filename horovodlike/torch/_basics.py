"""Start-up and topology queries for the torch binding: the framework-free ones from
horovodlike.common.basics, including the timeline calls where this build has them."""
from horovodlike.common import basics as _basics
from horovodlike.common.basics import (ccl_built, cross_rank, cross_size, cuda_built,
                                       ddl_built, gloo_built, gloo_enabled, init,
                                       is_homogeneous, is_initialized, local_rank,
                                       local_size, mpi_built, mpi_enabled,
                                       mpi_threads_supported, nccl_built, rank, rocm_built,
                                       shutdown, size)

__all__ = ["ccl_built", "cross_rank", "cross_size", "cuda_built", "ddl_built", "gloo_built",
           "gloo_enabled", "init", "is_homogeneous", "is_initialized", "local_rank",
           "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built",
           "rank", "rocm_built", "shutdown", "size", "start_timeline", "stop_timeline"]


def start_timeline(file_path, mark_cycles=False):
    """Start writing Horovod's Chrome-trace timeline of every op to file_path."""
    fn = getattr(_basics, "start_timeline", None)
    if fn is None:
        raise NotImplementedError("start_timeline() is not implemented in this build of "
                                  "horovodlike")
    return fn(file_path, mark_cycles)


def stop_timeline():
    """Stop writing the timeline started by start_timeline()."""
    fn = getattr(_basics, "stop_timeline", None)
    if fn is None:
        raise NotImplementedError("stop_timeline() is not implemented in this build of "
                                  "horovodlike")
    return fn()
