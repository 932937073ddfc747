"""Gradient compression around allreduce (Horovod's Compression API), framework-free:
the bindings supply only how to tell floating dtypes and how to cast."""


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


class HalfCompressorBase(Compressor):
    """Floating-point tensors travel as float16 and are cast back afterwards. A binding
    subclasses it with HALF, is_float(dtype) and cast(tensor, dtype)."""
    HALF = None

    @classmethod
    def compress(cls, tensor):
        if cls.is_float(tensor.dtype) and tensor.dtype != cls.HALF:
            return cls.cast(tensor, cls.HALF), tensor.dtype
        return tensor, None

    @classmethod
    def decompress(cls, tensor, ctx):
        return cls.cast(tensor, ctx) if ctx is not None else tensor
