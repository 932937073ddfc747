"""Rank program of tests/test_prepared_requests.py: the cached fast path of a repeated
allreduce (request.allreduce_key) takes the calls it may, a blocking one in one engine
call (hvdl_run), and every call it must not take gets the slow path's answer: the same
result or the same error."""
import warnings

import torch

from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)
import horovodlike.torch as hvt
from horovodlike.common import request

hvd.init(process_sets="dynamic")
R, P = hvd.rank(), hvd.size()
TOTAL = sum(range(1, P + 1))          # rank r contributes r + 1


def np_x(n=1024, dtype=np.float32):
    return np.full(n, R + 1, dtype)


def t_x(n=1024, dtype=torch.float32):
    return torch.full((n,), R + 1, dtype=dtype)


def refused():
    """The slow path's argument checks (request.allreduce) raise inside this."""
    return Refused(request, "allreduce")


def fast_path_is_taken():
    x = np_x()
    check_equal(hvd.allreduce(x, name="np", op=hvd.Sum), np.full(1024, TOTAL, np.float32),
                "numpy, first call")
    with refused():
        for i in range(3):
            with Counted() as counted:
                out = hvd.allreduce(x, name="np", op=hvd.Sum)
            check_equal(out, np.full(1024, TOTAL, np.float32), f"numpy, cached call {i}")
            check(counted.calls == {"hvdl_run": 1}, f"numpy, cached call {i}: one engine "
                  "call", f"{counted.calls}")
    t = t_x()
    check_equal(hvt.allreduce(t, name="t", op=hvt.Sum).numpy(), np.full(1024, TOTAL, np.float32),
                "torch, first call")
    with refused():
        with Counted() as counted:
            out = hvt.allreduce(t, name="t", op=hvt.Sum)
        check_equal(out.numpy(), np.full(1024, TOTAL, np.float32), "torch, cached call")
        check(counted.calls == {"hvdl_run": 1}, "torch, cached call: one engine call",
              f"{counted.calls}")
        check_equal(hvt.synchronize(hvt.allreduce_async(t, name="t", op=hvt.Sum)).numpy(),
                    np.full(1024, TOTAL, np.float32), "torch allreduce_async, cached call")
        check_equal(t.numpy(), np.full(1024, R + 1, np.float32), "torch, input untouched")


def numpy_slow_path_answers():
    x = np_x()
    hvd.allreduce(x, name="n", op=hvd.Sum)
    view = np.full(2048, R + 1, np.float32)[::2]           # same shape and dtype
    check_raises(ValueError, lambda: hvd.allreduce(view, name="n", op=hvd.Sum),
                 "not C-contiguous", what="numpy non-contiguous view of a cached shape")
    swapped = x.astype(x.dtype.newbyteorder("S"))
    check_raises(TypeError, lambda: hvd.allreduce(swapped, name="n", op=hvd.Sum),
                 "byte order", what="numpy other byte order")
    check_raises(TypeError, lambda: hvd.allreduce(x.astype(np.complex64), name="n", op=hvd.Sum),
                 "dtype complex64 is not supported", what="numpy changed to a refused dtype")
    out = hvd.allreduce(x.astype(np.int32), name="n", op=hvd.Sum)
    check_equal(out, np.full(1024, TOTAL, np.int32), "numpy changed dtype")
    check_equal(hvd.allreduce(np_x(10), name="n", op=hvd.Sum), np.full(10, TOTAL, np.float32),
                "numpy changed shape")
    check_raises(TypeError, lambda: hvd.allreduce(x, name="n", op=hvd.Sum, prescale_factor=True),
                 "prescale_factor must be a number, got True", what="numpy bool scale")
    check_raises(ValueError, lambda: hvd.allreduce(x, name="n", op=True),
                 "op=True is an unknown reduction op", what="numpy op=True after op=1")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(2):
            hvd.allreduce(x, name="n", average=False)
    check(sum(issubclass(w.category, DeprecationWarning) for w in seen) == 2,
          "average= warns on every call", str([str(w.message) for w in seen]))
    hvd.allreduce(x, name="n", op=hvd.Sum)
    check_equal(hvd.allreduce(x, name="n", op=hvd.Sum, prescale_factor=2),
                np.full(1024, 2 * TOTAL, np.float32), "numpy changed scale")


def torch_slow_path_answers():
    t = t_x()
    hvt.allreduce(t, name="u", op=hvt.Sum)
    hvt.allreduce_(t_x(), name="u", op=hvt.Sum)
    view = torch.full((2048,), R + 1.0)[::2]
    check_equal(hvt.allreduce(view, name="u", op=hvt.Sum).numpy(),
                np.full(1024, TOTAL, np.float32), "torch non-contiguous view")
    inplace = torch.full((2048,), R + 1.0)
    hvt.allreduce_(inplace[::2], name="u", op=hvt.Sum)
    check_equal(inplace.numpy()[::2], np.full(1024, TOTAL, np.float32),
                "torch in-place non-contiguous view: written back")
    check_equal(inplace.numpy()[1::2], np.full(1024, R + 1, np.float32),
                "torch in-place non-contiguous view: the rest untouched")
    r = t_x()
    hvt.allreduce(r, name="u", op=hvt.Sum)
    r.resize_(512)
    check_equal(hvt.allreduce(r, name="u", op=hvt.Sum).numpy(), np.full(512, TOTAL, np.float32),
                "torch tensor resized in place")
    check_raises(TypeError, lambda: hvt.allreduce(t.to(torch.complex64), name="u", op=hvt.Sum),
                 "tensor type torch.complex64 is not supported",
                 what="torch changed to a refused dtype")
    check_equal(hvt.allreduce(t.double(), name="u", op=hvt.Sum).numpy(),
                np.full(1024, TOTAL, np.float64), "torch changed dtype")
    check_raises(TypeError, lambda: hvt.allreduce(t, name="u", op=hvt.Sum, postscale_factor=False),
                 "postscale_factor must be a number, got False", what="torch bool scale")
    g = t_x().requires_grad_()
    out = hvt.allreduce(g, name="g", op=hvt.Sum)
    out.sum().backward()
    check(out.grad_fn is not None, "torch: a tensor that requires grad gets a graph")
    check_equal(g.grad.numpy(), np.full(1024, P, np.float32), "torch: its gradient")
    with torch.no_grad():
        check(hvt.allreduce(g, name="g", op=hvt.Sum).grad_fn is None,
              "torch under no_grad: no graph")


def process_set_changes():
    ps = hvd.add_process_set(list(range(P)))
    x = np_x()
    check_equal(hvd.allreduce(x, name="s", op=hvd.Sum, process_set=ps),
                np.full(1024, TOTAL, np.float32), "set, first call")
    check_equal(hvd.allreduce(x, name="s", op=hvd.Sum, process_set=ps),
                np.full(1024, TOTAL, np.float32), "set, cached call")
    copy = hvd.ProcessSet(list(range(P)))      # equal ranks, never registered
    check_raises(ValueError, lambda: hvd.allreduce(x, name="s", op=hvd.Sum, process_set=copy),
                 "is not registered", what="an unregistered copy of a cached set")
    hvd.remove_process_set(ps)
    check_raises(ValueError, lambda: hvd.allreduce(x, name="s", op=hvd.Sum, process_set=ps),
                 "is not registered", what="a removed set")
    again = hvd.add_process_set(list(range(P)))
    check_equal(hvd.allreduce(x, name="s", op=hvd.Sum, process_set=again),
                np.full(1024, TOTAL, np.float32), "set added again")


def duplicate_in_flight_is_refused():
    """The engine's refusal of a name in flight reaches a cached call as it reaches an
    uncached one, and leaves nothing behind. The other rank submits only once rank 0
    has made its checks, so rank 0's first op cannot have finished."""
    x = np_x(6)
    exp = np.full(6, TOTAL, np.float32)
    check_equal(hvd.allreduce(x, op=hvd.Sum, name="dup"), exp, "dup, first call")
    if R != 0:
        wait_for("rank0-dup-checked")
    h = hvd.allreduce_async(x, op=hvd.Sum, name="dup")
    if R == 0:
        check_raises(ValueError, lambda: hvd.allreduce(x, op=hvd.Sum, name="dup"),
                     "allreduce.dup", "in flight", what="cached blocking call, name in flight")
        check_raises(ValueError, lambda: hvd.allreduce_async(x, op=hvd.Sum, name="dup"),
                     "allreduce.dup", "in flight", what="cached async call, name in flight")
        arrive("rank0-dup-checked")
    check_equal(hvd.synchronize(h), exp, "dup, the op in flight")
    check_equal(hvd.allreduce(x, op=hvd.Sum, name="dup"), exp, "dup after the refusals")


def cache_is_bounded():
    x = np_x(4)
    for i in range(request.PREPARED_MAX + 10):
        hvd.allreduce(x, name=f"many.{i}", op=hvd.Sum)
    check(len(request._prepared.entries) <= request.PREPARED_MAX, "the cache stays bounded",
          str(len(request._prepared.entries)))


fast_path_is_taken()
numpy_slow_path_answers()
torch_slow_path_answers()
process_set_changes()
duplicate_in_flight_is_refused()
cache_is_bounded()
finish()
