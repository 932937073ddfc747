"""horovodlike.tensorflow: Horovod's TensorFlow 2 API on horovodlike's engine.

    import horovodlike.tensorflow as hvd

Collectives work on tf.Tensor / tf.Variable eagerly and inside tf.function (one
stateful py-call per batch of tensors; no TensorFlow headers, no custom op), with
Horovod's gradients. See docs/tensorflow.md for usage and the differences.
"""
from horovodlike.common.api import (ccl_built, cross_rank, cross_size, cuda_built,
                                    ddl_built, gloo_built, gloo_enabled, init,
                                    is_homogeneous, is_initialized, local_rank, local_size,
                                    mpi_built, mpi_enabled, mpi_threads_supported,
                                    nccl_built, rank, rocm_built, shutdown, size,
                                    start_timeline, stop_timeline)
from horovodlike.common.exceptions import HorovodInternalError, TensorMismatchError

from . import _keras2_compat
from . import elastic  # noqa: F401
from . import util  # noqa: F401  (hvd.util, as in Horovod)
from ._errors import XLANotSupportedError
from ._tensors import UnsupportedTensorError
from .compression import Compression, PowerSGD  # noqa: F401  (PowerSGD raises: torch only)
from .functions import (allgather_object, broadcast_, broadcast_object, broadcast_object_fn,
                        broadcast_variables)
from .gradient_tape import DistributedGradientTape, PartialDistributedGradientTape
from .mpi_ops import (Adasum, Average, Max, Min, Product, ProcessSet, Sum, add_process_set,
                      allgather, allreduce, alltoall, barrier, broadcast, get_process_sets,
                      global_process_set,
                      grouped_allgather, grouped_allreduce, grouped_broadcast,
                      grouped_reducescatter, join, local_rank_op, local_size_op,
                      process_set_included_op, rank_op, reducescatter, remove_process_set,
                      size_op)
from .optimizer import DistributedOptimizer
from .p2p import recv, recv_, send  # noqa: F401
from .sync_batch_norm import SyncBatchNormalization
from .util import _cache, _executing_eagerly, _make_subgraph, refs_to_vars, vars_to_refs  # noqa: F401


_keras2_compat.install()


def broadcast_global_variables(root_rank):
    """A TF1 graph's global variables from root_rank (an op to run in the Session), as
    in Horovod; under eager execution there are none, and it raises as Horovod's does."""
    if _executing_eagerly():
        raise RuntimeError("hvd.broadcast_global_variables() does not support eager "
                           "execution. Please use `hvd.broadcast_variables(<model/optimizer "
                           "variables>)` instead.")
    import tensorflow as tf
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)
