"""Rank program of tests/test_autotune.py, run by test_search_runs_to_its_end_in_step:
a DistributedOptimizer job under horovodlikerun --autotune. Every rank ends the search
at the same step with the same kept setting, and the ranks' parameters stay equal."""
import os

import torch
import torch.nn as nn

import horovodlike.torch as hvd


def main():
    hvd.init()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 10))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    assert opt._tuner is not None, "HOROVOD_AUTOTUNE is set: the optimizer drives a tuner"
    torch.manual_seed(1 + hvd.rank())      # each rank its own data
    x = torch.randn(16, 64)
    ended = None
    for step in range(int(os.environ["T_STEPS"])):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        if ended is None and opt._tuner.done:
            ended = step
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    views = hvd.allgather_object((ended, opt._tuner.kept, flat.tolist()))
    assert ended is not None, "the search never ended"
    assert all(v[:2] == views[0][:2] for v in views), [v[:2] for v in views]
    assert all(v[2] == views[0][2] for v in views), "the ranks' parameters differ"
    print(f"ENDED {ended} KEPT {opt._tuner.kept}", flush=True)
    print("OK", flush=True)


if __name__ == "__main__":
    main()
