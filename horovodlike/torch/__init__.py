"""horovodlike.torch: Horovod's PyTorch API (`horovod.torch`) on horovodlike's engine.

Switch a Horovod script with one line:

    import horovodlike.torch as hvd      # was: import horovod.torch as hvd

and run it under horovodlikerun, mpirun or plain python. CPU tensors; CUDA tensors are
experimental (HOROVODLIKE_EXPERIMENTAL_CUDA=1, staged through host memory by
_staging.py); see docs/moving-from-horovod.md for every known difference from Horovod.
"""
from horovodlike.common.exceptions import (HorovodInternalError,  # noqa: F401
                                           HostsUpdatedInterrupt, TensorMismatchError)
# hvd.Topology: the pipeline / tensor / data-parallel layout; also reachable as
# horovodlike.common.topology.Topology, hvd.pipeline.Topology and hvd.parallel.Topology
from horovodlike.common.topology import Topology  # noqa: F401

from . import mpi_ops  # noqa: F401
from . import elastic  # noqa: F401
from . import parallel  # noqa: F401
from . import pipeline  # noqa: F401
from .compression import Compression  # noqa: F401
from .functions import (allgather_object, broadcast_object,  # noqa: F401
                        broadcast_optimizer_state, broadcast_parameters)
from .mpi_ops import (Adasum, Average, Max, Min, Product, Sum,  # noqa: F401
                      allgather, allgather_async, allreduce, allreduce_, allreduce_async,
                      allreduce_async_, alltoall, alltoall_async, barrier, broadcast,
                      broadcast_, broadcast_async, broadcast_async_, ccl_built, cross_rank,
                      cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled,
                      grouped_allgather, grouped_allgather_async, grouped_allreduce,
                      grouped_allreduce_, grouped_allreduce_async, grouped_allreduce_async_,
                      grouped_reducescatter, grouped_reducescatter_async, init,
                      is_homogeneous, is_initialized, join, local_rank, local_size,
                      mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, poll, rank,
                      recv, recv_, recv_async, recv_async_, reducescatter, reducescatter_async,
                      rocm_built, send, send_async, shutdown, size,
                      sparse_allreduce_async, start_timeline, stop_timeline, synchronize)
from .mpi_ops import (ProcessSet, add_process_set, get_process_sets,  # noqa: F401
                      global_process_set, remove_process_set)
from .optimizer import DistributedOptimizer  # noqa: F401
from .powersgd import PowerSGD  # noqa: F401
from .sharded import ShardedDistributedOptimizer  # noqa: F401
from .sync_batch_norm import SyncBatchNorm  # noqa: F401
