"""Horovod's `horovod.tensorflow.util` helpers, which training scripts import:
`_executing_eagerly`, `_make_subgraph`, `_cache`, `vars_to_refs`, `refs_to_vars`."""
import tensorflow as tf
from tensorflow.python.util import object_identity


def _executing_eagerly():
    """True when eager execution is on (outside any tf.function being traced)."""
    return tf.executing_eagerly()


def _make_subgraph(f):
    """f as a tf.function."""
    return tf.function(f)


def _cache(f):
    """Memoize f on its (hashable) arguments, separately for eager and graph mode."""
    cache = {}

    def wrapper(*args):
        key = (args, _executing_eagerly())
        if key not in cache:
            cache[key] = f(*args)
        return cache[key]

    return wrapper


def _ref(var):
    # tf.Variable has .ref(); so has a Keras 3 variable once horovodlike.tensorflow is
    # imported (_keras2_compat), else it is keyed by identity here.
    return var.ref() if hasattr(var, "ref") else object_identity.Reference(var)


def _deref(ref):
    return ref.deref() if hasattr(ref, "deref") else ref


def vars_to_refs(vars):
    """Variables (nested lists of them) as hashable references (nested tuples)."""
    if isinstance(vars, list):
        return tuple(vars_to_refs(v) for v in vars)
    return _ref(vars)


def refs_to_vars(refs):
    """The inverse of vars_to_refs."""
    if isinstance(refs, tuple):
        return [refs_to_vars(r) for r in refs]
    return _deref(refs)
