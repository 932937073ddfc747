"""Start-up and topology queries for the torch binding: the framework-free ones from
horovodlike.common.api."""
from horovodlike.common.api import (ccl_built, cross_rank, cross_size, cuda_built,
                                    ddl_built, gloo_built, gloo_enabled, init,
                                    is_homogeneous, is_initialized, local_rank,
                                    local_size, mpi_built, mpi_enabled,
                                    mpi_threads_supported, nccl_built, rank, rocm_built,
                                    shutdown, size, start_timeline, stop_timeline)

__all__ = ["ccl_built", "cross_rank", "cross_size", "cuda_built", "ddl_built", "gloo_built",
           "gloo_enabled", "init", "is_homogeneous", "is_initialized", "local_rank",
           "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built",
           "rank", "rocm_built", "shutdown", "size", "start_timeline", "stop_timeline"]
