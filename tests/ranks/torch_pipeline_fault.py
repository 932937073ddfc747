"""Rank program of tests/test_torch_pipeline.py, run by
test_pipeline_fault_fails_every_rank_naming_the_lost_stage."""
from _torch_common import *  # noqa: F401,F403 (torch, thvd, hvd, np, the check helpers)
from horovodlike.common.topology import Topology
from horovodlike.torch.pipeline import PipelineModule, Schedule1F1B
import signal
import torch.nn as nn


def main():
    thvd.init()
    R = thvd.rank()
    VICTIM, SIG = int(os.environ["VICTIM"]), os.environ["SIG"]


    class Fault(torch.autograd.Function):
        """Identity; on the victim, its backward of micro-batch 5 in the second batch (the
        drain of the last stage) stops or kills the process."""

        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            if R == VICTIM and batch == 2 and sched.current_microbatch == 5:
                print(f"VICTIM {time.time():.3f}", flush=True)
                os.kill(os.getpid(), getattr(signal, SIG))
            return g


    class Stage(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return Fault.apply(self.lin(x))


    topo = Topology(pp=4)
    pipe = PipelineModule([Stage() for _ in range(4)], topology=topo,
                          loss_fn=lambda o, y: ((o - y) ** 2).mean())
    sched = Schedule1F1B(pipe, microbatches=8)
    x, y = torch.ones(16, 4), torch.zeros(16, 4)
    try:
        for batch in range(1, 4):
            sched.train_batch(x, y)
        print("NO-FAILURE", flush=True)
    except Exception as e:
        print(f"FAILED {time.time():.3f} {type(e).__name__}: {e}".replace("\n", " "), flush=True)


if __name__ == "__main__":
    main()
