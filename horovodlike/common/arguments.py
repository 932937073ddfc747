"""The distributed optimizers' argument rules, one place for every binding.

torch's DistributedOptimizer and ShardedDistributedOptimizer, TensorFlow's
DistributedGradientTape and DistributedOptimizer, and the Keras DistributedOptimizer
all take some of the same arguments: op, gradient_predivide_factor,
backward_passes_per_step, groups/num_groups, sparse_as_dense and compression. Each
binding calls `gradient_args` (and `backward_passes` for set_backward_passes_per_step),
so the same bad argument raises the same error, with the same text, in every binding.

The contract is Horovod's where it defines one: a bad value is a ValueError (groups=0
included, as in Horovod), and gradient_predivide_factor with an op other than Average is
Horovod's own "gradient_predivide_factor not supported with op != Average". Where
Horovod defines none (gradient_predivide_factor=0 divides by zero there; sparse_as_dense
and compression are not checked) it is a ValueError too. Every message names the
argument and the value. What horovodlike does not implement is a NotImplementedError:
op=hvd.Adasum (with the collectives' text, request.reduce_op), and a whole-step
compressor such as torch's PowerSGD given to a binding that reduces gradient by
gradient.

Framework-free: a binding says what a trainable parameter is (`is_parameter`).
"""
import dataclasses
import math
import numbers
import warnings
from typing import Union

from . import request
from .request import OP_NAMES, Average, Sum


@dataclasses.dataclass(frozen=True)
class GradientArgs:
    """A binding's checked arguments."""
    op: int
    gradient_predivide_factor: float
    prescale: float               # the engine's scale factors for each gradient
    postscale: float
    backward_passes_per_step: int
    groups: Union[None, int, list]
    sparse_as_dense: bool
    compression: object


def gradient_op(op, sum_or_average=False):
    """op= of an optimizer: an engine reduce op. sum_or_average: the binding reduces
    with Average or Sum only (Keras and the sharded optimizer, as Horovod's Keras)."""
    op = request.reduce_op(op, None, what=None)
    if sum_or_average and op not in (Average, Sum):
        raise ValueError(f"op currently only supports Average and Sum, got "
                         f"op=hvd.{OP_NAMES[op]}")
    return op


def predivide_scales(factor, op):
    """(prescale, postscale) for gradient_predivide_factor: with Average the sum is
    divided by `factor` before and by size/factor after (the engine applies 1/size on
    top of postscale for Average); any other op needs factor 1."""
    if isinstance(factor, bool) or not isinstance(factor, numbers.Real) or \
            not math.isfinite(factor) or factor <= 0:
        raise ValueError(f"gradient_predivide_factor must be a positive finite number, "
                         f"got {factor!r}")
    if factor != 1.0 and op != Average:
        raise ValueError(f"gradient_predivide_factor not supported with op != Average "
                         f"(gradient_predivide_factor={factor!r}, op=hvd.{OP_NAMES[op]})")
    if op == Average:
        return 1.0 / float(factor), float(factor)
    return 1.0, 1.0


def backward_passes(passes):
    """backward_passes_per_step (also set_backward_passes_per_step's argument)."""
    if isinstance(passes, bool) or not isinstance(passes, numbers.Integral) or passes < 1:
        raise ValueError(f"backward_passes_per_step must be a positive int, got {passes!r}")
    return int(passes)


def gradient_groups(groups, num_groups, is_parameter, stacklevel=3):
    """groups= (None, a positive int, or a list of lists of parameters), with Horovod's
    deprecated num_groups= (0: not given) standing in when groups is None."""
    which = "groups"
    if num_groups is not None and not (isinstance(num_groups, int) and num_groups == 0
                                       and not isinstance(num_groups, bool)):
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be "
                      "removed in v0.23.0.", DeprecationWarning, stacklevel=stacklevel + 1)
        if groups is None:
            groups, which = num_groups, "num_groups"
    if groups is None:
        return None
    if isinstance(groups, int) and not isinstance(groups, bool):
        if groups < 1:
            raise ValueError(f"{which} must be a positive int or a list of lists of "
                             f"trainable parameters, got {groups!r}")
        return groups
    if not isinstance(groups, (list, tuple)):
        raise ValueError(f"{which} must be a positive int or a list of lists of trainable "
                         f"parameters, got {_short(groups)}")
    seen, out = set(), []
    for g, group in enumerate(groups):
        if not isinstance(group, (list, tuple)):
            raise ValueError(f"groups must be a list of lists of trainable parameters; "
                             f"group {g} is {_short(group)}")
        for i, p in enumerate(group):
            if not is_parameter(p):
                raise ValueError(f"groups must consist of trainable parameters; item {i} "
                                 f"of group {g} is {_short(p)}")
            if id(p) in seen:
                raise ValueError(f"a parameter can only appear once in groups; item {i} of "
                                 f"group {g} appeared before")
            seen.add(id(p))
        out.append(list(group))
    return out


def dense_flag(value):
    """sparse_as_dense: True or False (numpy's bool_ too)."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    raise ValueError(f"sparse_as_dense must be True or False, got {_short(value)}")


def compressor(value, whole_step=False):
    """compression=: a compressor class or object with compress() and decompress().
    whole_step: the binding also takes a whole-step compressor (one that declares
    per_tensor = False, such as torch's PowerSGD); the others refuse it as not
    implemented."""
    if not (callable(getattr(value, "compress", None))
            and callable(getattr(value, "decompress", None))):
        raise ValueError(f"compression must be a compressor such as hvd.Compression.none, "
                         f"hvd.Compression.fp16 or hvd.Compression.bf16, got {_short(value)}")
    if isinstance(value, type) and not getattr(value, "per_tensor", True):
        raise ValueError(f"compression={value.__name__} needs an instance: "
                         f"compression=hvd.{value.__name__}(...)")
    if not whole_step and not getattr(value, "per_tensor", True):
        raise NotImplementedError(
            f"compression={type(value).__name__}(...) is implemented for "
            f"horovodlike.torch's DistributedOptimizer only; use hvd.Compression.fp16 or "
            f"hvd.Compression.bf16 here")
    return value


def gradient_args(op, compression, gradient_predivide_factor=1.0, backward_passes_per_step=1,
                  groups=None, num_groups=0, sparse_as_dense=False, is_parameter=None,
                  sum_or_average=False, whole_step=False, stacklevel=3):
    """Every argument rule, in one order, for one optimizer's arguments.
    stacklevel: frames from here to the user's call (for num_groups' warning)."""
    op = gradient_op(op, sum_or_average)
    comp = compressor(compression, whole_step)
    pre, post = predivide_scales(gradient_predivide_factor, op)
    passes = backward_passes(backward_passes_per_step)
    grouping = gradient_groups(groups, num_groups, is_parameter, stacklevel)
    dense = dense_flag(sparse_as_dense)
    return GradientArgs(op, float(gradient_predivide_factor), pre, post, passes, grouping,
                        dense, comp)


def _short(value, limit=60):
    """A value for a message: its repr, cut short, with its type when that is not
    obvious from the repr."""
    text = repr(value)
    if len(text) > limit:
        text = text[:limit] + "..."
    kind = type(value).__name__
    return text if kind in ("str", "int", "float", "NoneType", "bool") else \
        f"{text} ({kind})"


__all__ = ["GradientArgs", "backward_passes", "compressor", "dense_flag", "gradient_args",
           "gradient_groups", "gradient_op", "predivide_scales"]
