"""What the rank programs of tests/test_torch_sharded.py share: init() starts the job and
sets R, P; the helpers and constants below."""
from _torch_common import *  # noqa: F401,F403 (torch, thvd, hvd, np, the check helpers)
import copy
import torch.nn as nn
import torch.nn.functional as F

R = P = None          # set by init()


def init():
    global R, P
    thvd.init(process_sets="dynamic")
    R, P = thvd.rank(), thvd.size()
    return R, P


TMP = os.environ.get("HVDTEST_TMP", "")

CAP = 200 / 2 ** 20          # 200-byte buckets: several per dtype


class Net(nn.Module):
    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.fc1 = nn.Linear(5, 7)
        self.fc2 = nn.Linear(7, 3)
        self.scale = nn.Parameter(1 + 0.1 * torch.randn(3, dtype=torch.float64))
        self.frozen = nn.Parameter(torch.ones(2), requires_grad=False)
        self.unused = nn.Parameter(torch.ones(4))

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x))) * self.scale.float() + self.frozen.sum()


def groups(model, lr):
    return [{"params": [model.fc1.weight, model.fc1.bias, model.scale, model.frozen]},
            {"params": [model.fc2.weight, model.fc2.bias, model.unused], "lr": lr / 2,
             "weight_decay": 0.01}]

OPTIMIZERS = {
    "SGD momentum": lambda g: torch.optim.SGD(g, lr=0.1, momentum=0.9, nesterov=True),
    "Adam": lambda g: torch.optim.Adam(g, lr=0.01),
    "AdamW amsgrad": lambda g: torch.optim.AdamW(g, lr=0.01, weight_decay=0.05,
                                                 amsgrad=True),
}


def batch(step, r, n=6):
    g = torch.Generator()
    g.manual_seed(1000 * step + r)
    return torch.randn(n, 5, generator=g), torch.randint(0, 3, (n,), generator=g)


def train_step(model, opt, step, passes=1, clip=None):
    opt.zero_grad()
    for k in range(passes):
        x, y = batch(10 * step + k, R)
        F.cross_entropy(model(x), y).backward()
    if clip is None:
        opt.step()
        return None
    opt.synchronize()
    if isinstance(opt, thvd.ShardedDistributedOptimizer):
        norm = opt.clip_grad_norm_(clip[0], clip[1])
    else:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip[0], clip[1])
    with opt.skip_synchronize():
        opt.step()
    return norm


def fresh(seed=None):
    model = Net(100 + R if seed is None else seed)
    thvd.broadcast_parameters(model.state_dict(), root_rank=0)
    return model


def params_of(model):
    return [p.detach().clone() for p in model.parameters()]


def compare(model, ref, what, rtol=1e-5, atol=1e-6):
    for (name, p), q in zip(model.named_parameters(), ref):
        t_close(p.detach(), q, f"{what}: {name}", rtol=rtol, atol=atol)


def identical_in(model, opt, what):
    flat = flat_params(model)
    same_on_every_rank(flat, f"{what}: bit-identical across the partition group",
                       process_set=opt.partition_set)
    same_on_every_rank(flat, f"{what}: bit-identical across all ranks")


def shard_sizes():
    sizes = [P] + [s for s in (2, 1) if s < P and P % s == 0]
    if os.environ.get("HVDTEST_LOCAL_SHARDS"):
        sizes = [thvd.local_size()]
    return sizes
