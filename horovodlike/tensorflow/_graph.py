"""Running a numpy kernel from TensorFlow: directly when eager, as one stateful
`tf.numpy_function` inside a graph (tf.function, Keras' train step).

Stateful py-functions keep program order (tf.function adds control dependencies
between stateful ops), so every rank submits its collectives in the same order, and
unnamed ops can take their names from the common layer's per-process counters at run
time, exactly as eager calls do.

XLA cannot run a py-function: a collective traced under XLA (`jit_compile=True`, or
Keras' `jit_compile="auto"` with a GPU) is refused at trace time with an error that
says what to change, instead of failing obscurely or being dropped.
"""
import numpy as np
import tensorflow as tf

from ._tensors import to_tf


class XLANotSupportedError(ValueError):
    """A horovodlike collective was traced inside an XLA-compiled function."""
    # AutoGraph re-raises an error from converted code under its own type only when the
    # constructor is the plain one; otherwise users would get a StagingError.
    __init__ = Exception.__init__


def _xla_context():
    try:
        from tensorflow.python.framework import ops as tf_ops
        from tensorflow.python.ops import control_flow_util
        return control_flow_util.GraphOrParentsInXlaContext(tf_ops.get_default_graph())
    except (ImportError, AttributeError):       # private helper gone: be permissive
        return False


def entry_point(fn):
    """Mark a public function so that AutoGraph calls it as it is instead of converting
    horovodlike's own Python (it has no tensor-dependent control flow to convert)."""
    return tf.autograph.experimental.do_not_convert(fn)


def check_xla(what):
    """Raise XLANotSupportedError when tracing under XLA."""
    if not tf.executing_eagerly() and _xla_context():
        raise XLANotSupportedError(
            f"horovodlike: {what} cannot run inside an XLA-compiled function. horovodlike's "
            f"collectives run on the CPU through a Python call, which XLA cannot compile. "
            f"Pass jit_compile=False to model.compile(...) (Keras turns XLA on by itself "
            f"with jit_compile='auto' when a GPU is visible) or to tf.function(...).")


def run(fn, inputs, out_dtypes, out_shapes, what):
    """fn(*numpy arrays) -> list of numpy arrays; returns the outputs as tensors."""
    if not inputs and not out_dtypes:
        return []
    if tf.executing_eagerly():
        return [to_tf(a) for a in fn(*[np.asarray(t) for t in inputs])]
    check_xla(what)
    fn = tf.autograph.experimental.do_not_convert(fn)       # plain Python: keep it so
    outs = tf.numpy_function(fn, list(inputs), list(out_dtypes), stateful=True,
                             name="horovodlike_" + what)
    for o, s in zip(outs, out_shapes):
        o.set_shape(s)
    return list(outs)
