"""Gradient compression applied around allreduce (Horovod's Compression API)."""
import torch


class Compressor:
    """Interface: compress(tensor) -> (tensor, ctx); decompress(tensor, ctx) -> tensor."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression: the tensor itself is reduced."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Floating-point tensors travel as float16 and are cast back afterwards."""

    @staticmethod
    def compress(tensor):
        ctx = tensor.dtype
        if tensor.dtype.is_floating_point and tensor.dtype != torch.float16:
            tensor = tensor.to(torch.float16)
        return tensor, ctx

    @staticmethod
    def decompress(tensor, ctx):
        if ctx is not None and ctx.is_floating_point and tensor.dtype != ctx:
            tensor = tensor.to(ctx)
        return tensor


class Compression:
    """The compressors to pass as `compression=`: Compression.none, Compression.fp16."""
    none = NoneCompressor
    fp16 = FP16Compressor
