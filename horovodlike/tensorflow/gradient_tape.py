"""DistributedGradientTape: a tf.GradientTape whose gradient() returns gradients
combined across ranks (one engine batch per call)."""
import tensorflow as tf

from horovodlike.common.process_sets import global_process_set

from . import _graph
from .compression import Compression
from .gradient_reducer import GradientReducer, gradient_args
from .mpi_ops import Average

_classes = {}


class _DistributedGradientTape:
    """Methods mixed into a subclass of the user's tape class."""

    @_graph.entry_point
    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE, use_generic_names=False):
        grads = super(self._hvd_class, self).gradient(
            target, sources, output_gradients=output_gradients,
            unconnected_gradients=unconnected_gradients)
        flat_grads = tf.nest.flatten(grads)
        flat_sources = tf.nest.flatten(sources)
        reduced = self._hvd_reducer(flat_grads, flat_sources)
        return tf.nest.pack_sequence_as(grads, reduced)

    def register_local_source(self, source):
        """Gradients of this source stay local (scaled by 1/size unless
        scale_local_gradients=False), as in Horovod."""
        self._hvd_reducer.register_local(source)

    def get_local_and_global_gradients(self, target, sources, output_gradients=None,
                                       use_generic_names=False):
        """gradient(), split as Horovod's: ([(local source, gradient)], [(other source,
        gradient)]), each in the order of `sources`."""
        grads = self.gradient(target, sources, output_gradients=output_gradients)
        local, other = [], []
        for s, g in zip(sources, grads):
            (local if self._hvd_reducer.is_local(s) else other).append((s, g))
        return local, other


def _distributed_class(base):
    cls = _classes.get(base)
    if cls is None:
        attrs = {k: v for k, v in _DistributedGradientTape.__dict__.items()
                 if k in ("gradient", "register_local_source",
                          "get_local_and_global_gradients")}
        attrs.update(__module__=base.__module__, __qualname__=base.__qualname__,
                     __doc__=base.__doc__)
        cls = type(base.__name__, (base,), attrs)
        cls._hvd_class = cls
        _classes[base] = cls
    return cls


def DistributedGradientTape(gradtape, device_dense='', device_sparse='',
                            compression=Compression.none, sparse_as_dense=False, op=Average,
                            gradient_predivide_factor=1.0, num_groups=0, groups=None,
                            process_set=global_process_set, scale_local_gradients=True):
    """Wrap a tf.GradientTape so that gradient() averages (op) gradients over ranks.

    Works on a tape that has recorded already (`tape = hvd.DistributedGradientTape(tape)`
    after the `with` block) and on a fresh one (`with hvd.DistributedGradientTape(
    tf.GradientTape()) as tape:`)."""
    if not isinstance(gradtape, tf.GradientTape):
        raise TypeError(f"DistributedGradientTape expects a tf.GradientTape, got "
                        f"{type(gradtape).__name__}")
    args = gradient_args(op, compression, gradient_predivide_factor, groups=groups,
                         num_groups=num_groups, sparse_as_dense=sparse_as_dense)
    reducer = GradientReducer("DistributedGradientTape", args, process_set,
                              scale_local_gradients)
    tape = object.__new__(_distributed_class(type(gradtape)))
    tape.__dict__.update(gradtape.__dict__)        # the recording, persistence, watches
    tape._hvd_reducer = reducer
    return tape


def PartialDistributedGradientTape(gradtape, device_dense='', device_sparse='',
                                   compression=Compression.none, sparse_as_dense=False,
                                   op=Average, gradient_predivide_factor=1.0, num_groups=0,
                                   groups=None, process_set=global_process_set,
                                   local_layers=None, scale_local_gradients=True):
    """DistributedGradientTape that leaves the gradients of `local_layers` local."""
    import keras
    if local_layers is None:
        local_layers = []
    elif isinstance(local_layers, keras.layers.Layer):
        local_layers = [local_layers]
    elif not all(isinstance(layer, keras.layers.Layer) for layer in local_layers):
        raise ValueError("All local layers must be of keras.layers.Layer type.")
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression,
                                   sparse_as_dense, op, gradient_predivide_factor, num_groups,
                                   groups, process_set, scale_local_gradients)
    for layer in local_layers:
        for var in layer.trainable_weights:
            tape.register_local_source(var)
    return tape
