"""DistributedOptimizer for Keras 3 optimizers, and load_model that re-wraps.

Keras 3 optimizers have no gradient hook, but `apply_gradients` and Keras' own
`train_step` both go through `apply(grads, trainable_variables)`. The wrapper turns the
user's optimizer into an instance of a subclass of its own class whose `apply` reduces
the gradients first (before loss-scale handling, clipping and weight decay, where
Horovod reduces them too). The subclass carries the original `__name__`, `__module__`
and `__qualname__`, so `model.save()` writes the plain optimizer and a saved model loads
anywhere, with or without horovodlike.

The wrap is done in place (the optimizer object, any state it already has, and any
reference to it are kept); Horovod returns a new optimizer built from the config.
"""
import warnings

import keras
import tensorflow as tf

from horovodlike.common.process_sets import global_process_set

from .. import _graph
from ..compression import Compression
from ..gradient_reducer import GradientReducer, gradient_args, var_key
from ..mpi_ops import Average

_classes = {}


class _Accumulators:
    """backward_passes_per_step > 1: one local sum per trainable variable. A plain
    holder, so Keras and tf.train.Checkpoint do not save these with the optimizer."""

    def __init__(self):
        self.by_key = {}

    def ensure(self, variables):
        for v in variables:
            k = var_key(v)
            if k not in self.by_key:
                self.by_key[k] = tf.Variable(tf.zeros(v.shape, tf.as_dtype(v.dtype)),
                                             trainable=False, name="hvd_accumulator")
        return [self.by_key[var_key(v)] for v in variables]


class _Config:
    def __init__(self, reducer, backward_passes_per_step, average_aggregated_gradients):
        self.reducer = reducer
        self.bpps = backward_passes_per_step
        self.average_aggregated = average_aggregated_gradients
        self.acc = _Accumulators()


def _distributed_class(base):
    cls = _classes.get(base)
    if cls is not None:
        return cls

    @_graph.entry_point
    def build(self, variables):
        base.build(self, variables)
        cfg = self.__dict__.get("_hvd")
        if cfg is not None and cfg.bpps > 1:
            cfg.acc.ensure(list(variables))

    @_graph.entry_point
    def apply(self, grads, trainable_variables=None):
        cfg = self._hvd
        grads = list(grads)
        if trainable_variables is not None:
            trainable_variables = list(trainable_variables)
            if not self.built:                 # as Keras does, but before any branch
                with keras.name_scope(self.name, caller=self):
                    self.build(trainable_variables)
                self.built = True
        variables = trainable_variables if trainable_variables is not None else \
            (list(self._trainable_variables) if self.built else None)
        if cfg.bpps == 1:
            return base.apply(self, cfg.reducer(grads, variables), trainable_variables)
        return _apply_every_n(self, base, cfg, grads, variables, trainable_variables)

    def register_local_var(self, var):
        """Gradients of `var` stay local (Horovod's register_local_var)."""
        self._hvd.reducer.register_local(var)

    cls = type(base.__name__, (base,), {
        "build": build, "apply": apply, "register_local_var": register_local_var,
        "__module__": base.__module__, "__qualname__": base.__qualname__,
        "__doc__": base.__doc__, "_hvd_base": base})
    _classes[base] = cls
    return cls


def _apply_every_n(opt, base, cfg, grads, variables, trainable_variables):
    """Accumulate locally; reduce and apply every cfg.bpps-th call (Horovod's
    backward_passes_per_step). The iteration counter advances on every call."""
    if variables is None:
        raise ValueError("backward_passes_per_step > 1 needs the optimizer built first: pass "
                         "the variables to apply() or call optimizer.build(variables)")
    accs = cfg.acc.ensure(variables)
    for a, g in zip(accs, grads):
        if g is not None:
            a.assign_add(tf.convert_to_tensor(g))
    n = cfg.bpps

    def communicate():
        summed = [None if g is None else (a.read_value() / n if cfg.average_aggregated
                                          else a.read_value())
                  for a, g in zip(accs, grads)]
        base.apply(opt, cfg.reducer(summed, variables), trainable_variables)
        for a in accs:
            a.assign(tf.zeros_like(a))
        return tf.constant(True)

    def accumulate():
        opt._iterations.assign_add(1)
        return tf.constant(False)

    is_comm = tf.equal((opt._iterations + 1) % n, 0)
    tf.cond(is_comm, communicate, accumulate)


def DistributedOptimizer(optimizer, name=None, device_dense='', device_sparse='',
                         compression=Compression.none, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=Average, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True):
    """Make a Keras 3 optimizer average (op=Average) or sum its gradients over ranks
    before applying them. Returns the same optimizer object, now distributed."""
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"DistributedOptimizer expects a Keras optimizer "
                        f"(keras.optimizers.Optimizer), got {type(optimizer).__name__}")
    args = gradient_args(op, compression, gradient_predivide_factor, backward_passes_per_step,
                         groups, num_groups, sparse_as_dense, sum_or_average=True)
    backward_passes_per_step = args.backward_passes_per_step
    if backward_passes_per_step > 1 and getattr(optimizer, "gradient_accumulation_steps", None):
        raise ValueError("use either Keras' gradient_accumulation_steps or "
                         "backward_passes_per_step, not both")
    reducer = GradientReducer("DistributedOptimizer", args, process_set,
                              scale_local_gradients)
    base = getattr(type(optimizer), "_hvd_base", type(optimizer))
    cfg = _Config(reducer, backward_passes_per_step, average_aggregated_gradients)
    object.__setattr__(optimizer, "_hvd", cfg)     # untracked: not part of saved state
    optimizer.__class__ = _distributed_class(base)
    if backward_passes_per_step > 1 and optimizer.built:
        cfg.acc.ensure(list(optimizer._trainable_variables))
    return optimizer


def PartialDistributedOptimizer(optimizer, name=None, device_dense='', device_sparse='',
                                compression=Compression.none, sparse_as_dense=False,
                                gradient_predivide_factor=1.0, op=Average,
                                backward_passes_per_step=1, average_aggregated_gradients=False,
                                groups=None, process_set=global_process_set, local_layers=None,
                                scale_local_gradients=True):
    """DistributedOptimizer that leaves the gradients of `local_layers` local."""
    opt = DistributedOptimizer(optimizer, name, device_dense, device_sparse, compression,
                               sparse_as_dense, gradient_predivide_factor, op,
                               backward_passes_per_step, average_aggregated_gradients, 0,
                               groups, process_set, scale_local_gradients)
    if isinstance(local_layers, keras.layers.Layer):
        local_layers = [local_layers]
    for layer in local_layers or []:
        for var in layer.trainable_weights:
            opt.register_local_var(var)
    return opt


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none, legacy_opts=False):
    """keras.models.load_model, then the model's optimizer (with its restored state) is
    made distributed. Models saved with or without horovodlike both load.

    legacy_opts: Horovod's switch for tf.keras.optimizers.legacy; Keras 3 has no legacy
    optimizers, so the optimizer Keras restores is the one wrapped either way."""
    if legacy_opts:
        warnings.warn("load_model(legacy_opts=True): Keras 3 has no legacy optimizers; "
                      "wrapping the optimizer Keras restored", stacklevel=2)
    objects = {cls.__name__: cls for cls in (custom_optimizers or [])}
    objects.update(custom_objects or {})
    model = keras.models.load_model(filepath, custom_objects=objects or None)
    if getattr(model, "optimizer", None) is not None:
        DistributedOptimizer(model.optimizer, compression=compression)
    return model
