"""horovodlike: Horovod's API on a framework-free C engine.

`import horovodlike as hvd` is the framework-free API (collectives on numpy arrays);
`horovodlike.torch`, `horovodlike.tensorflow` and `horovodlike.tensorflow.keras` add the
framework bindings.
"""
from .common.api import (ccl_built, cross_rank, cross_size, cuda_built, ddl_built,
                         gloo_built, gloo_enabled, init, is_homogeneous, is_initialized,
                         local_rank, local_size, mpi_built, mpi_enabled,
                         mpi_threads_supported, nccl_built, rank, rocm_built, shutdown,
                         size, start_timeline, stop_timeline)
from .common.exceptions import HorovodInternalError, TensorMismatchError
from .common.ops import (Adasum, Average, Max, Min, Product, Sum, allgather, allgather_async,
                         allreduce, allreduce_async, alltoall, alltoall_async, barrier, broadcast,
                         broadcast_async, join, poll, recv, recv_, recv_async, recv_async_,
                         reducescatter, reducescatter_async, send, send_async, synchronize)
from .common.dynamic_sets import add_process_set, remove_process_set
from .common.process_sets import ProcessSet, get_process_sets, global_process_set
from .runner.run_fn import run

__version__ = "0.1.0"
