"""What every torch rank program shares, beyond _common: `thvd` is horovodlike.torch
(`hvd` stays the numpy API that finish() uses), torch runs one thread per rank, and the
t_* checks compare tensors the way check_* compare arrays, collecting failures so one
launch reports every failing case.

    from _torch_common import *  # noqa: F401,F403
"""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)
import torch
import horovodlike.torch as thvd
torch.set_num_threads(1)

ALL_TORCH_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool]
FLOAT_TORCH_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
TORCH_EPS = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7,
             torch.float32: 2.0 ** -23, torch.float64: 2.0 ** -52}


def _tshow(t, n=8):
    flat = t.detach().reshape(-1)[:n]
    return str(flat.double().tolist() if flat.is_floating_point() else flat.tolist())


def _tmeta(got, exp, what):
    if not isinstance(got, torch.Tensor):
        fail(what, f"expected a torch.Tensor, got {type(got).__name__}")
        return False
    if got.dtype != exp.dtype or tuple(got.shape) != tuple(exp.shape):
        fail(what, f"got dtype={got.dtype} shape={tuple(got.shape)}, expected "
                   f"dtype={exp.dtype} shape={tuple(exp.shape)}")
        return False
    return True


def _tdiff(got, exp, bad):
    idx = torch.nonzero(bad.reshape(-1)).reshape(-1)[:5].tolist()
    g, e = got.detach().reshape(-1), exp.detach().reshape(-1)
    return "; ".join(f"[{i}] got {g[i].item()!r} expected {e[i].item()!r}" for i in idx) + \
        f" ({int(bad.sum())} of {bad.numel()} differ)"


def t_equal(got, exp, what):
    """Same dtype, shape and values (floats compared in float64; NaN == NaN)."""
    if not _tmeta(got, exp, what):
        return False
    if exp.is_floating_point():
        g, e = got.detach().double(), exp.detach().double()
        bad = ~((g == e) | (torch.isnan(g) & torch.isnan(e)))
    else:
        bad = got.detach() != exp.detach()
    if bool(bad.any()):
        fail(what, _tdiff(got, exp, bad))
        return False
    return True


def t_close(got, exp, what, rtol=1e-5, atol=1e-6):
    if not _tmeta(got, exp, what):
        return False
    g, e = got.detach().double(), exp.detach().double()
    bad = ~((g - e).abs() <= atol + rtol * e.abs())
    if bool(bad.any()):
        fail(what, _tdiff(got, exp, bad) + f" rtol={rtol} atol={atol}")
        return False
    return True


def flat_params(model):
    return torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])


def accumulate_global_batch(model, loss_fn, parts, m):
    """The single-process reference of data parallelism with gradient accumulation:
    parts holds each replica's (x, y); every one of the len(parts) × m micro-batches
    adds loss / (m · len(parts)) to model's gradients. Returns the micro-batch losses,
    replica by replica."""
    losses = []
    for xd, yd in parts:
        for xm, ym in zip(torch.tensor_split(xd, m), torch.tensor_split(yd, m)):
            loss = loss_fn(model(xm), ym)
            (loss / (m * len(parts))).backward()
            losses.append(loss.detach())
    return losses


def same_on_every_rank(t, what, process_set=None):
    """The tensor is bit-identical on every rank (of the set)."""
    ps = process_set or thvd.global_process_set
    gathered = thvd.allgather(t.detach().reshape(1, -1).contiguous(), process_set=ps)
    for i in range(gathered.shape[0]):
        if not torch.equal(gathered[i], gathered[0]):
            d = (gathered[i].double() - gathered[0].double()).abs().max().item()
            fail(what, f"set member {i} differs from member 0 (max |diff| {d})")
            return False
    return True
