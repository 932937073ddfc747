"""What the rank programs of tests/test_torch_optimizer.py share: init() starts the job and
sets R, P; the helpers and constants below."""
from _torch_common import *  # noqa: F401,F403 (torch, thvd, hvd, np, the check helpers)
import copy
import torch.nn as nn
import torch.nn.functional as F

R = P = None          # set by init()


def init():
    global R, P
    hvd.init()
    R, P = thvd.rank(), thvd.size()
    return R, P


def make_model(seed, bias=True):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 6, bias=bias), nn.Tanh(), nn.Linear(6, 3, bias=bias))


def batch(step, r, n=8):
    g = torch.Generator()
    g.manual_seed(1000 * step + r)
    return torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)


def loss_of(model, step, r):
    x, y = batch(step, r)
    return F.cross_entropy(model(x), y)
