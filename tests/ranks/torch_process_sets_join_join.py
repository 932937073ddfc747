"""Rank program of tests/test_torch_process_sets_join.py, run by
test_join_with_uneven_work."""
from _torch_common import *  # noqa: F401,F403 (torch, thvd, hvd, np, the check helpers)
import torch.nn as nn


def main():
    hvd.init()
    R, P = thvd.rank(), thvd.size()
    # Rank r has r + 1 batches: after its own, a rank joins and contributes zeros.
    for k in range(R + 1):
        got = thvd.allreduce(torch.ones(3), op=thvd.Sum, name=f"join.step{k}")
        t_equal(got, torch.full((3,), float(P - k)), f"allreduce at step {k} with {k} joined")
    last = thvd.join()
    check(last == P - 1, "join() returns the last rank to join", str(last))
    t_equal(thvd.allreduce(torch.ones(1), op=thvd.Sum, name="after.join"),
            torch.full((1,), float(P)), "allreduce after everyone joined")

    # The training pattern: uneven data, join, then take the last rank's weights.
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = thvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                    named_parameters=model.named_parameters())
    for step in range(2 + R):
        opt.zero_grad()
        model(torch.full((4, 3), float(R + step))).pow(2).sum().backward()
        opt.step()
    last = thvd.join()
    check(last == P - 1, "join() after training", str(last))
    thvd.broadcast_parameters(model.state_dict(), root_rank=last)
    same_on_every_rank(flat_params(model), "weights after join + broadcast from the last rank")
    finish()


if __name__ == "__main__":
    main()
