"""Reducing one step's gradients across ranks: shared by DistributedGradientTape and
the Keras DistributedOptimizer.

All gradients of a step go to the engine as ONE batch (one py-call inside a graph):
dense ones allreduced, tf.IndexedSlices allgathered (or densified first with
sparse_as_dense). `groups`/`num_groups`, as in Horovod, split the step into that many
batches instead. With one rank in the set (or a rank outside it) gradients are returned
untouched, as Horovod does, so a 1-rank run equals a plain TensorFlow run bit for bit.
"""
import tensorflow as tf

from horovodlike.common import arguments, autotune, request
from horovodlike.common.process_sets import global_process_set

from . import _errors, _graph
from .mpi_ops import _process_set, reduce_batch


def var_key(v):
    """An identity for a variable that a Keras variable and the tf.Variable inside it
    share."""
    if not isinstance(v, tf.Variable):
        inner = getattr(v, "value", None)
        if isinstance(inner, tf.Variable):
            return id(inner)
    return id(v)


def is_variable(v):
    """What groups= may list: a tf.Variable, or a Keras variable holding one."""
    return isinstance(v, tf.Variable) or isinstance(getattr(v, "value", None), tf.Variable)


def gradient_args(op, compression, gradient_predivide_factor=1.0, backward_passes_per_step=1,
                  groups=None, num_groups=0, sparse_as_dense=False, sum_or_average=False,
                  stacklevel=4):
    """The optimizers' argument rules (horovodlike.common.arguments), raised as they are
    in every binding: as plain Python errors, not tf.errors."""
    return arguments.gradient_args(op, compression, gradient_predivide_factor,
                                   backward_passes_per_step, groups, num_groups,
                                   sparse_as_dense, is_variable, sum_or_average,
                                   stacklevel=stacklevel)


class GradientReducer:
    """args: the checked arguments (gradient_args)."""

    def __init__(self, what, args, process_set=global_process_set,
                 scale_local_gradients=True):
        self.what = what
        with _errors.translated():
            self.process_set = _process_set(process_set)
        self.op = args.op
        self.prescale, self.postscale = args.prescale, args.postscale
        self.compression = args.compression
        self.sparse_as_dense = args.sparse_as_dense
        self.groups = args.groups
        self.scale_local_gradients = scale_local_gradients
        self.local = set()
        autotune.not_driven(what)

    def register_local(self, var):
        self.local.add(var_key(var))

    def is_local(self, var):
        return var_key(var) in self.local

    def active(self):
        ps = self.process_set
        return ps.included() and ps.size() > 1

    def _plan(self, idx, variables):
        g = self.groups
        if g is None:
            return [idx] if idx else []
        if isinstance(g, int):
            return [p for p in request.split_list(idx, g) if p]
        if variables is None:
            raise ValueError(f"{self.what}: groups given as variables need the variables")
        where = {var_key(variables[i]): i for i in idx}
        plan = []
        for group in g:
            members = [where.pop(var_key(v)) for v in group if var_key(v) in where]
            if members:
                plan.append(sorted(members))
        plan.extend([i] for i in sorted(where.values()))
        return plan

    def __call__(self, grads, variables=None):
        """Reduced gradients, same order (None stays None)."""
        _graph.check_xla(self.what)            # also at size 1: fail early, not at scale
        grads = list(grads)
        if self.sparse_as_dense:          # also at size 1, as Horovod does
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                     for g in grads]
        if not self.active():
            return grads
        local = [variables is not None and var_key(v) in self.local
                 for v in (variables or [None] * len(grads))]
        idx = [i for i, g in enumerate(grads) if g is not None and not local[i]]
        out = list(grads)
        for group in self._plan(idx, variables):
            with _errors.translated():
                reduced = reduce_batch([grads[i] for i in group], self.op, self.prescale,
                                       self.postscale, self.process_set, self.compression,
                                       gradient_scaling=True)
            for i, r in zip(group, reduced):
                out[i] = r
        if self.scale_local_gradients and self.local:
            n = self.process_set.size()
            for i, g in enumerate(out):
                if g is not None and local[i]:
                    if isinstance(g, tf.IndexedSlices):
                        out[i] = tf.IndexedSlices(g.values / n, g.indices, g.dense_shape)
                    else:
                        out[i] = g / n
        return out
