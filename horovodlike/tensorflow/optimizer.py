"""horovodlike.tensorflow.DistributedOptimizer: Keras optimizers go to the Keras
wrapper; tf.compat.v1.train optimizers get Horovod's compute_gradients wrapper."""
import tensorflow as tf

from horovodlike.common.process_sets import global_process_set

from .compression import Compression
from .gradient_reducer import GradientReducer, gradient_args
from .mpi_ops import Average

_Legacy = getattr(getattr(getattr(tf, "compat", None), "v1", None), "train", None)
_Legacy = getattr(_Legacy, "Optimizer", None)


if _Legacy is not None:
    class _LegacyDistributedOptimizer(_Legacy):
        """Wraps a tf.compat.v1.train.Optimizer: compute_gradients() reduces."""

        def __init__(self, optimizer, reducer, name=None, use_locking=False):
            super().__init__(name=name or f"Distributed{type(optimizer).__name__}",
                             use_locking=use_locking)
            self._optimizer = optimizer
            self._reducer = reducer

        def register_local_var(self, var):
            self._reducer.register_local(var)

        def compute_gradients(self, *args, **kwargs):
            grads_and_vars = self._optimizer.compute_gradients(*args, **kwargs)
            if not grads_and_vars:
                return grads_and_vars
            grads, variables = zip(*grads_and_vars)
            reduced = self._reducer(list(grads), list(variables))
            return list(zip(reduced, variables))

        def apply_gradients(self, *args, **kwargs):
            return self._optimizer.apply_gradients(*args, **kwargs)

        def get_slot(self, *args, **kwargs):
            return self._optimizer.get_slot(*args, **kwargs)

        def get_slot_names(self, *args, **kwargs):
            return self._optimizer.get_slot_names(*args, **kwargs)

        def variables(self, *args, **kwargs):
            return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense='',
                         device_sparse='', compression=Compression.none, sparse_as_dense=False,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True):
    """Wrap an optimizer so that gradients are combined over ranks before being applied.
    The argument rules are every binding's (horovodlike/common/arguments.py)."""
    import keras
    if isinstance(optimizer, keras.optimizers.Optimizer):
        from .keras.distributed_optimizer import DistributedOptimizer as _keras_wrap
        return _keras_wrap(optimizer, name=name, compression=compression,
                           sparse_as_dense=sparse_as_dense,
                           gradient_predivide_factor=gradient_predivide_factor, op=op,
                           backward_passes_per_step=backward_passes_per_step,
                           average_aggregated_gradients=average_aggregated_gradients,
                           num_groups=num_groups, groups=groups, process_set=process_set,
                           scale_local_gradients=scale_local_gradients)
    if _Legacy is not None and isinstance(optimizer, _Legacy):
        args = gradient_args(op, compression, gradient_predivide_factor,
                             backward_passes_per_step, groups, num_groups, sparse_as_dense)
        if args.backward_passes_per_step != 1:
            raise NotImplementedError("backward_passes_per_step > 1 is not supported for "
                                      "tf.compat.v1 optimizers")
        reducer = GradientReducer("DistributedOptimizer", args, process_set,
                                  scale_local_gradients)
        return _LegacyDistributedOptimizer(optimizer, reducer, name, use_locking)
    raise ValueError(f"Provided optimizer doesn't inherit from either legacy TensorFlow or "
                     f"Keras optimizer: {optimizer}")
