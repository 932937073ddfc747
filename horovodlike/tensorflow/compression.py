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


class BF16Compressor(FP16Compressor):
    """Sends float32 and float64 tensors as bfloat16 and casts the result back; 16-bit
    tensors travel as they are."""
    HALF = tf.bfloat16

    @staticmethod
    def is_float(dtype):
        return dtype.is_floating and dtype.size > 2


class PowerSGD:
    """PowerSGD is implemented for horovodlike.torch only: constructing one here raises.
    (horovodlike.torch.PowerSGD passed as a TensorFlow compressor raises too.)"""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(
            "PowerSGD is implemented for horovodlike.torch's DistributedOptimizer only; "
            "horovodlike.tensorflow and horovodlike.keras do not support it yet. Use "
            "hvd.Compression.fp16 or hvd.Compression.bf16 to send fewer bytes.")


class Compression:
    """Optional gradient compression used during allreduce: none, fp16, bf16. PowerSGD is
    torch-only for now (see PowerSGD above)."""
    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


__all__ = ["BF16Compressor", "Compression", "Compressor", "FP16Compressor",
           "NoneCompressor"]
