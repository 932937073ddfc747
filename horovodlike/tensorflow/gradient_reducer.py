"""Reducing one step's gradients across ranks: shared by DistributedGradientTape and
the Keras DistributedOptimizer.

All gradients of a step go to the engine as ONE batch (one py-call inside a graph):
dense ones allreduced, tf.IndexedSlices allgathered (or densified first with
sparse_as_dense). `groups`/`num_groups`, as in Horovod, split the step into that many
batches instead. With one rank in the set (or a rank outside it) gradients are returned
untouched, as Horovod does, so a 1-rank run equals a plain TensorFlow run bit for bit.
"""
import warnings

import tensorflow as tf

from horovodlike.common import request
from horovodlike.common.process_sets import global_process_set

from . import _errors, _graph
from .compression import Compression
from .mpi_ops import Average, _process_set, reduce_batch


def var_key(v):
    """An identity for a variable that a Keras variable and the tf.Variable inside it
    share."""
    if not isinstance(v, tf.Variable):
        inner = getattr(v, "value", None)
        if isinstance(inner, tf.Variable):
            return id(inner)
    return id(v)


def normalize_groups(num_groups, groups):
    if num_groups:
        warnings.warn("num_groups is deprecated (as in Horovod); use groups=",
                      DeprecationWarning, stacklevel=3)
        if groups is None:
            groups = num_groups
    if groups is not None and not (isinstance(groups, list) or
                                   (isinstance(groups, int) and groups > 0)):
        raise ValueError("groups should be a positive integer or a list of lists of "
                         "tf.Variable")
    return groups


class GradientReducer:
    def __init__(self, what, compression=Compression.none, sparse_as_dense=False, op=Average,
                 gradient_predivide_factor=1.0, groups=None,
                 process_set=global_process_set, scale_local_gradients=True, num_groups=0):
        self.what = what
        with _errors.translated():
            groups = normalize_groups(num_groups, groups)
            self.op = request.reduce_op(op, None, what)
            self.process_set = _process_set(process_set)
            if gradient_predivide_factor != 1.0 and op != Average:
                raise ValueError("gradient_predivide_factor not supported with op != Average")
            if gradient_predivide_factor <= 0:
                raise ValueError("gradient_predivide_factor must be positive")
        if op == Average:      # the engine applies 1/size for Average on top
            self.prescale, self.postscale = 1.0 / gradient_predivide_factor, \
                float(gradient_predivide_factor)
        else:
            self.prescale = self.postscale = 1.0
        self.compression = compression
        self.sparse_as_dense = sparse_as_dense
        self.groups = groups
        self.scale_local_gradients = scale_local_gradients
        self.local = set()

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
