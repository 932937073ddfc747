"""Torch tensors <-> engine buffers: the dtype map, argument checks, and wrapping the
engine's output without a copy.

The engine takes raw addresses of contiguous CPU buffers (CUDA tensors go through
_staging.py instead). Everything a binding needs to
turn a torch tensor into such a buffer (and back) lives here, so that the collectives
module only deals with requests and handles.
"""
import torch

import os

from horovodlike.common import engine

# torch dtype -> engine dtype code. Every dtype the engine can move; bool is 0/1 bytes.
TORCH_DTYPES = {
    torch.uint8: engine.DTYPES["uint8"],
    torch.int8: engine.DTYPES["int8"],
    torch.int16: engine.DTYPES["int16"],
    torch.int32: engine.DTYPES["int32"],
    torch.int64: engine.DTYPES["int64"],
    torch.float16: engine.DTYPES["float16"],
    torch.bfloat16: engine.DTYPES["bfloat16"],
    torch.float32: engine.DTYPES["float32"],
    torch.float64: engine.DTYPES["float64"],
    torch.bool: engine.DTYPES["bool"],
}


class UnsupportedTensorError(TypeError, ValueError):
    """A tensor horovodlike cannot move (dtype, device or layout). It is a TypeError, and
    a ValueError because Horovod raises ValueError('Tensor type ... is not supported')."""


def _supported_names():
    return ", ".join(str(d).replace("torch.", "") for d in TORCH_DTYPES)


def env_flag(name):
    """A boolean environment variable: 1, true, yes or on."""
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def cuda_enabled():
    """CUDA tensors are accepted (and staged, see _staging.py) only with
    HOROVODLIKE_EXPERIMENTAL_CUDA=1, until the GPU tests have passed on a GPU."""
    return env_flag("HOROVODLIKE_EXPERIMENTAL_CUDA")


def check_tensor(tensor, what, staged=False):
    """Raise a clear error unless `tensor` is a strided torch tensor of a supported dtype
    on the CPU, or (staged=True: the op can stage it, see _staging.py) on a CUDA device
    with HOROVODLIKE_EXPERIMENTAL_CUDA=1. Returns the engine dtype code."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what} expects a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        cuda = tensor.device.type == "cuda"
        if cuda and not torch.cuda.is_available():
            why = "CUDA is not available in this process"
        elif cuda and staged and cuda_enabled():
            why = None
        elif cuda and staged:
            why = ("CUDA tensors are experimental in horovodlike until its GPU tests have "
                   "passed on a GPU (HOROVODLIKE_EXPERIMENTAL_CUDA=1 stages them through "
                   "host memory)")
        else:
            why = "horovodlike moves CPU tensors only here"
        if why is not None:
            raise UnsupportedTensorError(
                f"{what}: the tensor is on device '{tensor.device}', but {why}; "
                f"move it to the CPU first with tensor.cpu()")
    if tensor.layout != torch.strided:
        raise UnsupportedTensorError(
            f"{what}: {tensor.layout} tensors are not supported; use a dense tensor "
            f"(sparse gradients go through DistributedOptimizer or sparse_allreduce_async)")
    code = TORCH_DTYPES.get(tensor.dtype)
    if code is None:
        raise UnsupportedTensorError(
            f"{what}: tensor type {tensor.dtype} is not supported; supported dtypes are "
            f"{_supported_names()}")
    return code


def contiguous(tensor):
    """A contiguous tensor with the same values (the tensor itself when it already is one;
    a conjugate or negative view is materialised). Never part of the autograd graph."""
    t = tensor.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return t if t.is_contiguous() else t.contiguous()


def write_back(original, buffer):
    """After an in-place op ran on a contiguous copy, put the values into the original."""
    if buffer.data_ptr() != original.data_ptr() or buffer.stride() != original.stride():
        with torch.no_grad():
            original.copy_(buffer)
    return original


def address(tensor):
    """The buffer address to hand the engine. torch reports 0 for an empty tensor; its
    storage's address is used then, so that an empty output made by empty_rows() is
    still a real buffer."""
    return tensor.data_ptr() if tensor.numel() else tensor.untyped_storage().data_ptr()


def from_engine(result, dtype, tail_shape):
    """Wrap an engine-allocated output (allgather, alltoall) as a tensor, without a copy.

    The tensor keeps the engine's buffer alive (torch.frombuffer holds a reference to the
    buffer object, which holds the cffi pointer that frees it)."""
    shape = (int(result.first_dim),) + tuple(tail_shape)
    if not result.nbytes:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(result.buffer(), dtype=dtype).view(shape)


def empty_rows(tensor, rows):
    """A new contiguous tensor like `tensor` with `rows` in the first dimension.

    With zero rows it still has a real (non-NULL) address: the engine refuses a NULL
    output buffer whenever the input has data, even if this rank's share is empty."""
    tail = tuple(tensor.shape[1:])
    if rows == 0:
        return torch.empty((1,) + tail, dtype=tensor.dtype, device=tensor.device)[:0]
    return torch.empty((rows,) + tail, dtype=tensor.dtype, device=tensor.device)
