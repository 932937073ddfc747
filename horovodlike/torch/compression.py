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


class Compression:
    """The compressors to pass as `compression=`: Compression.none, Compression.fp16."""
    none = NoneCompressor
    fp16 = FP16Compressor


__all__ = ["Compression", "Compressor", "FP16Compressor", "NoneCompressor"]
