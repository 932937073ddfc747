"""What the rank programs of tests/test_torch_powersgd.py share: init() starts the job and
sets R, P; the helpers and constants below."""
from _torch_common import *  # noqa: F401,F403 (torch, thvd, hvd, np, the check helpers)
import copy
import io
import torch.nn as nn
import torch.nn.functional as F

R = P = None          # set by init()


def init():
    global R, P
    hvd.init()
    R, P = thvd.rank(), thvd.size()
    return R, P


def grad_of(shape, step, r, dtype=torch.float64):
    g = torch.Generator()
    g.manual_seed(100_000 * step + 100 * r + len(shape))
    return torch.randn(*shape, generator=g, dtype=dtype)


class Params(nn.Module):
    """Parameters whose gradient is whatever backward_with() says (loss = sum(p * g))."""
    def __init__(self, shapes, dtype=torch.float64):
        super().__init__()
        self.ps = nn.ParameterList([nn.Parameter(torch.zeros(s, dtype=dtype))
                                    for s in shapes])

    def backward_with(self, grads):
        sum((p * g).sum() for p, g in zip(self.ps, grads)).backward()

SHAPES = [(6, 4), (3, 5, 2), (7,), (8, 9)]


def average(step, shapes=SHAPES, ranks=None):
    ranks = range(P) if ranks is None else ranks
    return [sum(grad_of(s, step, r) for r in ranks) / len(ranks) for s in shapes]


def make_opt(model, psgd, **kw):
    return thvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters(),
                                     compression=psgd, **kw)


def mlp(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 10), nn.Tanh(),
                         nn.Linear(10, 3))


def mlp_batch(step, r):
    g = torch.Generator()
    g.manual_seed(1000 * step + r)
    return torch.randn(8, 12, generator=g), torch.randint(0, 3, (8,), generator=g)


def mlp_step(model, opt, step):
    opt.zero_grad()
    x, y = mlp_batch(step, R)
    F.cross_entropy(model(x), y).backward()
    opt.step()
