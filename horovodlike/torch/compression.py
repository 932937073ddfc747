"""Gradient compression for torch tensors (Horovod's hvd.Compression)."""
import torch

from horovodlike.common.compression import Compressor, HalfCompressorBase, NoneCompressor


class FP16Compressor(HalfCompressorBase):
    """Floating-point tensors travel as float16 and are cast back afterwards."""
    HALF = torch.float16

    @staticmethod
    def is_float(dtype):
        return dtype.is_floating_point

    @staticmethod
    def cast(tensor, dtype):
        return tensor.to(dtype)


class BF16Compressor(FP16Compressor):
    """float32 and float64 tensors travel as bfloat16 (float32's range, 8 significant
    bits) and are cast back afterwards; 16-bit tensors travel as they are."""
    HALF = torch.bfloat16

    @staticmethod
    def is_float(dtype):
        return dtype.is_floating_point and dtype.itemsize > 2


class Compression:
    """The compressors to pass as `compression=`: Compression.none, Compression.fp16,
    Compression.bf16. (hvd.PowerSGD(...) is passed the same way; see powersgd.py.)"""
    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


__all__ = ["BF16Compressor", "Compression", "Compressor", "FP16Compressor",
           "NoneCompressor"]
