"""TensorFlow tensors <-> engine buffers: the dtype table, argument checks, 64-byte
aligned output buffers, and wrapping numpy results as tensors without a copy.

Facts this module is built on (TF 2.21):
  * ``np.asarray(eager_tensor)`` is a zero-copy, read-only view: the input path.
  * ``tf.experimental.dlpack.from_dlpack`` is zero-copy, but TensorFlow aborts the whole
    process at the first kernel that touches an imported buffer unless it is 64-byte
    aligned, so only buffers allocated here (or checked to be aligned) go that way;
    anything else is copied.
  * numpy's DLPack cannot carry bfloat16: such buffers travel as uint16 and are
    bit-cast back (``tf.bitcast`` shares the buffer).
"""
import numpy as np
import tensorflow as tf

from horovodlike.common import engine

from ._errors import InvalidArgumentTypeError

ALIGN = 64

# TF dtype -> the engine's dtype name (also numpy's name for it).
ENGINE_DTYPES = {
    tf.uint8: "uint8", tf.int8: "int8", tf.int16: "int16", tf.int32: "int32",
    tf.int64: "int64", tf.float16: "float16", tf.bfloat16: "bfloat16",
    tf.float32: "float32", tf.float64: "float64", tf.bool: "bool",
}
assert set(ENGINE_DTYPES.values()) == set(engine.DTYPES)

# Dtypes the engine has no arithmetic for, but which collectives that only move data
# (broadcast, allgather, alltoall) carry as raw bytes.
BYTE_DTYPES = (tf.uint16, tf.uint32, tf.uint64, tf.complex64, tf.complex128)


class UnsupportedTensorError(InvalidArgumentTypeError):
    """A value horovodlike cannot hand to the engine (its type or dtype); a TypeError
    and a tf.errors.InvalidArgumentError."""


def supported_names(movement=False):
    names = [d.name for d in ENGINE_DTYPES]
    if movement:
        names += [d.name for d in BYTE_DTYPES]
    return ", ".join(names)


def as_tensor(value, what):
    """A tf.Tensor for a tensor-like argument (tf.Tensor, tf.Variable, Keras variable,
    numpy array). Python lists and scalars are refused: say tf.constant(...)."""
    # Composite tensors pass tf.is_tensor but have no single dense buffer: refused by
    # name, as torch's sparse layouts are (torch/_tensors.py).
    if isinstance(value, tf.RaggedTensor):
        raise UnsupportedTensorError(
            f"{what}: tf.RaggedTensor is not supported; use a dense tensor "
            f"(value.to_tensor(), padded) or reduce value.flat_values and keep the row "
            f"splits")
    if isinstance(value, tf.SparseTensor):
        raise UnsupportedTensorError(
            f"{what}: tf.SparseTensor is not supported; use a dense tensor "
            f"(tf.sparse.to_dense(value)), or allgather its indices and values")
    if isinstance(value, (tf.Tensor, tf.Variable, np.ndarray, np.generic)) or \
            (tf.is_tensor(value) and not isinstance(value, tf.IndexedSlices)):
        return tf.convert_to_tensor(value)
    if isinstance(value, tf.IndexedSlices):
        raise UnsupportedTensorError(f"{what} does not take tf.IndexedSlices; use hvd.allreduce "
                                     f"(which allgathers them) or tf.convert_to_tensor first")
    raise UnsupportedTensorError(
        f"{what} expects a tf.Tensor or tf.Variable, got {type(value).__name__}"
        + (f" {value!r}"[:80] if isinstance(value, (list, tuple, int, float, bool)) else "")
        + "; wrap it with tf.constant(...) first")


def check_dtype(tensor, what, movement=False):
    """Raise UnsupportedTensorError unless the engine can carry this dtype (movement:
    the op only moves bytes, so any fixed-width numeric dtype will do)."""
    dt = tensor.dtype.base_dtype
    if dt in ENGINE_DTYPES or (movement and dt in BYTE_DTYPES):
        return dt
    raise UnsupportedTensorError(
        f"{what}: tensor type {dt.name} is not supported; supported dtypes are "
        f"{supported_names(movement)}")


def np_dtype(tf_dtype):
    return np.dtype(tf_dtype.as_numpy_dtype)


def aligned_empty(shape, dtype):
    """An uninitialised C-contiguous array whose data is 64-byte aligned."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + ALIGN, np.uint8)
    off = (-raw.ctypes.data) % ALIGN
    return raw[off:off + nbytes].view(dtype).reshape(shape)


def is_aligned(arr):
    return arr.ctypes.data % ALIGN == 0


def to_tf(arr):
    """Wrap a numpy result as an eager tensor: zero-copy (DLPack) when the buffer is
    64-byte aligned, C-contiguous, writeable (numpy's DLPack refuses read-only arrays)
    and non-empty; a copy otherwise."""
    if arr.size == 0 or not arr.flags.c_contiguous or not arr.flags.writeable or \
            not is_aligned(arr):
        return tf.constant(arr)
    if arr.dtype.name == "bfloat16":
        return tf.bitcast(_from_dlpack(arr.view(np.uint16)), tf.bfloat16)
    return _from_dlpack(arr)


def _from_dlpack(arr):
    return tf.experimental.dlpack.from_dlpack(arr.__dlpack__())


def static_shape(shape):
    """A tuple with None for unknown dimensions (or None for an unknown rank)."""
    shape = tf.TensorShape(shape)
    return None if shape.rank is None else tuple(shape.as_list())
