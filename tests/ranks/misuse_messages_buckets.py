"""Rank program of tests/test_misuse_messages.py, run by
test_bucketed_optimizer_names_the_parameters_that_differ."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)
import torch
import horovodlike.torch as hvdt


def main():
    hvdt.init()
    R = hvdt.rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4 + R)             # rank 1 built a different model
    opt = hvdt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                    named_parameters=model.named_parameters())
    model(torch.ones(2, 4)).sum().backward()
    e = check_raises(hvdt.TensorMismatchError, opt.step,
                     "the model's parameters differ across ranks",
                     "'weight': rank 0 has [4, 4], rank 1 has [5, 4]",
                     "'bias': rank 0 has [4], rank 1 has [5]", what="step() with different models")
    check("bucket" not in str(e).split("(")[0], "no bucket name in the message", str(e))
    # the engine goes on: a following collective works
    check_equal(hvdt.allreduce(torch.ones(2), op=hvdt.Sum, name="after").numpy(),
                np.full(2, 2.0, dtype=np.float32), "an allreduce after the mismatch")
    finish()


if __name__ == "__main__":
    main()
