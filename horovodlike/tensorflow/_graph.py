"""Running a numpy kernel from TensorFlow: directly when eager, as one stateful
`tf.numpy_function` inside a graph (tf.function, Keras' train step); and naming the
unnamed ops traced into a graph.

Unnamed ops get their names when they are traced, as Horovod names graph ops when the
graph is built: numbered per function graph, in trace order, which every rank follows
the same way. The order in which TensorFlow later runs them does not matter, and a rank
that retraces a function (a new input shape, say) numbers the new graph from zero again,
as the others do. Eager calls are numbered when made, by the common counters.

Errors keep Horovod's tf.errors types in both modes (see _errors).

XLA cannot run a py-function: a collective traced under XLA (`jit_compile=True`, or
Keras' `jit_compile="auto"` with a GPU) is refused at trace time with an error that
says what to change, instead of failing obscurely or being dropped.
"""
import functools
import re
import weakref

import numpy as np
import tensorflow as tf

from horovodlike.common import request

from . import _errors
from ._errors import XLANotSupportedError
from ._tensors import np_dtype, to_tf


def _xla_context():
    try:
        from tensorflow.python.framework import ops as tf_ops
        from tensorflow.python.ops import control_flow_util
        return control_flow_util.GraphOrParentsInXlaContext(tf_ops.get_default_graph())
    except (ImportError, AttributeError):       # private helper gone: be permissive
        return False


def entry_point(fn):
    """Mark a public function so that AutoGraph calls it as it is instead of converting
    horovodlike's own Python (it has no tensor-dependent control flow to convert), and
    so that its errors carry Horovod's tf.errors types."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        with _errors.translated():
            return fn(*args, **kwargs)
    return tf.autograph.experimental.do_not_convert(call)


def check_xla(what):
    """Raise XLANotSupportedError when tracing under XLA."""
    if not tf.executing_eagerly() and _xla_context():
        raise XLANotSupportedError(
            f"horovodlike: {what} cannot run inside an XLA-compiled function. horovodlike's "
            f"collectives run on the CPU through a Python call, which XLA cannot compile. "
            f"Pass jit_compile=False to model.compile(...) (Keras turns XLA on by itself "
            f"with jit_compile='auto' when a GPU is visible) or to tf.function(...).")


class _GraphNamer:
    """Numbers for the unnamed ops traced into one function graph (and the cond/while
    branches and nested functions traced inside it), named after the function."""

    def __init__(self, prefix):
        self.prefix = prefix
        self.counters = request.Counters()

    def next(self, kind, sid):
        return f"{self.prefix}.{self.counters.next(kind, sid)}"


_namers = weakref.WeakKeyDictionary()


def namer():
    """How unnamed ops are numbered here: None when eager (request's counters, at call
    time); inside a graph, by the outermost function graph being traced."""
    if tf.executing_eagerly():
        return None
    from tensorflow.python.framework import ops as tf_ops
    g = tf_ops.get_default_graph()
    while hasattr(getattr(g, "outer_graph", None), "outer_graph"):    # a function graph
        g = g.outer_graph
    n = _namers.get(g)
    if n is None:
        # "__backward_f_36": TensorFlow's uid suffixes differ between ranks.
        prefix = re.sub(r"(_\d+)+$", "", getattr(g, "name", None) or "graph")
        n = _namers[g] = _GraphNamer(prefix)
    return n


def run(fn, inputs, out_dtypes, out_shapes, what):
    """fn(*numpy arrays) -> list of numpy arrays; returns the outputs as tensors."""
    if not inputs and not out_dtypes:
        return []
    if tf.executing_eagerly():
        with _errors.translated():
            return [to_tf(a) for a in fn(*[np.asarray(t) for t in inputs])]
    check_xla(what)
    empty = [np_dtype(d) for d in out_dtypes]

    def guarded(*arrays):
        try:
            outs = list(fn(*arrays))
            error = None
        except Exception as e:  # noqa: BLE001 - only a mismatch is returned, see _errors
            if not _errors.is_precondition(e):
                raise
            outs, error = [np.zeros(0, d) for d in empty], e
        return outs + [np.array(_errors.status_path(error).encode(), dtype=object)]

    guarded = tf.autograph.experimental.do_not_convert(guarded)   # plain Python: keep it so
    *outs, status = tf.numpy_function(guarded, list(inputs), list(out_dtypes) + [tf.string],
                                      stateful=True, name="horovodlike_" + what)
    with tf.control_dependencies([_errors.check_status(status, what)]):
        outs = [tf.identity(o) for o in outs]
    for o, s in zip(outs, out_shapes):
        o.set_shape(s)
    return outs
