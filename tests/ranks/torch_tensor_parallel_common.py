"""What the rank programs of tests/test_torch_tensor_parallel.py share: init() starts the job and
sets R, N; the helpers and constants below."""
from _torch_common import *  # noqa: F401,F403 (torch, thvd, hvd, np, the check helpers)
import copy
import torch.nn as nn
import torch.nn.functional as F

R = N = None          # set by init()


def init():
    global R, N
    thvd.init()
    R, N = thvd.rank(), thvd.size()
    torch.set_default_dtype(torch.float64)
    return R, N


P = thvd.parallel

TOL = 1e-10


def close(got, exp, what):
    t_close(got, exp, what, rtol=0, atol=TOL)


def ref_and_tp(make, plan, ps, seed=0):
    torch.manual_seed(seed)
    ref = make()
    tp = P.tensor_parallel(copy.deepcopy(ref), plan, process_set=ps)
    return ref, tp


def compare_grads(ref, tp, what):
    full = P.consolidated_grads(tp)
    for n, p in ref.named_parameters():
        if p.grad is None:
            check(full.get(n) is None, f"{what} grad {n}", "has a gradient, reference none")
        elif full.get(n) is None:
            fail(f"{what} grad {n}", "missing")
        else:
            close(full[n], p.grad, f"{what} grad {n}")


def compare_params(ref, tp, what, exact=False):
    full = P.consolidated_state_dict(tp)
    ref_sd = ref.state_dict()
    check(set(full) == set(ref_sd), f"{what} keys", f"{sorted(full)} vs {sorted(ref_sd)}")
    for k, v in ref_sd.items():
        if k in full:
            if exact:
                check(full[k].dtype == v.dtype and torch.equal(full[k], v), f"{what} {k}",
                      "not bit-identical")
            else:
                close(full[k], v, f"{what} {k}")
