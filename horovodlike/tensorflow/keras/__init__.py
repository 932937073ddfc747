"""horovodlike.tensorflow.keras: Horovod's tf.keras API for Keras 3.

    import horovodlike.tensorflow.keras as hvd     # or: import horovodlike.keras as hvd

DistributedOptimizer wraps any Keras 3 optimizer; callbacks live in hvd.callbacks.
The value-level collectives accept anything tf.constant accepts and return tensors.
"""
import tensorflow as tf

from horovodlike.common.api import (ccl_built, cross_rank, cross_size, cuda_built,
                                    ddl_built, gloo_built, gloo_enabled, init,
                                    is_homogeneous, is_initialized, local_rank, local_size,
                                    mpi_built, mpi_enabled, mpi_threads_supported,
                                    nccl_built, rank, rocm_built, shutdown, size,
                                    start_timeline, stop_timeline)
from horovodlike.common.exceptions import HorovodInternalError, TensorMismatchError

from .. import mpi_ops as _ops
from ..compression import Compression
from ..functions import allgather_object, broadcast_object, broadcast_variables
# Adasum is exported as in Horovod's keras modules; using it raises NotImplementedError
from ..mpi_ops import (Adasum, Average, ProcessSet, Sum, add_process_set, global_process_set,
                       remove_process_set)
from . import callbacks
from . import elastic  # noqa: F401
from .distributed_optimizer import DistributedOptimizer, PartialDistributedOptimizer, load_model


def _value(value, name):
    if isinstance(value, tf.IndexedSlices) or tf.is_tensor(value):
        return value
    return tf.constant(value, name=name)


def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0,
              op=None, compression=Compression.none):
    """Allreduce a tensor-compatible value (op defaults to Average)."""
    return _ops.allreduce(_value(value, None), average=average, name=name,
                          prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                          op=op, compression=compression)


def allgather(value, name=None):
    """Allgather a tensor-compatible value on the first dimension."""
    return _ops.allgather(_value(value, None), name=name)


def broadcast(value, root_rank, name=None):
    """root_rank's value, on every rank."""
    return _ops.broadcast(_value(value, None), root_rank, name=name)


def reducescatter(value, name=None, op=Average):
    """Reduce a tensor-compatible value, then scatter its first dimension."""
    return _ops.reducescatter(_value(value, None), name=name, op=op)


def broadcast_global_variables(root_rank):
    """TensorFlow 1 only in Horovod: use BroadcastGlobalVariablesCallback or
    hvd.broadcast_variables(model.variables, root_rank)."""
    raise RuntimeError("hvd.broadcast_global_variables() does not support eager execution. "
                       "Please use hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank) "
                       "or hvd.broadcast_variables(<model/optimizer variables>) instead.")
