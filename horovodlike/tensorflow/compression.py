"""Gradient compression for TensorFlow tensors (Horovod's hvd.Compression)."""
import tensorflow as tf

from horovodlike.common.compression import Compressor, HalfCompressorBase, NoneCompressor


class FP16Compressor(HalfCompressorBase):
    """Sends floating-point tensors as float16 and casts the result back."""
    HALF = tf.float16

    @staticmethod
    def is_float(dtype):
        return dtype.is_floating

    @staticmethod
    def cast(tensor, dtype):
        return tf.cast(tensor, dtype)


class Compression:
    """Optional gradient compression used during allreduce."""
    none = NoneCompressor
    fp16 = FP16Compressor


__all__ = ["Compression", "Compressor", "FP16Compressor", "NoneCompressor"]
