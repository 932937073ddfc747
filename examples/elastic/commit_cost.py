"""What a commit costs: time of state.commit() (a copy of the model's and the
optimizer's state, and one small broadcast) and of state.check_host_updates() alone,
for MLPs of a few sizes, against the time of one training step.

    horovodlikerun -np 2 python examples/elastic/commit_cost.py
"""
import argparse
import time

import torch

import horovodlike.torch as hvd


def timed(fn, repeat):
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2] * 1e3       # median, ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", default="100000,1000000,10000000",
                    help="model sizes (parameters), comma separated")
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    for n in (int(v) for v in args.params.split(",")):
        width = int((n / 2) ** 0.5)
        model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                                    torch.nn.Linear(width, width))
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01,
                                                       momentum=0.9),
                                       named_parameters=model.named_parameters())
        x = torch.randn(32, width)

        def step():
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()

        step()
        state = hvd.elastic.TorchState(model, opt, epoch=0, batch=0)
        params = sum(p.numel() for p in model.parameters())
        t_step = timed(step, args.repeat)
        t_commit = timed(state.commit, args.repeat)
        t_check = timed(state.check_host_updates, args.repeat)
        if hvd.rank() == 0:
            print(f"{params:>10} params ({params * 4 / 2**20:6.1f} MiB): step {t_step:8.2f} ms, "
                  f"commit {t_commit:8.2f} ms, check_host_updates {t_check:6.3f} ms "
                  f"({hvd.size()} ranks)", flush=True)


if __name__ == "__main__":
    main()
