"""What the rank programs of tests/test_torch_pipeline.py share: init() starts the job and
sets R, N; the helpers and constants below."""
from _torch_common import *  # noqa: F401,F403 (torch, thvd, hvd, np, the check helpers)
import copy
import torch.nn as nn
import torch.nn.functional as F
from horovodlike.common.topology import Topology
from horovodlike.torch.pipeline import (LayerSpec, PipelineModule, Schedule1F1B,
                                        ScheduleGPipe)

R = N = None          # set by init()


def init():
    global R, N
    thvd.init()
    R, N = thvd.rank(), thvd.size()
    torch.set_default_dtype(torch.float64)
    return R, N


TOL = 1e-10

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def close(got, exp, what):
    t_close(got, exp, what, rtol=0, atol=TOL)


def mlp_layers():
    return [nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8),
            nn.Tanh(), nn.Linear(8, 3)]


class Trim(nn.Module):
    """Drops the trailing sequence positions that are padding in every row (feature 0
    is exactly 0), so each micro-batch leaves stage 0 with its own length."""

    def forward(self, x):
        keep = (x[..., 0] != 0).any(0).nonzero()
        return x[:, :int(keep.max()) + 1] if keep.numel() else x[:, :1]


def tf_layers():
    return [Trim(), nn.Linear(6, 8),
            nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
            nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
            nn.LayerNorm(8), nn.Linear(8, 3)]


def seq_loss(out, y):
    return F.mse_loss(out, y[:, :out.shape[1]])


def data(kind, step, rows, seed=0):
    g = torch.Generator().manual_seed(1000 * seed + step)
    if kind == "mlp":
        return torch.randn(rows, 6, generator=g), torch.randn(rows, 3, generator=g)
    x = torch.randn(rows, 7, 6, generator=g)
    for i in range(rows):              # row i has 2 + i % 6 positions, the rest padding
        x[i, 2 + i % 6:] = 0
    return x, torch.randn(rows, 7, 3, generator=g)


def reference(layers, loss_fn, batches, m, lr=0.1, tie=None):
    """Whole model in one process; returns the losses per step and the model."""
    model = nn.Sequential(*layers)
    if tie:
        i, j = tie
        model[j].weight = model[i].weight
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        opt.zero_grad()
        step = []
        for xm, ym in zip(torch.tensor_split(x, m), torch.tensor_split(y, m)):
            loss = loss_fn(model(xm), ym)
            (loss / m).backward()
            step.append(loss.detach())
        opt.step()
        losses.append(torch.stack(step))
    return losses, model


def sgd(module, lr=0.1):
    """SGD over the stage's parameters (a stage may have none: a placeholder then)."""
    return torch.optim.SGD(list(module.parameters()) or [torch.zeros(1, requires_grad=True)],
                           lr=lr)


def compare_stage(pipe, ref_model, what):
    for li, layer in zip(pipe.layer_ids, pipe.layers):
        ref_sd = dict(ref_model[li].named_parameters())
        for n, p in list(layer.named_parameters()):
            close(p, ref_sd[n], f"{what} layer {li} {n}")
