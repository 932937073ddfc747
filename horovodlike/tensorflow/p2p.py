"""Point-to-point messages for TensorFlow: send, recv and recv_, eagerly.

A thin binding over horovodlike.common.ops (the engine's p2p channel, engine/p2p/p2p.c):
the tensor's values are handed to the engine as a contiguous numpy buffer, and a
received message is wrapped as an eager tensor without a copy. Inside a tf.function
they raise NotImplementedError: a graph-mode p2p op is not implemented.
"""
import numpy as np
import tensorflow as tf

from horovodlike.common import ops, request
from horovodlike.common.process_sets import global_process_set

from . import _tensors


def _eager(what):
    if not tf.executing_eagerly():
        raise NotImplementedError(f"hvd.{what} inside a tf.function is not implemented; "
                                  f"call it eagerly")


def _array(tensor, what):
    t = _tensors.as_tensor(tensor, what)
    _tensors.check_dtype(t, what, movement=True)
    arr = t.numpy()
    if t.dtype == tf.bfloat16:                 # numpy may not know bfloat16: its bits
        arr = tf.bitcast(t, tf.uint16).numpy()
    return t.dtype, np.ascontiguousarray(arr)


def send(tensor, dst, name=None, process_set=global_process_set):
    """Send `tensor` to global rank `dst`, matched by (this rank, dst, name)."""
    _eager("send")
    dtype, arr = _array(tensor, "send")
    code = request.engine.DTYPES["bfloat16"] if dtype == tf.bfloat16 else ops.dtype_code(arr.dtype, "send")
    req = request.p2p("send", dst, name, process_set)
    ops.synchronize(ops.submit_send(req, code, arr.shape, request.engine.address(arr), (arr,)))


def _message(res):
    dtype, shape, _ = res.message()
    if dtype == "bfloat16":
        bits = np.frombuffer(res.buffer(), np.uint16).reshape(shape) if res.nbytes else \
            np.empty(shape, np.uint16)
        return tf.bitcast(tf.constant(bits), tf.bfloat16)
    arr = np.frombuffer(res.buffer(), np.dtype(dtype)).reshape(shape) if res.nbytes else \
        np.empty(shape, np.dtype(dtype))
    return tf.constant(arr)


def recv(src, name=None, process_set=global_process_set):
    """The message `name` from global rank `src`, as a new tensor of its dtype and shape."""
    _eager("recv")
    return ops.synchronize(ops.submit_recv(request.p2p("recv", src, name, process_set), _message))


def recv_(variable, src, name=None, process_set=global_process_set):
    """Receive into a tf.Variable (assigned once the message is in); a message of another
    dtype or size fails, naming both ranks, the name and the field."""
    _eager("recv_")
    if not isinstance(variable, tf.Variable):
        raise TypeError(f"recv_ receives into a tf.Variable, got {type(variable).__name__}")
    dtype, arr = _array(variable, "recv_")
    code = request.engine.DTYPES["bfloat16"] if dtype == tf.bfloat16 else ops.dtype_code(arr.dtype, "recv_")
    req = request.p2p("recv", src, name, process_set, what="recv_")
    ops.synchronize(ops.submit_recv_into(req, code, arr.shape, request.engine.address(arr), (arr,),
                                         lambda _: None))
    variable.assign(tf.bitcast(tf.constant(arr), tf.bfloat16) if dtype == tf.bfloat16 else arr)
    return variable
